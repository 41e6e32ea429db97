package integration

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	collectortracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// otlpReceiver is an in-test OTLP trace collector: it keeps every span it
// is sent, by the service.name of its resource.
type otlpReceiver struct {
	collectortracepb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans map[string][]*tracepb.Span // service.name -> spans
	attrs map[*tracepb.Span]map[string]string
}

func (r *otlpReceiver) Export(_ context.Context, req *collectortracepb.ExportTraceServiceRequest) (*collectortracepb.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		res := map[string]string{}
		for _, kv := range rs.GetResource().GetAttributes() {
			res[kv.GetKey()] = kv.GetValue().GetStringValue()
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				r.spans[res["service.name"]] = append(r.spans[res["service.name"]], sp)
				r.attrs[sp] = res
			}
		}
	}
	return &collectortracepb.ExportTraceServiceResponse{}, nil
}

// inTrace returns the names of the spans of service in trace id, with the
// resource attributes of the last one.
func (r *otlpReceiver) inTrace(service string, id []byte) ([]string, map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var names []string
	var res map[string]string
	for _, sp := range r.spans[service] {
		if string(sp.GetTraceId()) == string(id) {
			names = append(names, sp.GetName())
			res = r.attrs[sp]
		}
	}
	return names, res
}

// TestTraceAcrossBerthdAndAgent runs berthd with --otlp-endpoint pointing
// at an in-test OTLP receiver and calls it with a W3C traceparent: the
// receiver must get spans of that one trace from berthd (the RPCs, the
// sandbox's creation) and from the sandbox's agent (its Info and Exec
// calls, relayed by berthd since the sandbox has no network), the agent's
// marked with the sandbox id.
func TestTraceAcrossBerthdAndAgent(t *testing.T) {
	need(t)
	recv := &otlpReceiver{spans: map[string][]*tracepb.Span{}, attrs: map[*tracepb.Span]map[string]string{}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	collectortracepb.RegisterTraceServiceServer(gs, recv)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)

	rt, ns, stateDir := newNamespaceRuntime(t, "trace")
	e := &berthEnv{ns: ns, stateDir: stateDir, rt: rt, sock: env.dir + "/trace.sock"}
	startBerthd(t, e, "--otlp-endpoint", "http://"+lis.Addr().String())
	e.importBase(t)

	traceID := []byte{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	created, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: baseImage, SandboxId: "traced"})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := e.sandboxes.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&berthv1.ExecRequest{Event: &berthv1.ExecRequest_Start{Start: &berthv1.ExecStart{
		SandboxId: created.GetSandbox().GetId(), Process: &berthv1.ProcessSpec{Argv: []string{"echo", "traced"}}}}}); err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			t.Fatalf("exec stream: %v", err)
		}
		if msg.GetExited() != nil {
			break
		}
	}

	// berthd exports within a second, the agent's spans take a second more
	// through the relay: poll, bounded.
	want := map[string][]string{
		"berthd":      {"berth.v1.SandboxService/CreateSandbox", "sandbox.create", "berth.agent.v1.AgentService/Info", "berth.v1.SandboxService/Exec", "berth.agent.v1.AgentService/Exec"},
		"berth-agent": {"berth.agent.v1.AgentService/Info", "berth.agent.v1.AgentService/Exec"},
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		missingSpans := map[string][]string{}
		for service, names := range want {
			got, _ := recv.inTrace(service, traceID)
			for _, n := range names {
				if !contains(got, n) {
					missingSpans[service] = append(missingSpans[service], n)
				}
			}
		}
		if len(missingSpans) == 0 {
			break
		}
		if time.Now().After(deadline) {
			b, _ := recv.inTrace("berthd", traceID)
			a, _ := recv.inTrace("berth-agent", traceID)
			t.Fatalf("after 30 s spans of trace 4bf92f35... still missing: %v\nberthd sent %q\nthe agent sent %q", missingSpans, b, a)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, res := recv.inTrace("berth-agent", traceID); res["berth.sandbox.id"] != "traced" {
		t.Errorf("the agent's spans have resource %v, want berth.sandbox.id=traced", res)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
