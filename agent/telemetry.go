package agent

import (
	"context"

	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
)

// SpanSource hands out the agent's finished trace spans, one serialized
// OTLP ExportTraceServiceRequest at a time (internal/telemetry's Queue).
type SpanSource interface {
	// Next returns the next batch, waiting until there is one or ctx ends.
	Next(ctx context.Context) ([]byte, error)
}

// Telemetry streams the agent's spans to berthd until the caller goes away
// or the spans end; without a span source it ends at once.
func (s *Server) Telemetry(_ *agentv1.TelemetryRequest, stream agentv1.AgentService_TelemetryServer) error {
	if s.cfg.Spans == nil {
		return nil
	}
	msg := &agentv1.TelemetryResponse{}
	for {
		b, err := s.cfg.Spans.Next(stream.Context())
		if err != nil {
			return nil // the caller left, or the agent stops: nothing to report
		}
		msg.ExportTraceServiceRequest = b
		if err := stream.Send(msg); err != nil {
			return nil
		}
	}
}
