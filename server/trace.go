package server

import (
	"context"
	"path/filepath"
	"time"

	"go.opentelemetry.io/otel"
	"google.golang.org/grpc"

	"github.com/berth-sandbox/berth/internal/telemetry"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
)

// tracer makes berthd's own spans, beside the per-RPC ones of the stats
// handler; it is OpenTelemetry's no-op tracer unless berthd exports traces.
var tracer = otel.Tracer("github.com/berth-sandbox/berth/server")

// relaySpans relays the spans of the agent at socketPath until ctx ends
// (the connection is forgotten). An agent that ends its Telemetry stream
// without spans (started without --trace, or by an older berthd) is asked
// again less and less often, at most every 30 s.
func (s *Service) relaySpans(ctx context.Context, socketPath string, agent agentv1.AgentServiceClient) {
	// <state-dir>/s/<sandbox id>/run/agent.sock
	sandboxID := filepath.Base(filepath.Dir(filepath.Dir(socketPath)))
	open := func(ctx context.Context) (telemetry.Stream, error) {
		st, err := agent.Telemetry(ctx, &agentv1.TelemetryRequest{}, grpc.WaitForReady(true))
		if err != nil {
			return nil, err
		}
		return spanStream{st}, nil
	}
	wait := time.Second
	for ctx.Err() == nil {
		n, _ := s.cfg.Tracer.Relay(ctx, sandboxID, open)
		if n > 0 {
			wait = time.Second
		} else {
			wait = min(2*wait, 30*time.Second)
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

// spanStream adapts the Telemetry stream to telemetry.Stream.
type spanStream struct {
	st agentv1.AgentService_TelemetryClient
}

func (s spanStream) Next() ([]byte, error) {
	msg, err := s.st.Recv()
	if err != nil {
		return nil, err
	}
	return msg.GetExportTraceServiceRequest(), nil
}
