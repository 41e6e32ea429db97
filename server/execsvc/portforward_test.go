package execsvc

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/wire"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/runtime"
	"github.com/berth-sandbox/berth/server/runtimes"
)

// TestPortDataFields: berthd relays a port-forward data message between
// the caller and the agent as it is on the wire, so the data field must
// have the same number in all four messages, inside their oneof (a data
// message holds nothing else).
func TestPortDataFields(t *testing.T) {
	for _, m := range []proto.Message{
		&berthv1.PortForwardRequest{}, &berthv1.PortForwardResponse{},
		&agentv1.PortForwardRequest{}, &agentv1.PortForwardResponse{},
	} {
		name := m.ProtoReflect().Descriptor().FullName()
		n := wire.BytesField(m, "data")
		if n != portDataField {
			t.Errorf("%s data is field %d, want %d: berthd would relay data as another field", name, n, portDataField)
		}
		if m.ProtoReflect().Descriptor().Fields().ByNumber(n).ContainingOneof() == nil {
			t.Errorf("%s data is not in a oneof: a data message could carry other fields", name)
		}
	}
}

// fakeDialer is berthd's own dial in a sandbox's network namespace: it
// records what it was asked and answers with dial.
type fakeDialer struct {
	mu    sync.Mutex
	asked []string // "sandbox pid port"
	dial  func(port uint32) (*net.TCPConn, error)
}

func (d *fakeDialer) DialPort(_ context.Context, id string, pid uint32, port uint32) (*net.TCPConn, error) {
	d.mu.Lock()
	d.asked = append(d.asked, fmt.Sprintf("%s %d %d", id, pid, port))
	d.mu.Unlock()
	return d.dial(port)
}

func (d *fakeDialer) Asked() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.asked)
}

// dialLocal connects to addr as berthd's dial in the sandbox would.
func dialLocal(addr string) (*net.TCPConn, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// localListener listens on a port of 127.0.0.1 until the test ends.
func localListener(t *testing.T) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	return lis
}

// echoServer accepts one connection, reads it to end of file (the
// caller's half-close), answers "echo:" and what it read, and closes.
func echoServer(t *testing.T) string {
	t.Helper()
	lis := localListener(t)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		got, err := io.ReadAll(c)
		if err != nil {
			return
		}
		c.Write(append([]byte("echo:"), got...))
	}()
	return lis.Addr().String()
}

// TestPortForwardDirect: where berthd can dial in the sandbox's network
// namespace itself, it does, for the task Reach found, and the agent is
// not asked: connected, the caller's data (plain chunks, an empty one,
// one of 300 KiB that arrives in many of gRPC's 16 KiB buffers and is
// written from them, and one with an unknown field, which is decoded),
// its half-close, the server's answer and end of file, then OK.
func TestPortForwardDirect(t *testing.T) {
	addr := echoServer(t)
	d := &fakeDialer{dial: func(uint32) (*net.TCPConn, error) { return dialLocal(addr) }}
	h := newHarnessWith(t, 0, func(h *harness) { h.ports = d })
	unknown := portData("pong\x00")
	unknown.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 1))
	large := make([]byte, 300<<10)
	rand.Read(large)
	want := "echo:ping " + string(large) + "pong\x00"
	var got []byte
	eof := false
	for _, msg := range exchange(t, h, portData("ping "), portData(""), portData(string(large)), unknown) {
		if eof {
			t.Errorf("message %v after eof", msg)
		}
		got = append(got, msg.GetData()...)
		eof = msg.GetEof() != nil
	}
	if string(got) != want || !eof {
		t.Errorf("after connected: %d bytes (%q...), eof %v; want the %d bytes %q..., then eof", len(got), got[:min(len(got), 16)], eof, len(want), want[:16])
	}
	if asked := d.Asked(); !slices.Equal(asked, []string{fmt.Sprintf("%s %d 8080", testSandbox, testRuntime.TaskPID)}) {
		t.Errorf("dialer asked %q; want the port of the task Reach found", asked)
	}
	if n := h.agent.Calls(); n != 0 {
		t.Errorf("agent called %d times; want 0 (berthd dialed)", n)
	}
	if got := h.reach.Reached(); len(got) != 1 {
		t.Errorf("reached %v; want once (ownership and the agent's answer first)", got)
	}
}

// TestPortForwardDirectRefused: a closed port dialed by berthd is the
// agent's answer, FAILED_PRECONDITION PORT_CLOSED naming it; the agent is
// not asked. A second start on a direct connection is INVALID_ARGUMENT
// naming "data", as through the agent.
func TestPortForwardDirectRefused(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := lis.Addr().String()
	lis.Close()
	d := &fakeDialer{dial: func(uint32) (*net.TCPConn, error) { return dialLocal(closed) }}
	h := newHarnessWith(t, 0, func(h *harness) { h.ports = d })
	stream, err := h.client.PortForward(callContext(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(portStart(testSandbox, 9)); err != nil {
		t.Fatal(err)
	}
	_, err = stream.Recv()
	checkStatus(t, err, want{code: codes.FailedPrecondition, reason: rpcstatus.ReasonPortClosed, meta: map[string]string{"port": "9"}})
	if !strings.Contains(grpcstatus.Convert(err).Message(), "port 9 in the sandbox is closed: nothing listens on it") {
		t.Errorf("message %q; want the agent's words", grpcstatus.Convert(err).Message())
	}
	if n := h.agent.Calls(); n != 0 {
		t.Errorf("agent called %d times; want 0", n)
	}

	addr := echoServer(t)
	d.dial = func(uint32) (*net.TCPConn, error) { return dialLocal(addr) }
	checkSecondStart(t, h)
}

// TestPortForwardAgentDials: where berthd cannot dial in the sandbox
// itself (runtime.ErrNoDirectPath: gVisor, a task not proven the
// sandbox's) or its dial fails for want of its own resources (EMFILE), the
// agent dials.
func TestPortForwardAgentDials(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"no direct path", fmt.Errorf("%w: sandbox runs under gVisor", runtime.ErrNoDirectPath)},
		{"berthd out of descriptors", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("socket", syscall.EMFILE)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &fakeDialer{dial: func(uint32) (*net.TCPConn, error) { return nil, tc.err }}
			h := newHarnessWith(t, 0, func(h *harness) { h.ports = d })
			h.agent.portForward = func(stream agentv1.AgentService_PortForwardServer) error {
				first, err := stream.Recv()
				if err != nil {
					return err
				}
				return stream.Send(&agentv1.PortForwardResponse{Event: &agentv1.PortForwardResponse_Connected{Connected: &berthv1.PortForwardConnected{Port: first.GetPort()}}})
			}
			stream, err := h.client.PortForward(callContext(t))
			if err != nil {
				t.Fatal(err)
			}
			if err := stream.Send(portStart(testSandbox, 8080)); err != nil {
				t.Fatal(err)
			}
			if msg, err := stream.Recv(); err != nil || msg.GetConnected().GetPort() != 8080 {
				t.Fatalf("first message %v, %v; want connected to 8080 through the agent", msg, err)
			}
			if n := h.agent.Calls(); n != 1 {
				t.Errorf("agent called %d times; want 1", n)
			}
			if len(d.Asked()) != 1 {
				t.Errorf("dialer asked %q; want once", d.Asked())
			}
		})
	}
}

// TestPortForwardDirectBounded: each connection berthd dials itself holds
// one of berthd's own descriptors (through the agent it held one of the
// sandbox's, under the sandbox's RLIMIT_NOFILE), so a tenant must not be
// able to hold berthd's descriptors without bound: past
// Config.DirectForwardsPerSandbox open direct connections of one sandbox
// (or Config.DirectForwards in all) the agent dials, and a connection that
// ends gives its place back.
func TestPortForwardDirectBounded(t *testing.T) {
	lis := localListener(t)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(io.Discard, c); c.Close() }() // held until the caller's half-close
		}
	}()
	d := &fakeDialer{dial: func(uint32) (*net.TCPConn, error) { return dialLocal(lis.Addr().String()) }}
	h := newHarnessWith(t, 0, func(h *harness) {
		h.ports = d
		h.cfg.DirectForwardsPerSandbox = 2
	})
	h.agent.portForward = agentConnects
	open := func() berthv1.SandboxService_PortForwardClient { return openForward(t, h) }
	end := func(stream berthv1.SandboxService_PortForwardClient) {
		t.Helper()
		if err := stream.CloseSend(); err != nil {
			t.Fatal(err)
		}
		for {
			if _, err := stream.Recv(); err != nil {
				if !errors.Is(err, io.EOF) {
					t.Fatalf("PortForward ended %v; want OK", err)
				}
				return
			}
		}
	}
	first, second, third := open(), open(), open()
	if asked, calls := len(d.Asked()), h.agent.Calls(); asked != 2 || calls != 1 {
		t.Errorf("three connections of one sandbox, two allowed direct: berthd dialed %d, the agent %d; want 2 and 1", asked, calls)
	}
	end(first)
	fourth := open()
	if asked, calls := len(d.Asked()), h.agent.Calls(); asked != 3 || calls != 1 {
		t.Errorf("after one direct connection ended: berthd dialed %d, the agent %d; want 3 and 1", asked, calls)
	}
	for _, s := range []berthv1.SandboxService_PortForwardClient{second, third, fourth} {
		end(s)
	}
}

// exitSource is containerd's task events as a test sends them.
type exitSource struct{ events chan runtime.TaskEvent }

func (s exitSource) TaskEvents(context.Context) (<-chan runtime.TaskEvent, <-chan error) {
	return s.events, make(chan error)
}

func (exitSource) Get(_ context.Context, id string) (runtime.Sandbox, error) {
	return runtime.Sandbox{ID: id, Running: true, TaskPID: testRuntime.TaskPID}, nil
}

// TestPortForwardDirectTaskExits: a connection berthd dialed itself ends
// when the sandbox's task exits (deleted, crashed, restarted), as one
// through the agent ends with the agent. Here the server closed its side
// and the caller keeps its own open: before, the stream (berthd's socket,
// and with it the old network namespace) lasted as long as the caller
// kept it, past the sandbox's removal.
func TestPortForwardDirectTaskExits(t *testing.T) {
	lis := localListener(t)
	go func() {
		c, err := lis.Accept()
		if err == nil {
			c.Close() // end of file for the caller at once
		}
	}()
	src := exitSource{events: make(chan runtime.TaskEvent, 1)}
	d := &fakeDialer{dial: func(uint32) (*net.TCPConn, error) { return dialLocal(lis.Addr().String()) }}
	h := newHarnessWith(t, 0, func(h *harness) {
		h.ports = d
		h.events = runtimes.NewTaskEvents(src, slog.New(slog.DiscardHandler))
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go h.events.Run(ctx)

	stream := openForward(t, h)
	if msg, err := stream.Recv(); err != nil || msg.GetEof() == nil {
		t.Fatalf("message %v, %v; want eof", msg, err)
	}
	src.events <- runtime.TaskEvent{Kind: runtime.TaskExited, SandboxID: testSandbox, Pid: testRuntime.TaskPID, ExitStatus: 137, At: time.Now()}
	msg, err := stream.Recv()
	checkStatus(t, err, want{code: codes.Aborted, reason: rpcstatus.ReasonConnectionReset, meta: map[string]string{"port": "8080", "sandbox_id": testSandbox}})
	if msg != nil || !strings.Contains(grpcstatus.Convert(err).Message(), "the sandbox's task exited") {
		t.Errorf("after the task's exit: %v, %v; want the stream ended saying the task exited", msg, err)
	}
}
