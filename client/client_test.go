package client_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

type testEnv struct {
	c      *client.Client
	boxes  *fakeSandboxes
	images *fakeImages
}

// newTestEnv serves the fakes over bufconn and dials them with the real
// client. Its cleanup fails the test if an Execution's receive goroutine
// outlives the test.
func newTestEnv(t *testing.T) *testEnv {
	t.Helper()
	env := &testEnv{boxes: newFakeSandboxes(), images: &fakeImages{imports: make(chan importOutcome, 4)}}
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	berthv1.RegisterSandboxServiceServer(srv, env.boxes)
	berthv1.RegisterImageServiceServer(srv, env.images)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	c, err := client.Dial(t.Context(), "passthrough:///bufnet", client.WithInsecure(), client.WithDialOptions(
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
	))
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	env.c = c
	t.Cleanup(func() {
		checkNoReceivers(t)
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return env
}

// checkNoReceivers waits up to 2 s for every Execution receive goroutine to
// end.
func checkNoReceivers(t *testing.T) {
	t.Helper()
	var stacks string
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		buf := make([]byte, 1<<20)
		stacks = string(buf[:runtime.Stack(buf, true)])
		if !strings.Contains(stacks, "client.(*Execution).receive") {
			return
		}
	}
	t.Errorf("an Execution receive goroutine is still running:\n%s", stacks)
}

func argv(args ...string) *berthv1.ProcessSpec { return &berthv1.ProcessSpec{Argv: args} }

func TestDialUnixSocket(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "b.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	berthv1.RegisterSandboxServiceServer(srv, newFakeSandboxes())
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	for _, target := range []string{"unix://" + sock, "unix:" + sock, sock} {
		t.Run(target, func(t *testing.T) {
			c, err := client.Dial(t.Context(), target)
			if err != nil {
				t.Fatalf("Dial(%q): %v", target, err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			sb, err := c.GetSandbox(ctx, "sb-1")
			if err != nil {
				t.Fatalf("GetSandbox over %q: %v", target, err)
			}
			if sb.GetId() != "sb-1" {
				t.Errorf("GetSandbox over %q = %q, want sb-1", target, sb.GetId())
			}
		})
	}
}

func TestDialRejectsEmptyTarget(t *testing.T) {
	for _, target := range []string{"", "unix:", "unix://"} {
		if c, err := client.Dial(t.Context(), target); err == nil {
			c.Close()
			t.Errorf("Dial(%q) succeeded, want an error", target)
		}
	}
}

func ids(sbs []*berthv1.Sandbox) []string {
	var out []string
	for _, sb := range sbs {
		out = append(out, sb.GetId())
	}
	return out
}

func collect(t *testing.T, c *client.Client, sel map[string]string) []*berthv1.Sandbox {
	t.Helper()
	var out []*berthv1.Sandbox
	for sb, err := range c.ListSandboxes(t.Context(), sel) {
		if err != nil {
			t.Fatalf("ListSandboxes(%v): %v", sel, err)
		}
		out = append(out, sb)
	}
	return out
}

func TestSandboxLifecycle(t *testing.T) {
	env := newTestEnv(t)
	ctx := t.Context()
	for _, req := range []*berthv1.CreateSandboxRequest{
		{SandboxId: "box-1", Image: "busybox", Labels: map[string]string{"team": "a"}},
		{SandboxId: "box-2", Image: "busybox", Labels: map[string]string{"team": "b"}},
		{SandboxId: "box-3", Image: "busybox", Labels: map[string]string{"team": "a"}},
		{SandboxId: "box-4", Image: "busybox", Labels: map[string]string{"team": "a", "x": "y"}},
	} {
		sb, err := env.c.CreateSandbox(ctx, req)
		if err != nil {
			t.Fatalf("CreateSandbox(%v): %v", req, err)
		}
		if sb.GetId() != req.GetSandboxId() || sb.GetState() != berthv1.SandboxState_SANDBOX_STATE_RUNNING {
			t.Errorf("CreateSandbox(%v) = %v, want id %s running", req, sb, req.GetSandboxId())
		}
	}
	again, err := env.c.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: "box-1", Image: "busybox", Labels: map[string]string{"team": "a"}})
	if err != nil || again.GetId() != "box-1" {
		t.Errorf("CreateSandbox(box-1) again = %v, %v, want box-1", again, err)
	}

	if got, want := ids(collect(t, env.c, nil)), []string{"box-1", "box-2", "box-3", "box-4", "sb-1"}; !slices.Equal(got, want) {
		t.Errorf("ListSandboxes(nil) = %v, want %v", got, want)
	}
	var tokens []string
	for _, r := range env.boxes.listReqs {
		tokens = append(tokens, r.GetPageToken())
	}
	if want := []string{"", "box-2", "box-4"}; !slices.Equal(tokens, want) {
		t.Errorf("page tokens sent = %q, want %q", tokens, want)
	}
	sel := map[string]string{"team": "a"}
	if got, want := ids(collect(t, env.c, sel)), []string{"box-1", "box-3", "box-4"}; !slices.Equal(got, want) {
		t.Errorf("ListSandboxes(%v) = %v, want %v", sel, got, want)
	}
	for _, r := range env.boxes.listReqs[3:] {
		if diff := cmp.Diff(sel, r.GetLabelSelector()); diff != "" {
			t.Errorf("label selector sent (-want +got):\n%s", diff)
		}
	}
	for sb, err := range env.c.ListSandboxes(ctx, nil) {
		if err != nil || sb.GetId() != "box-1" {
			t.Errorf("first listed = %v, %v, want box-1", sb, err)
		}
		break // stopping early must not call yield again
	}

	got, err := env.c.GetSandbox(ctx, "box-4")
	if err != nil {
		t.Fatalf("GetSandbox(box-4): %v", err)
	}
	want := &berthv1.Sandbox{
		Id: "box-4", Image: "busybox", State: berthv1.SandboxState_SANDBOX_STATE_RUNNING,
		Labels: map[string]string{"team": "a", "x": "y"}, CreatedAt: testCreated,
		Runtime: &berthv1.RuntimeIdentity{AgentBootId: "boot-box-4", TaskPid: 1234},
	}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("GetSandbox(box-4) (-want +got):\n%s", diff)
	}

	if err := env.c.DeleteSandbox(ctx, "box-4"); err != nil {
		t.Fatalf("DeleteSandbox(box-4): %v", err)
	}
	if err := env.c.DeleteSandbox(ctx, "box-4"); err != nil {
		t.Errorf("DeleteSandbox(box-4) again = %v, want nil", err)
	}
	if _, err := env.c.GetSandbox(ctx, "box-4"); status.Code(err) != codes.NotFound {
		t.Errorf("GetSandbox(box-4) after delete: %v, want NotFound", err)
	}
}

func TestErrors(t *testing.T) {
	env := newTestEnv(t)
	ctx := t.Context()
	execErr := func(sandboxID string, spec *berthv1.ProcessSpec) error {
		e, err := env.c.Exec(ctx, sandboxID, spec)
		if err == nil {
			_, err = e.Wait()
			return fmt.Errorf("Exec succeeded, result error %v", err)
		}
		return err
	}
	tests := []struct {
		name string
		call func() error
		want *client.Error
	}{{
		name: "get missing",
		call: func() error { _, err := env.c.GetSandbox(ctx, "nope"); return err },
		want: &client.Error{Code: codes.NotFound, Reason: client.ReasonSandboxNotFound, Message: `sandbox "nope" not found`, Metadata: map[string]string{"sandbox_id": "nope"}},
	}, {
		name: "create bad id",
		call: func() error {
			_, err := env.c.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: "Bad_ID", Image: "busybox"})
			return err
		},
		want: &client.Error{
			Code: codes.InvalidArgument, Reason: client.ReasonInvalidArgument,
			Message:         "sandbox_id: must be 1 to 63 characters from [a-z0-9-]",
			Metadata:        map[string]string{"field": "sandbox_id"},
			FieldViolations: []client.FieldViolation{{Field: "sandbox_id", Description: "must be 1 to 63 characters from [a-z0-9-]"}},
		},
	}, {
		name: "create missing image",
		call: func() error {
			_, err := env.c.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: "nope"})
			return err
		},
		want: &client.Error{Code: codes.NotFound, Reason: client.ReasonImageNotFound, Message: `image "nope" not found`},
	}, {
		name: "create conflicting",
		call: func() error {
			_, err := env.c.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: "sb-1", Image: "busybox", Labels: map[string]string{"a": "b"}})
			return err
		},
		want: &client.Error{Code: codes.AlreadyExists, Reason: client.ReasonSandboxExists, Message: `sandbox "sb-1" exists with another spec`},
	}, {
		name: "exec missing sandbox",
		call: func() error { return execErr("nope", argv("true")) },
		want: &client.Error{Code: codes.NotFound, Reason: client.ReasonSandboxNotFound, Message: `sandbox "nope" not found`, Metadata: map[string]string{"sandbox_id": "nope"}},
	}, {
		name: "exec empty argv",
		call: func() error { return execErr("sb-1", &berthv1.ProcessSpec{}) },
		want: &client.Error{
			Code: codes.InvalidArgument, Reason: client.ReasonInvalidArgument, Message: "process.argv: must not be empty",
			Metadata:        map[string]string{"field": "process.argv"},
			FieldViolations: []client.FieldViolation{{Field: "process.argv", Description: "must not be empty"}},
		},
	}, {
		name: "attach missing exec",
		call: func() error { _, err := env.c.Attach(ctx, "sb-1", "nope", 0); return err },
		want: &client.Error{Code: codes.NotFound, Reason: client.ReasonExecNotFound, Message: `exec "nope" not found`},
	}, {
		name: "run with stdin",
		call: func() error {
			_, err := env.c.Run(ctx, "sb-1", &berthv1.ProcessSpec{Argv: []string{"cat"}, Stdin: true})
			return err
		},
		want: &client.Error{
			Code: codes.InvalidArgument, Reason: client.ReasonInvalidArgument, Message: "process.stdin: must be false for Run",
			Metadata:        map[string]string{"field": "process.stdin"},
			FieldViolations: []client.FieldViolation{{Field: "process.stdin", Description: "must be false for Run"}},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			var got *client.Error
			if !errors.As(err, &got) {
				t.Fatalf("error %v (%T) is not a *client.Error", err, err)
			}
			if diff := cmp.Diff(tt.want, got, cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".status" }, cmp.Ignore()), cmp.AllowUnexported(client.Error{})); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
			// The status stays reachable for callers that already use it.
			st, ok := status.FromError(err)
			if !ok || st.Code() != tt.want.Code || st.Message() != tt.want.Message {
				t.Errorf("status.FromError = %v, %v, want code %v message %q", st, ok, tt.want.Code, tt.want.Message)
			}
			var info *errdetails.ErrorInfo
			for _, d := range st.Details() {
				if i, ok := d.(*errdetails.ErrorInfo); ok {
					info = i
				}
			}
			if info.GetReason() != tt.want.Reason || info.GetDomain() != client.ErrorDomain {
				t.Errorf("status ErrorInfo = %v, want reason %s domain %s", info, tt.want.Reason, client.ErrorDomain)
			}
			if want := tt.want.Message + " (" + tt.want.Code.String() + ", " + tt.want.Reason + ")"; err.Error() != want {
				t.Errorf("Error() = %q, want %q", err.Error(), want)
			}
		})
	}
}

func TestExecExactBytes(t *testing.T) {
	env := newTestEnv(t)
	var out, errOut bytes.Buffer
	var kinds []string
	e, err := env.c.Exec(t.Context(), "sb-1", argv("bytes"),
		client.WithExecID("x-1"),
		client.WithStdout(&out),
		client.WithStderr(&errOut),
		client.WithEventHandler(func(ev *berthv1.ExecResponse) {
			kinds = append(kinds, strings.TrimPrefix(fmt.Sprintf("%T", ev.GetEvent()), "*berthv1.ExecResponse_"))
		}))
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	if e.ID() != "x-1" || e.Started().GetPid() != 42 || e.SandboxID() != "sb-1" {
		t.Errorf("ID, Started, SandboxID = %q, %v, %q, want x-1, pid 42, sb-1", e.ID(), e.Started(), e.SandboxID())
	}
	res, err := e.Wait()
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if diff := cmp.Diff(bytesResult, res, protocmp.Transform()); diff != "" {
		t.Errorf("result (-want +got):\n%s", diff)
	}
	if got, want := out.Bytes(), []byte("a\x00b\xe2\x82\xac\n"); !bytes.Equal(got, want) {
		t.Errorf("stdout = %q, want %q", got, want)
	}
	if got, want := errOut.Bytes(), []byte("\xff\xf0\x9f\x98\x80"); !bytes.Equal(got, want) {
		t.Errorf("stderr = %q, want %q", got, want)
	}
	if want := []string{"Output", "Output", "Output", "Heartbeat", "Output", "Dropped", "Output", "Output", "Exited"}; !slices.Equal(kinds, want) {
		t.Errorf("events = %v, want %v", kinds, want)
	}
	wantDropped := []*berthv1.ExecDropped{{FirstSeq: 5, LastSeq: 6, LostBytes: 10}}
	if diff := cmp.Diff(wantDropped, e.Dropped(), protocmp.Transform()); diff != "" {
		t.Errorf("Dropped (-want +got):\n%s", diff)
	}
	if got := e.LastSeq(); got != 8 {
		t.Errorf("LastSeq = %d, want 8", got)
	}
	if res2, err2 := e.Wait(); res2 != res || err2 != nil {
		t.Errorf("second Wait = %v, %v, want the same result", res2, err2)
	}
}

func TestExecSameWriterInterleaves(t *testing.T) {
	env := newTestEnv(t)
	var both bytes.Buffer
	e, err := env.c.Exec(t.Context(), "sb-1", argv("bytes"), client.WithStdout(&both), client.WithStderr(&both))
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	if _, err := e.Wait(); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if got, want := both.Bytes(), []byte("a\x00b\xff\xe2\x82\xac\n\xf0\x9f\x98\x80"); !bytes.Equal(got, want) {
		t.Errorf("combined output = %q, want %q", got, want)
	}
}

// TestExecBigEvents checks that output events larger than gRPC's data
// frames, which the client reads from gRPC's buffers without decoding, reach
// the writers whole and in order, with and without an event handler (which
// takes decoded events).
func TestExecBigEvents(t *testing.T) {
	env := newTestEnv(t)
	var wantOut, wantErr []byte
	for i, size := range bigSizes {
		if i%2 == 0 {
			wantOut = append(wantOut, bigData(i, size)...)
		} else {
			wantErr = append(wantErr, bigData(i, size)...)
		}
	}
	for _, handler := range []bool{false, true} {
		t.Run(fmt.Sprintf("handler %v", handler), func(t *testing.T) {
			var out, errOut bytes.Buffer
			var outputs int
			opts := []client.ExecOption{client.WithStdout(&out), client.WithStderr(&errOut)}
			if handler {
				opts = append(opts, client.WithEventHandler(func(ev *berthv1.ExecResponse) {
					if ev.GetOutput() != nil {
						outputs++
					}
				}))
			}
			e, err := env.c.Exec(t.Context(), "sb-1", argv("big"), opts...)
			if err != nil {
				t.Fatalf("Exec: %v", err)
			}
			if _, err := e.Wait(); err != nil {
				t.Fatalf("Wait: %v", err)
			}
			if !bytes.Equal(out.Bytes(), wantOut) || !bytes.Equal(errOut.Bytes(), wantErr) {
				t.Errorf("stdout %d bytes (equal %v), stderr %d bytes (equal %v); want %d and %d bytes",
					out.Len(), bytes.Equal(out.Bytes(), wantOut), errOut.Len(), bytes.Equal(errOut.Bytes(), wantErr), len(wantOut), len(wantErr))
			}
			if got := e.LastSeq(); got != uint64(len(bigSizes)) {
				t.Errorf("LastSeq = %d, want %d", got, len(bigSizes))
			}
			if handler && outputs != len(bigSizes) {
				t.Errorf("the handler saw %d outputs, want %d", outputs, len(bigSizes))
			}
		})
	}
}

func TestExecStdin(t *testing.T) {
	env := newTestEnv(t)
	var out, errOut bytes.Buffer
	e, err := env.c.Exec(t.Context(), "sb-1", &berthv1.ProcessSpec{Argv: []string{"cat"}, Stdin: true},
		client.WithStdout(&out), client.WithStderr(&errOut))
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	big := make([]byte, 5<<19) // 2.5 MiB of every byte value
	for i := range big {
		big[i] = byte(i * 7)
	}
	in := e.Stdin()
	if n, err := in.Write(big); n != len(big) || err != nil {
		t.Fatalf("Write(2.5 MiB) = %d, %v, want %d, nil", n, err, len(big))
	}
	if n, err := in.Write(nil); n != 0 || err != nil {
		t.Errorf("Write(nil) = %d, %v, want 0, nil", n, err)
	}
	if _, err := in.Write([]byte("tail")); err != nil {
		t.Fatalf("Write(tail): %v", err)
	}
	if err := in.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := in.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	if _, err := in.Write([]byte("late")); !errors.Is(err, io.ErrClosedPipe) {
		t.Errorf("Write after Close = %v, want io.ErrClosedPipe", err)
	}
	res, err := e.Wait()
	if err != nil || res.GetExitCode() != 0 {
		t.Fatalf("Wait = %v, %v, want exit 0", res, err)
	}
	if want := append(big, "tail"...); !bytes.Equal(out.Bytes(), want) {
		t.Errorf("echoed stdout: %d bytes, want the %d written", out.Len(), len(want))
	}
	if got, want := errOut.String(), "stdin-sizes=1048576,1048576,524288,4 signals=0\n"; got != want {
		t.Errorf("server saw %q, want %q", got, want)
	}
}

func TestExecConcurrentSends(t *testing.T) {
	env := newTestEnv(t)
	var out, errOut bytes.Buffer
	e, err := env.c.Exec(t.Context(), "sb-1", &berthv1.ProcessSpec{Argv: []string{"cat"}, Stdin: true},
		client.WithStdout(&out), client.WithStderr(&errOut))
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	const writers, writes, signalers, signals = 8, 50, 2, 20
	var wg sync.WaitGroup
	for g := range writers {
		wg.Go(func() {
			for i := range writes {
				if _, err := fmt.Fprintf(e.Stdin(), "[g%d-%03d]", g, i); err != nil {
					t.Errorf("write: %v", err)
					return
				}
			}
		})
	}
	for range signalers {
		wg.Go(func() {
			for range signals {
				if err := e.Signal(t.Context(), "USR1"); err != nil {
					t.Errorf("Signal: %v", err)
					return
				}
				_ = e.LastSeq()
				_ = e.Dropped()
				_ = e.LastEventTime()
			}
		})
	}
	wg.Wait()
	if err := e.Stdin().Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := e.Wait(); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	got := out.String()
	for g := range writers {
		for i := range writes {
			if tok := fmt.Sprintf("[g%d-%03d]", g, i); strings.Count(got, tok) != 1 {
				t.Fatalf("stdout holds %q %d times, want once", tok, strings.Count(got, tok))
			}
		}
	}
	if want := writers * writes * len("[g0-000]"); len(got) != want {
		t.Errorf("stdout is %d bytes, want %d", len(got), want)
	}
	if !strings.HasSuffix(errOut.String(), fmt.Sprintf(" signals=%d\n", signalers*signals)) {
		t.Errorf("server report %q, want %d signals", errOut.String(), signalers*signals)
	}
	if got := e.LastSeq(); got != writers*writes+1 {
		t.Errorf("LastSeq = %d, want %d", got, writers*writes+1)
	}
}

func TestExecSignal(t *testing.T) {
	env := newTestEnv(t)
	e, err := env.c.Exec(t.Context(), "sb-1", argv("sleep"))
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	if _, err := e.Stdin().Write([]byte("x")); !errors.Is(err, client.ErrNoStdin) {
		t.Errorf("Write to an exec without stdin = %v, want ErrNoStdin", err)
	}
	// The fake server sends heartbeats while the command is silent: the
	// time of the last event must move on without any output.
	before := e.LastEventTime()
	for deadline := time.Now().Add(5 * time.Second); !e.LastEventTime().After(before); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("LastEventTime did not advance with heartbeats within 5s: still %v", before)
		}
	}
	if err := e.Signal(t.Context(), "TERM"); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	res, err := e.Wait()
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if res.GetExitCode() != 143 || res.GetSignal() != "SIGTERM" {
		t.Errorf("result = %v, want exit 143 by SIGTERM", res)
	}
	if err := e.Signal(t.Context(), "TERM"); !errors.Is(err, client.ErrStreamClosed) {
		t.Errorf("Signal after exit = %v, want ErrStreamClosed", err)
	}
}

func TestExecCancelEndsWaitPromptly(t *testing.T) {
	env := newTestEnv(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	e, err := env.c.Exec(ctx, "sb-1", &berthv1.ProcessSpec{Argv: []string{"sleep"}, Stdin: true})
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	t0 := time.Now()
	cancel()
	select {
	case <-e.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("Wait did not return within 2 s of cancel")
	}
	res, err := e.Wait()
	var ce *client.Error
	if res != nil || !errors.As(err, &ce) || ce.Code != codes.Canceled {
		t.Errorf("Wait after cancel = %v, %v, want no result and a Canceled *client.Error", res, err)
	}
	t.Logf("Wait returned %v after cancel", time.Since(t0))
	if _, err := e.Stdin().Write([]byte("x")); !errors.Is(err, client.ErrStreamClosed) {
		t.Errorf("Write after cancel = %v, want ErrStreamClosed", err)
	}
	if err := e.Signal(t.Context(), "INT"); !errors.Is(err, client.ErrStreamClosed) {
		t.Errorf("Signal after cancel = %v, want ErrStreamClosed", err)
	}
}

func TestExecDeadlineBeforeStarted(t *testing.T) {
	env := newTestEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	e, err := env.c.Exec(ctx, "sb-1", argv("hang"))
	var ce *client.Error
	if e != nil || !errors.As(err, &ce) || ce.Code != codes.DeadlineExceeded {
		t.Errorf("Exec(hang) = %v, %v, want a DeadlineExceeded *client.Error", e, err)
	}
}

type failingWriter struct{ err error }

func (w failingWriter) Write([]byte) (int, error) { return 0, w.err }

func TestExecWriterError(t *testing.T) {
	env := newTestEnv(t)
	full := errors.New("disk full")
	e, err := env.c.Exec(t.Context(), "sb-1", argv("bytes"), client.WithStdout(failingWriter{full}))
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	res, err := e.Wait()
	if res != nil || !errors.Is(err, full) {
		t.Errorf("Wait = %v, %v, want no result and the writer's error", res, err)
	}
}

func TestExecProtocolViolations(t *testing.T) {
	env := newTestEnv(t)
	for _, name := range []string{"gap", "noexit", "badfirst", "badstream"} {
		t.Run(name, func(t *testing.T) {
			e, err := env.c.Exec(t.Context(), "sb-1", argv(name))
			var res *berthv1.ExecResult
			if err == nil {
				res, err = e.Wait()
			}
			if res != nil || !errors.Is(err, client.ErrProtocol) {
				t.Errorf("exec %s = %v, %v, want ErrProtocol", name, res, err)
			}
		})
	}
	t.Run("dup", func(t *testing.T) {
		var out bytes.Buffer
		e, err := env.c.Exec(t.Context(), "sb-1", argv("dup"), client.WithStdout(&out))
		if err != nil {
			t.Fatalf("Exec: %v", err)
		}
		if _, err := e.Wait(); err != nil {
			t.Fatalf("Wait: %v", err)
		}
		if out.String() != "ab" {
			t.Errorf("stdout = %q, want a replayed event written once: %q", out.String(), "ab")
		}
	})
}

func TestAttach(t *testing.T) {
	env := newTestEnv(t)
	tests := []struct {
		since                uint64
		wantOut, wantErr     string
		wantDropped          []*berthv1.ExecDropped
		wantLastSeq          uint64
		wantEventsAfterStart int
	}{
		{since: 0, wantOut: "three\nfive\n", wantErr: "four\n", wantDropped: []*berthv1.ExecDropped{{FirstSeq: 1, LastSeq: 2, LostBytes: 8}}, wantLastSeq: 5},
		{since: 1, wantOut: "three\nfive\n", wantErr: "four\n", wantDropped: []*berthv1.ExecDropped{{FirstSeq: 2, LastSeq: 2, LostBytes: 4}}, wantLastSeq: 5},
		{since: 3, wantOut: "five\n", wantErr: "four\n", wantLastSeq: 5},
		{since: 5, wantLastSeq: 5},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint("since ", tt.since), func(t *testing.T) {
			var out, errOut bytes.Buffer
			e, err := env.c.Attach(t.Context(), "sb-1", "done-exec", tt.since, client.WithStdout(&out), client.WithStderr(&errOut))
			if err != nil {
				t.Fatalf("Attach: %v", err)
			}
			res, err := e.Wait()
			if err != nil || res.GetExitCode() != 0 {
				t.Fatalf("Wait = %v, %v, want exit 0", res, err)
			}
			if out.String() != tt.wantOut || errOut.String() != tt.wantErr {
				t.Errorf("stdout, stderr = %q, %q, want %q, %q", out.String(), errOut.String(), tt.wantOut, tt.wantErr)
			}
			if diff := cmp.Diff(tt.wantDropped, e.Dropped(), protocmp.Transform(), cmpEmpty); diff != "" {
				t.Errorf("Dropped (-want +got):\n%s", diff)
			}
			if e.LastSeq() != tt.wantLastSeq || e.ID() != "done-exec" {
				t.Errorf("LastSeq, ID = %d, %q, want %d, done-exec", e.LastSeq(), e.ID(), tt.wantLastSeq)
			}
		})
	}
}

// cmpEmpty equates nil and empty slices.
var cmpEmpty = cmp.FilterValues(func(a, b []*berthv1.ExecDropped) bool { return len(a) == 0 && len(b) == 0 }, cmp.Comparer(func(a, b []*berthv1.ExecDropped) bool { return true }))

func TestRun(t *testing.T) {
	env := newTestEnv(t)
	resp, err := env.c.Run(t.Context(), "sb-1", argv("echo"), client.WithExecID("run-7"))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	want := &berthv1.RunResponse{
		ExecId: "run-7",
		Result: &berthv1.ExecResult{ExitCode: proto.Int32(0), StdoutBytes: 5, StderrBytes: 4},
		Stdout: []byte("out\x00\xff"),
		Stderr: []byte("err\n"),
	}
	if diff := cmp.Diff(want, resp, protocmp.Transform()); diff != "" {
		t.Errorf("Run (-want +got):\n%s", diff)
	}
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

func TestImportImage(t *testing.T) {
	env := newTestEnv(t)
	archive := make([]byte, 5<<19+17)
	for i := range archive {
		archive[i] = byte(i % 251)
	}
	var progress []uint64
	images, err := env.c.ImportImage(t.Context(), bytes.NewReader(archive), "berth.dev/test:latest",
		client.WithProgress(func(n uint64) { progress = append(progress, n) }))
	if err != nil {
		t.Fatalf("ImportImage: %v", err)
	}
	digest := fmt.Sprintf("sha256:%x", sha256.Sum256(archive))
	want := []*berthv1.Image{{Name: "berth.dev/test:latest", Digest: digest, SizeBytes: uint64(len(archive)), CreatedAt: testCreated}}
	if diff := cmp.Diff(want, images, protocmp.Transform()); diff != "" {
		t.Errorf("ImportImage (-want +got):\n%s", diff)
	}
	o := <-env.images.imports
	if want := []int{1 << 20, 1 << 20, 1<<19 + 17}; !slices.Equal(o.chunkSizes, want) || o.name != "berth.dev/test:latest" {
		t.Errorf("server saw name %q chunks %v, want berth.dev/test:latest %v", o.name, o.chunkSizes, want)
	}
	if want := []uint64{1 << 20, 2 << 20, uint64(len(archive))}; !slices.Equal(progress, want) {
		t.Errorf("progress = %v, want %v", progress, want)
	}

	t.Run("read error abandons the upload", func(t *testing.T) {
		gone := errors.New("disk gone")
		r := io.MultiReader(bytes.NewReader(archive[:3<<19]), errReader{gone})
		images, err := env.c.ImportImage(t.Context(), r, "x")
		if images != nil || !errors.Is(err, gone) {
			t.Errorf("ImportImage = %v, %v, want the read error", images, err)
		}
		select {
		case o := <-env.images.imports:
			if status.Code(o.err) != codes.Canceled {
				t.Errorf("server saw the stream end with %v, want Canceled (not a complete archive)", o.err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("server never saw the import end")
		}
	})
	t.Run("server error", func(t *testing.T) {
		_, err := env.c.ImportImage(t.Context(), bytes.NewReader(nil), "")
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Reason != client.ReasonImageArchive {
			t.Errorf("ImportImage(empty) = %v, want reason %s", err, client.ReasonImageArchive)
		}
		<-env.images.imports
	})
}

func TestListImages(t *testing.T) {
	env := newTestEnv(t)
	got, err := env.c.ListImages(t.Context())
	if err != nil {
		t.Fatalf("ListImages: %v", err)
	}
	if diff := cmp.Diff(fakeImageList, got, protocmp.Transform()); diff != "" {
		t.Errorf("ListImages (-want +got):\n%s", diff)
	}
}
