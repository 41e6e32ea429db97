package agentconn

import (
	"context"
	"net"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
)

// olderAgent is an agent of version "v0.1.0-old" whose server lacks
// WriteStdin and WatchFiles, as one built before them; its ResizeExec
// refuses with an UNIMPLEMENTED of its own (with a berth reason).
type olderAgent struct {
	agentv1.UnimplementedAgentServiceServer
}

func (olderAgent) Info(context.Context, *agentv1.InfoRequest) (*agentv1.InfoResponse, error) {
	return &agentv1.InfoResponse{BootId: "b", Version: "v0.1.0-old"}, nil
}

func (olderAgent) ResizeExec(context.Context, *agentv1.ResizeExecRequest) (*agentv1.ResizeExecResponse, error) {
	return nil, rpcstatus.Error(codes.Unimplemented, "TTY_UNSUPPORTED", "no terminals here", nil)
}

// TestAgentTooOld calls, through the Pool's connection, methods an older
// agent's gRPC server does not have: a unary call and a stream both fail
// FAILED_PRECONDITION AGENT_TOO_OLD naming the method and the agent's
// version (asked by Info); the agent's own UNIMPLEMENTED, which carries a
// reason, passes unchanged.
func TestAgentTooOld(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	desc := agentv1.AgentService_ServiceDesc
	desc.Methods = slices.DeleteFunc(slices.Clone(desc.Methods), func(m grpc.MethodDesc) bool { return m.MethodName == "WriteStdin" })
	desc.Streams = slices.DeleteFunc(slices.Clone(desc.Streams), func(s grpc.StreamDesc) bool { return s.StreamName == "WatchFiles" })
	srv := grpc.NewServer()
	srv.RegisterService(&desc, olderAgent{})
	go srv.Serve(l)
	defer srv.Stop()

	p := NewPool(nil)
	defer p.Close()
	agent, err := p.Get(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	want := func(call string, err error, method string) {
		t.Helper()
		meta := rpcstatus.Metadata(err)
		if status.Code(err) != codes.FailedPrecondition || rpcstatus.Reason(err) != rpcstatus.ReasonAgentTooOld ||
			meta["agent_method"] != method || meta["agent_version"] != "v0.1.0-old" || meta["server_version"] == "" {
			t.Errorf("%s = %v (metadata %v), want FAILED_PRECONDITION AGENT_TOO_OLD naming %s and v0.1.0-old", call, err, meta, method)
		}
	}
	_, err = agent.WriteStdin(ctx, &agentv1.WriteStdinRequest{ExecId: "e"}, grpc.WaitForReady(true))
	want("WriteStdin", err, agentv1.AgentService_WriteStdin_FullMethodName)

	stream, err := agent.WatchFiles(ctx, &agentv1.WatchFilesRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	want("WatchFiles", err, agentv1.AgentService_WatchFiles_FullMethodName)

	_, err = agent.ResizeExec(ctx, &agentv1.ResizeExecRequest{ExecId: "e"})
	if status.Code(err) != codes.Unimplemented || rpcstatus.Reason(err) != "TTY_UNSUPPORTED" {
		t.Errorf("ResizeExec = %v, want the agent's own UNIMPLEMENTED TTY_UNSUPPORTED unchanged", err)
	}
}
