package files_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/internal/agentbin"
	"github.com/berth-sandbox/berth/internal/e2e"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
)

// agentBin is the berth-agent binary built by TestMain.
var agentBin string

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "fbin")
	if err != nil {
		fmt.Fprintln(os.Stderr, "temp dir:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	if agentBin, err = agentbin.Build(dir, ""); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// testAgent is a running berth-agent and its FileService client.
type testAgent struct {
	files agentv1.FileServiceClient
	// run is the directory of the agent's socket.
	run string
	// dir is a scratch directory, mode 0777 below a 0755 parent, so that
	// any workload user may work in it.
	dir string
	// base holds run and dir: startAgentIn starts another agent there.
	base string
	cmd  *exec.Cmd
	// exited is closed when cmd.Wait returned, with its error in waitErr.
	exited  chan struct{}
	waitErr error
	// crashed says that the test killed the agent (crash): cleanup does
	// not expect it to stop cleanly.
	crashed bool
}

// startAgent runs the agent binary with flags and returns a client of its
// FileService. The agent stops at cleanup and must exit 0. File tests need
// root: the agent switches to the workload user, which takes
// CAP_SETUID/CAP_SETGID.
func startAgent(t testing.TB, flags ...string) *testAgent {
	t.Helper()
	e2e.NeedRoot(t, "the file service acting as another user")
	base, err := os.MkdirTemp("", "fa")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	work := filepath.Join(base, "w")
	if err := os.Mkdir(work, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(work, 0o777); err != nil {
		t.Fatal(err)
	}
	// The socket in a directory of its own, as /.berth-run in a sandbox:
	// file calls do not touch that directory.
	if err := os.Mkdir(filepath.Join(base, "run"), 0o700); err != nil {
		t.Fatal(err)
	}
	return startAgentIn(t, base, flags...)
}

// startAgentIn is startAgent in the directories startAgent made in base:
// an agent started again, as after a crash.
func startAgentIn(t testing.TB, base string, flags ...string) *testAgent {
	t.Helper()
	a := &testAgent{base: base, dir: filepath.Join(base, "w"), run: filepath.Join(base, "run")}
	sock := filepath.Join(a.run, "a.sock")
	a.cmd = exec.Command(agentBin, append([]string{"--socket", sock, "--workdir", "/"}, flags...)...)
	logs := &agentbin.Buffer{}
	a.cmd.Stderr = logs
	a.cmd.Env = append(os.Environ(), "GORACE=halt_on_error=1")
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a.exited = make(chan struct{})
	go func() { a.waitErr = a.cmd.Wait(); close(a.exited) }()
	t.Cleanup(func() {
		if !a.crashed {
			_ = a.cmd.Process.Signal(syscall.SIGTERM)
		}
		select {
		case <-a.exited:
			if a.waitErr != nil && !a.crashed {
				t.Errorf("agent exit: %v, want 0\nagent log:\n%s", a.waitErr, logs)
			}
		case <-time.After(10 * time.Second):
			_ = a.cmd.Process.Kill()
			t.Errorf("agent did not stop within 10s of SIGTERM\nagent log:\n%s", logs)
		}
		if strings.Contains(logs.String(), "DATA RACE") {
			t.Errorf("agent reported a data race:\n%s", logs)
		}
		if t.Failed() {
			t.Logf("agent log:\n%s", logs)
		}
	})
	fast := grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 5 * time.Millisecond, Multiplier: 1.5, MaxDelay: 100 * time.Millisecond}, MinConnectTimeout: time.Second}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithConnectParams(fast))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := agentv1.NewAgentServiceClient(conn).Info(ctx, &agentv1.InfoRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("agent did not answer: %v\nagent log:\n%s", err, logs)
	}
	a.files = agentv1.NewFileServiceClient(conn)
	return a
}

// crash kills the agent with SIGKILL, as the kernel's OOM killer would,
// and waits until it is gone.
func (a *testAgent) crash(t testing.TB) {
	t.Helper()
	a.crashed = true
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("agent still there 10s after SIGKILL")
	}
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// writeFile writes data with header h (path set by the caller) in chunks of
// 1 MiB and returns the response.
func (a *testAgent) writeFile(t testing.TB, h *agentv1.WriteFileHeader, data []byte) (*agentv1.WriteFileResponse, error) {
	t.Helper()
	stream, err := a.files.WriteFile(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&agentv1.WriteFileRequest{Part: &agentv1.WriteFileRequest_Header{Header: h}}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	for len(data) > 0 {
		n := min(len(data), 1<<20)
		if err := stream.Send(&agentv1.WriteFileRequest{Part: &agentv1.WriteFileRequest_Chunk{Chunk: data[:n]}}); err != nil {
			if errors.Is(err, io.EOF) {
				break // the agent answered early: CloseAndRecv has its status
			}
			t.Fatal(err)
		}
		data = data[n:]
	}
	return stream.CloseAndRecv()
}

// readResult is what one ReadFile stream delivered.
type readResult struct {
	header *agentv1.ReadFileResponse
	data   []byte
	chunks int
}

func (a *testAgent) readFile(t testing.TB, req *agentv1.ReadFileRequest) (*readResult, error) {
	t.Helper()
	stream, err := a.files.ReadFile(testCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	r := &readResult{}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return r, nil
		}
		if err != nil {
			return r, err
		}
		if msg.GetHeader() != nil {
			if r.header != nil {
				t.Fatalf("second header %v", msg)
			}
			r.header = msg
			continue
		}
		if r.header == nil {
			t.Fatal("chunk before the header")
		}
		if len(msg.GetChunk()) > 1<<20 {
			t.Fatalf("chunk of %d bytes, want at most 1 MiB", len(msg.GetChunk()))
		}
		r.data = append(r.data, msg.GetChunk()...)
		r.chunks++
	}
}

// wantStatus fails unless err is a status with code and ErrorInfo reason,
// and (when path is not empty) metadata "path" equal to path. It returns
// the ErrorInfo metadata.
func wantStatus(t testing.TB, err error, code codes.Code, reason, path string) map[string]string {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || err == nil {
		t.Fatalf("error = %v, want a status %v %s", err, code, reason)
	}
	var info *errdetails.ErrorInfo
	for _, d := range st.Details() {
		if i, ok := d.(*errdetails.ErrorInfo); ok {
			info = i
		}
	}
	if st.Code() != code || info.GetReason() != reason {
		t.Fatalf("error = %v (reason %q), want %v %s", err, info.GetReason(), code, reason)
	}
	if st.Message() == "" {
		t.Errorf("error %v has an empty message", err)
	}
	if path != "" && info.GetMetadata()["path"] != path {
		t.Errorf("error %v names path %q, want %q", err, info.GetMetadata()["path"], path)
	}
	return info.GetMetadata()
}

// syscallStat is the Sys() of a FileInfo on Linux.
type syscallStat = syscall.Stat_t
