// Package telemetry is berth's OpenTelemetry tracing: the tracer providers
// of berthd (exporting over OTLP) and of berth-agent (keeping its spans in a
// bounded queue that berthd drains over the agent's Telemetry stream and
// relays), with W3C trace context (traceparent) propagated between them
// through the gRPC stats handlers of otelgrpc.
//
// A sandbox has no network, so its agent cannot reach a collector: its
// spans travel on the connection berthd already holds to it. Without an
// OTLP endpoint nothing of this is set up and tracing costs nothing (the
// global tracer provider stays OpenTelemetry's no-op one).
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
	collectortracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
	"google.golang.org/protobuf/proto"
)

// batchTimeout is how long finished spans wait to be exported together.
const batchTimeout = time.Second

// MaxBatchBytes bounds one serialized batch on the agent's Telemetry
// stream; a larger one is dropped by the agent and refused by berthd.
const MaxBatchBytes = 1 << 20

// Tracer is berthd's tracing: the provider exporting to OTLP, installed as
// OpenTelemetry's global provider and W3C trace-context propagator.
type Tracer struct {
	provider *sdktrace.TracerProvider
	client   otlptrace.Client
}

// Start exports berthd's spans over OTLP/gRPC to endpoint, a URL:
// "http://host:4317" (plaintext) or "https://host:4317" (TLS). An empty
// endpoint uses the standard OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or
// OTEL_EXPORTER_OTLP_ENDPOINT, and returns nil when neither is set:
// tracing is off. service names berthd's resource (service.name).
func Start(ctx context.Context, endpoint, service, version string) (*Tracer, error) {
	var opts []otlptracegrpc.Option
	if endpoint != "" {
		opts = append(opts, otlptracegrpc.WithEndpointURL(endpoint))
	} else if !envEndpointSet() {
		return nil, nil
	}
	client := otlptracegrpc.NewClient(opts...)
	exp, err := otlptrace.New(ctx, client)
	if err != nil {
		return nil, fmt.Errorf("OTLP exporter: %w", err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(batchTimeout)),
		sdktrace.WithResource(newResource(service, version)),
	)
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	return &Tracer{provider: tp, client: client}, nil
}

// ServerHandler is the stats handler that traces a gRPC server's calls,
// taking the caller's traceparent as the parent.
func ServerHandler() stats.Handler {
	return otelgrpc.NewServerHandler(otelgrpc.WithFilter(traced))
}

// ClientHandler is the stats handler that traces a gRPC client's calls and
// sends their traceparent.
func ClientHandler() stats.Handler {
	return otelgrpc.NewClientHandler(otelgrpc.WithFilter(traced))
}

// traced leaves out the Telemetry stream, which carries the spans: it
// lasts as long as the agent and is no one's request.
func traced(info *stats.RPCTagInfo) bool {
	return !strings.HasSuffix(info.FullMethodName, "/Telemetry")
}

// Shutdown exports what is left and stops; at most until ctx ends.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

// Relay reads the spans of one agent's Telemetry stream, opened by open,
// and exports them with berthd's, each resource marked with the sandbox id
// (berth.sandbox.id): the agent is inside the sandbox and its spans are the
// sandbox's word, not berthd's. It returns when the stream ends; the caller
// reopens it as long as the agent lives. It returns how many batches it
// relayed.
func (t *Tracer) Relay(ctx context.Context, sandboxID string, open func(context.Context) (Stream, error)) (int, error) {
	stream, err := open(ctx)
	if err != nil {
		return 0, err
	}
	for n := 0; ; n++ {
		b, err := stream.Next()
		if err != nil {
			return n, err
		}
		if len(b) > MaxBatchBytes {
			continue
		}
		var req collectortracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			continue
		}
		for _, rs := range req.GetResourceSpans() {
			if rs.Resource == nil {
				continue
			}
			rs.Resource.Attributes = append(rs.Resource.Attributes, &commonpb.KeyValue{
				Key: "berth.sandbox.id", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: sandboxID}},
			})
		}
		uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = t.client.UploadTraces(uctx, req.GetResourceSpans())
		cancel()
		if err != nil && ctx.Err() != nil {
			return n, ctx.Err()
		}
	}
}

// Stream is one agent's Telemetry stream: Next returns the next serialized
// ExportTraceServiceRequest.
type Stream interface {
	Next() ([]byte, error)
}

// AgentTracer is berth-agent's tracing: spans go to a Queue that berthd
// drains, not to the network.
type AgentTracer struct {
	provider *sdktrace.TracerProvider
	Queue    *Queue
}

// StartAgent installs the agent's provider (service.name berth-agent) as
// the global one, with W3C trace context, exporting into a new Queue of at
// most maxBytes.
func StartAgent(ctx context.Context, version string, maxBytes int) (*AgentTracer, error) {
	q := NewQueue(maxBytes)
	exp, err := otlptrace.New(ctx, q)
	if err != nil {
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(batchTimeout)),
		sdktrace.WithResource(newResource("berth-agent", version)),
	)
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	return &AgentTracer{provider: tp, Queue: q}, nil
}

// ServerOptions are the agent's gRPC server options for tracing.
func (a *AgentTracer) ServerOptions() []grpc.ServerOption {
	if a == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.StatsHandler(ServerHandler())}
}

// Shutdown flushes the agent's spans into the queue.
func (a *AgentTracer) Shutdown(ctx context.Context) error {
	if a == nil {
		return nil
	}
	return a.provider.Shutdown(ctx)
}

func newResource(service, version string) *resource.Resource {
	return resource.NewWithAttributes(semconv.SchemaURL,
		semconv.ServiceName(service), semconv.ServiceVersion(version), attribute.String("service.namespace", "berth"))
}

// Queue is an otlptrace.Client that keeps exported batches, serialized, in
// memory for Next: at most maxBytes of them, the oldest dropped first, so
// that the agent never blocks or grows on spans no one collects.
type Queue struct {
	mu      sync.Mutex
	batches [][]byte
	bytes   int
	max     int
	dropped int
	ready   chan struct{} // closed and replaced when a batch arrives
	stopped bool
}

// NewQueue returns an empty queue of at most maxBytes.
func NewQueue(maxBytes int) *Queue {
	return &Queue{max: maxBytes, ready: make(chan struct{})}
}

// Start implements otlptrace.Client.
func (q *Queue) Start(context.Context) error { return nil }

// Stop implements otlptrace.Client: Next returns errStopped once the queue
// is empty.
func (q *Queue) Stop(context.Context) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.stopped = true
	close(q.ready)
	q.ready = make(chan struct{})
	return nil
}

// UploadTraces implements otlptrace.Client: it queues rs as one batch.
func (q *Queue) UploadTraces(_ context.Context, rs []*tracepb.ResourceSpans) error {
	b, err := proto.Marshal(&collectortracepb.ExportTraceServiceRequest{ResourceSpans: rs})
	if err != nil {
		return err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(b) > MaxBatchBytes || len(b) > q.max {
		q.dropped++
		return nil
	}
	for q.bytes+len(b) > q.max && len(q.batches) > 0 {
		q.bytes -= len(q.batches[0])
		q.batches = q.batches[1:]
		q.dropped++
	}
	q.batches = append(q.batches, b)
	q.bytes += len(b)
	close(q.ready)
	q.ready = make(chan struct{})
	return nil
}

// errStopped ends Next after Stop.
var errStopped = errors.New("telemetry queue stopped")

// Next returns the oldest batch, waiting for one until ctx ends.
func (q *Queue) Next(ctx context.Context) ([]byte, error) {
	for {
		q.mu.Lock()
		if len(q.batches) > 0 {
			b := q.batches[0]
			q.batches = q.batches[1:]
			q.bytes -= len(b)
			q.mu.Unlock()
			return b, nil
		}
		if q.stopped {
			q.mu.Unlock()
			return nil, errStopped
		}
		ready := q.ready
		q.mu.Unlock()
		select {
		case <-ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func envEndpointSet() bool {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		if v, ok := lookupEnv(k); ok && v != "" {
			return true
		}
	}
	return false
}

var lookupEnv = os.LookupEnv

// Annotate adds the sandbox (and exec) a request is about to its RPC span.
func Annotate(ctx context.Context, sandboxID, execID string) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attribute.String("berth.sandbox.id", sandboxID))
	if execID != "" {
		span.SetAttributes(attribute.String("berth.exec.id", execID))
	}
}
