package integration

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/agentbin"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
	"github.com/berth-sandbox/berth/server/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// berthEnv is a berthd (in-process or a subprocess) with its own containerd
// namespace and state directory, so that what it adopts and cleans at start
// is its own.
type berthEnv struct {
	ns, stateDir, sock string
	rt                 *runtime.Runtime // containerd in ns, for checks
	conn               *grpc.ClientConn
	sandboxes          berthv1.SandboxServiceClient
	images             berthv1.ImageServiceClient
	svc                *server.Service // in-process only
}

// newNamespaceRuntime returns a runtime in a fresh namespace and state
// directory; at cleanup it deletes every sandbox left there.
func newNamespaceRuntime(t testing.TB, name string) (*runtime.Runtime, string, string) {
	t.Helper()
	return newNamespaceRuntimeWith(t, name, nil)
}

// newNamespaceRuntimeWith is newNamespaceRuntime with the runtime's
// config changed by change, when not nil.
func newNamespaceRuntimeWith(t testing.TB, name string, change func(*runtime.Config)) (*runtime.Runtime, string, string) {
	t.Helper()
	ns := env.namespace + "-" + name
	stateDir := filepath.Join(env.dir, name)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := runtime.Config{Address: env.containerd, Namespace: ns, Snapshotter: env.snapshotter, StateDir: stateDir, AgentBinary: env.agentBinary}
	if change != nil {
		change(&cfg)
	}
	rt, err := runtime.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		sbs, _ := rt.List(ctx, nil)
		for _, sb := range sbs {
			if err := rt.Delete(ctx, sb.ID); err != nil {
				t.Errorf("delete leftover %s: %v", sb.ID, err)
			}
		}
		rt.Close()
	})
	return rt, ns, stateDir
}

// dialEnv connects e's clients to e.sock.
func (e *berthEnv) dial(t testing.TB) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+e.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	e.conn, e.sandboxes, e.images = conn, berthv1.NewSandboxServiceClient(conn), berthv1.NewImageServiceClient(conn)
}

// importBase imports the test image through e's ImageService.
func (e *berthEnv) importBase(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	saved := env.images
	env.images = e.images
	defer func() { env.images = saved }()
	if err := importImageAs(ctx, archivePath(), ""); err != nil {
		t.Fatalf("import the base image into %s: %v", e.ns, err)
	}
}

// newBinaryEnv returns an environment for the berthd binary (startBerthd)
// on its own namespace and state directory.
func newBinaryEnv(t testing.TB, name string) *berthEnv {
	t.Helper()
	rt, ns, stateDir := newNamespaceRuntime(t, name)
	return &berthEnv{ns: ns, stateDir: stateDir, rt: rt, sock: filepath.Join(env.dir, name+".sock")}
}

// newInProcessEnv runs berthd's handlers with cfg in-process, on their own
// namespace, with the base image imported.
func newInProcessEnv(t testing.TB, name string, cfg server.Config) *berthEnv {
	t.Helper()
	return newInProcessEnvWith(t, name, cfg, nil, nil)
}

// newInProcessEnvWith is newInProcessEnv on a runtime whose config change
// changes, when not nil; prepare, when not nil, runs on the runtime before
// the service starts (to import an image a warm pool fills with).
func newInProcessEnvWith(t testing.TB, name string, cfg server.Config, change func(*runtime.Config), prepare func(*runtime.Runtime)) *berthEnv {
	t.Helper()
	rt, ns, stateDir := newNamespaceRuntimeWith(t, name, change)
	e := &berthEnv{ns: ns, stateDir: stateDir, rt: rt, sock: filepath.Join(env.dir, name+".sock")}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("BERTH_TEST_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	// The pool starts filling at Start: the image must be there before.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f, err := os.Open(archivePath())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := rt.ImportImage(ctx, f, ""); err != nil {
		t.Fatal(err)
	}
	if prepare != nil {
		prepare(rt)
	}
	e.svc = server.New(cfg, rt, log)
	if err := e.svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.svc.Close)
	e.serve(t, e.svc, log)
	return e
}

func (e *berthEnv) serve(t testing.TB, svc *server.Service, log *slog.Logger) {
	t.Helper()
	lis, err := server.Listen("unix://" + e.sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := server.NewGRPCServer(svc, log)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	e.dial(t)
}

var (
	berthdOnce sync.Once
	berthdBin  string
	berthdErr  error
)

// testServerVersion is linked into the berthd binary under test; the agent
// reports "dev", so its sandboxes show version skew.
const testServerVersion = "v0.0.0-berthd-test"

// berthdBinary builds cmd/berthd once.
func berthdBinary(t testing.TB) string {
	t.Helper()
	berthdOnce.Do(func() {
		berthdBin = filepath.Join(env.dir, "bin", "berthd")
		cmd := exec.Command("go", "build", "-o", berthdBin, "-ldflags", "-X github.com/berth-sandbox/berth/server.Version="+testServerVersion, "./cmd/berthd")
		cmd.Dir = env.repo
		if out, err := cmd.CombinedOutput(); err != nil {
			berthdErr = err
			t.Logf("go build berthd: %s", out)
		}
	})
	if berthdErr != nil {
		t.Fatalf("build berthd: %v", berthdErr)
	}
	return berthdBin
}

// berthdProc is a berthd subprocess.
type berthdProc struct {
	cmd    *exec.Cmd
	log    *agentbin.Buffer
	exited chan struct{}
	err    error
}

// startBerthd runs the berthd binary for e and waits until it serves. It is
// killed at cleanup if still running.
// startBerthdWithSandbox starts berthd (the real binary, default flags) in
// a new namespace called name, imports the base image and creates sandbox
// id in it.
func startBerthdWithSandbox(t *testing.T, name, id string) (*berthEnv, *berthdProc, string) {
	t.Helper()
	e := newBinaryEnv(t, name)
	p := startBerthd(t, e)
	e.importBase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	created, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: id, Image: baseImage})
	if err != nil {
		t.Fatalf("create sandbox %s: %v", id, err)
	}
	return e, p, created.GetSandbox().GetId()
}

func startBerthd(t testing.TB, e *berthEnv, flags ...string) *berthdProc {
	t.Helper()
	return startBerthdUnder(t, e, nil, flags...)
}

// startBerthdUnder is startBerthd with berthd run by the command wrapper
// (e.g. setpriv with its options), which must exec berthd in its place.
func startBerthdUnder(t testing.TB, e *berthEnv, wrapper []string, flags ...string) *berthdProc {
	t.Helper()
	args := append([]string{
		berthdBinary(t), "--containerd-address", env.containerd, "--namespace", e.ns, "--state-dir", e.stateDir,
		"--agent-binary", env.agentBinary, "--snapshotter", env.snapshotter, "--listen", "unix://" + e.sock, "--log-level", "DEBUG",
		"--reap-interval", "200ms",
	}, flags...)
	if !slices.ContainsFunc(flags, func(f string) bool { return strings.HasPrefix(f, "--disk-overcommit") }) {
		// Tests' sandboxes write little; at berthd's default quota
		// (10 GiB) the suite's 20 GiB pool would admit two.
		args = append(args, "--disk-overcommit", "100")
	}
	args = append(append([]string(nil), wrapper...), args...)
	p := &berthdProc{cmd: exec.Command(args[0], args[1:]...), log: &agentbin.Buffer{}, exited: make(chan struct{})}
	p.cmd.Stderr = p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("berthd log:\n%s", p.log)
		}
	})
	e.dial(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.images.ListImages(ctx, &berthv1.ListImagesRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("berthd did not serve: %v\nlog:\n%s", err, p.log)
	}
	return p
}

// signal sends sig to berthd and waits up to 15s for it to exit.
func (p *berthdProc) signal(t testing.TB, sig syscall.Signal) error {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
		return p.err
	case <-time.After(15 * time.Second):
		t.Fatalf("berthd did not exit within 15s of %v", sig)
		return nil
	}
}

// logLines returns the lines of berthd's log that contain every one of
// subs.
func (p *berthdProc) logLines(subs ...string) []string {
	var out []string
	for _, line := range strings.Split(p.log.String(), "\n") {
		all := true
		for _, s := range subs {
			all = all && strings.Contains(line, s)
		}
		if all && line != "" {
			out = append(out, line)
		}
	}
	return out
}
