// Package integration runs berth end to end against a real containerd: a
// private containerd started by scripts/containerd.sh (or the one at
// BERTH_CONTAINERD_ADDRESS), the real berth-agent binary, real containers
// from the offline base image, and berthd's handlers behind a real gRPC
// server on a unix socket.
//
// Sandboxes use the snapshotter $BERTH_SNAPSHOTTER, by default btrfs on the
// quota-enabled btrfs that containerd.sh mounts, as production with disk
// quotas does; the main server gives every sandbox a disk quota of
// testDiskBytes unless its request sets one.
//
// With BERTH_E2E=1 (as CI sets) a missing prerequisite fails the run;
// without it the tests skip.
package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
	"github.com/berth-sandbox/berth/server/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// env is the shared test environment set up by TestMain.
var env struct {
	skip       string // why every test skips; empty when the env is up
	repo       string
	dir        string // short temp dir: sockets live here
	containerd string // containerd socket
	// containerdDir is the state directory of the tests' own containerd
	// (scripts/containerd.sh), empty with BERTH_CONTAINERD_ADDRESS.
	containerdDir string
	namespace     string
	snapshotter   string
	agentBinary   string
	cliBinary     string
	berthdAddr    string // unix:///... of the in-process server
	conn          *grpc.ClientConn
	sandboxes     berthv1.SandboxServiceClient
	images        berthv1.ImageServiceClient
	rt            *runtime.Runtime
	image         string
	archive       string // the base image's OCI archive
}

const baseImage = "berth.dev/base:latest"

// testDiskBytes is the main test server's default disk quota: every
// sandbox of the suite runs with one, far above what any test writes.
const testDiskBytes = 1 << 30

func TestMain(m *testing.M) {
	if os.Getenv(testEtcdEnv) != "" {
		os.Exit(runTestEtcd())
	}
	code, err := setup(m)
	if err != nil {
		if os.Getenv("BERTH_E2E") == "1" {
			fmt.Fprintf(os.Stderr, "integration: BERTH_E2E=1 but the environment cannot run: %v\n", err)
			os.Exit(1)
		}
		env.skip = err.Error()
		code = m.Run()
	}
	os.Exit(code)
}

// setup brings the environment up, runs the tests and tears it down, also
// when the test binary is stopped by SIGINT or SIGTERM. It returns an
// error only when the environment could not be brought up.
func setup(m *testing.M) (code int, err error) {
	td := &teardown{}
	stop := td.onSignal()
	defer stop()
	defer td.run(nil) // before stop: a signal meanwhile waits for it
	td.mu.Lock()
	err = bringUp(td)
	td.mu.Unlock()
	if err != nil {
		return 0, err
	}
	code = m.Run()
	printSideBySide(os.Stdout)
	return code, nil
}

// bringUp brings the environment up and adds to td what undoes each step.
// It runs with td.mu held, so that a signal's teardown waits for it.
func bringUp(td *teardown) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("containerd needs root")
	}
	repo, err := filepath.Abs("..")
	if err != nil {
		return err
	}
	env.repo = repo
	// Socket paths are limited to 108 bytes: keep the directory short.
	env.dir, err = os.MkdirTemp("/tmp", "bt")
	if err != nil {
		return err
	}
	td.add(func() {
		unmountUnder(env.dir)
		os.RemoveAll(env.dir)
	})
	// Sandboxes' roots are unprivileged host ids (user namespaces): they
	// must pass through to the containerd state and the agent binary here.
	if err := os.Chmod(env.dir, 0o711); err != nil {
		return err
	}

	env.containerd = os.Getenv("BERTH_CONTAINERD_ADDRESS")
	if env.containerd == "" {
		script := filepath.Join(repo, "scripts", "containerd.sh")
		dir := filepath.Join(env.dir, "c")
		// Added before the start: a start cut short (a Ctrl-C reaches the
		// script too) may have mounted the btrfs or started containerd,
		// and stop undoes whatever is there.
		td.add(func() {
			if out, err := exec.Command("bash", script, "stop", dir).CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "integration: stop containerd: %v: %s\n", err, out)
			}
		})
		if out, err := exec.Command("bash", script, "start", dir).CombinedOutput(); err != nil {
			return fmt.Errorf("start containerd: %v: %s", err, out)
		}
		env.containerd = filepath.Join(dir, "containerd.sock")
		env.containerdDir = dir
	}

	bin := filepath.Join(env.dir, "bin")
	env.agentBinary = filepath.Join(bin, "berth-agent")
	env.cliBinary = filepath.Join(bin, "berth")
	if err := goBuild(env.agentBinary, "./cmd/berth-agent", "CGO_ENABLED=0"); err != nil {
		return err
	}
	if err := goBuild(env.cliBinary, "./cmd/berth"); err != nil {
		return err
	}

	archive := os.Getenv("BERTH_TEST_IMAGE")
	if archive == "" {
		archive = filepath.Join(repo, "build", "base.oci.tar")
	}
	env.archive = archive
	if _, err := os.Stat(archive); err != nil {
		return fmt.Errorf("test image archive (build it with `make image`): %w", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := make([]byte, 4)
	rand.Read(b)
	env.namespace = "berth-test-" + hex.EncodeToString(b)
	env.snapshotter = os.Getenv("BERTH_SNAPSHOTTER")
	if env.snapshotter == "" {
		env.snapshotter = "btrfs"
	}
	env.rt, err = runtime.New(ctx, runtime.Config{
		Address:     env.containerd,
		Namespace:   env.namespace,
		Snapshotter: env.snapshotter,
		StateDir:    filepath.Join(env.dir, "st"),
		AgentBinary: env.agentBinary,
		// scripts/deps.sh installs runsc.
		GVisorBinary: filepath.Join(repo, "scripts", "runsc-berth"),
	})
	if err != nil {
		return err
	}
	td.add(func() { env.rt.Close() })

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("BERTH_TEST_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if env.snapshotter == "btrfs" {
		if err := env.rt.DiskQuota(); err != nil {
			return fmt.Errorf("the btrfs snapshotter cannot enforce disk quotas: %w", err)
		}
	}
	svc := server.New(server.Config{PullRegistries: []string{"*", "127.0.0.1:*"}, JournalDir: journalDir(), DefaultDiskBytes: testDiskQuota()}, env.rt, log)
	td.add(svc.Close)
	if err := svc.Start(ctx); err != nil {
		return err
	}
	sock := filepath.Join(env.dir, "berthd.sock")
	env.berthdAddr = "unix://" + sock
	lis, err := server.Listen(env.berthdAddr)
	if err != nil {
		return err
	}
	srv := server.NewGRPCServer(svc, log)
	// As berthd serves its unix socket: gRPC and the HTTP protocols on
	// one listener (BERTH_TEST_GRPC_ONLY=1: gRPC alone, to compare).
	go server.Serve(srv, lis, server.ServeConfig{HTTP: os.Getenv("BERTH_TEST_GRPC_ONLY") == "", Log: log})
	td.add(srv.Stop)

	env.conn, err = grpc.NewClient(env.berthdAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	td.add(func() { env.conn.Close() })
	env.sandboxes = berthv1.NewSandboxServiceClient(env.conn)
	env.images = berthv1.NewImageServiceClient(env.conn)

	if err := importImage(ctx, archive); err != nil {
		return err
	}
	env.image = baseImage
	td.add(cleanupNamespace)
	return nil
}

// testDiskQuota is the main server's default disk quota: testDiskBytes when
// the runtime can enforce it.
func testDiskQuota() uint64 {
	if env.rt.DiskQuota() != nil {
		return 0
	}
	return testDiskBytes
}

// importImage imports the test image through the public ImageService.
func importImage(ctx context.Context, archive string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	stream, err := env.images.ImportImage(ctx)
	if err != nil {
		return err
	}
	if err := stream.Send(&berthv1.ImportImageRequest{Part: &berthv1.ImportImageRequest_Header{Header: &berthv1.ImportImageHeader{}}}); err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if err := stream.Send(&berthv1.ImportImageRequest{Part: &berthv1.ImportImageRequest_Chunk{Chunk: buf[:n]}}); err != nil {
				return err
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return fmt.Errorf("import %s: %w", archive, err)
	}
	for _, img := range resp.GetImages() {
		if img.GetName() == baseImage {
			return nil
		}
	}
	return fmt.Errorf("import %s: got images %v, want %s among them", archive, resp.GetImages(), baseImage)
}

// cleanupNamespace deletes every sandbox the tests left behind.
func cleanupNamespace() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sbs, err := env.rt.List(ctx, nil)
	if err != nil {
		fmt.Fprintf(os.Stderr, "integration: list leftovers: %v\n", err)
		return
	}
	for _, sb := range sbs {
		if err := env.rt.Delete(ctx, sb.ID); err != nil {
			fmt.Fprintf(os.Stderr, "integration: delete leftover %s: %v\n", sb.ID, err)
		}
	}
}

func goBuild(out, pkg string, extraEnv ...string) error {
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = env.repo
	cmd.Env = append(os.Environ(), extraEnv...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v: %s", pkg, err, b)
	}
	return nil
}

// installProgram builds the static program ./integration/testdata/name
// and writes it into sandbox id at dest, executable.
func installProgram(tb testing.TB, c *client.Client, id, name, dest string) {
	tb.Helper()
	bin := filepath.Join(env.dir, "bin", name)
	if err := goBuild(bin, "./integration/testdata/"+name, "CGO_ENABLED=0"); err != nil {
		tb.Fatal(err)
	}
	f, err := os.Open(bin)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	if _, err := c.WriteFile(fileCtx(tb), id, dest, f, client.WithMode(0o755)); err != nil {
		tb.Fatal(err)
	}
}

// need skips the test when the environment is not up.
func need(t *testing.T) {
	t.Helper()
	if env.skip != "" {
		t.Skip("integration environment unavailable: " + env.skip)
	}
}

// newSandbox creates a sandbox for the test and deletes it at cleanup.
func newSandbox(t *testing.T, req *berthv1.CreateSandboxRequest) *berthv1.Sandbox {
	t.Helper()
	if req == nil {
		req = &berthv1.CreateSandboxRequest{}
	}
	if req.Image == "" {
		req.Image = env.image
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := env.sandboxes.CreateSandbox(ctx, req)
	if err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	sb := resp.GetSandbox()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := env.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: sb.GetId()}); err != nil {
			t.Errorf("DeleteSandbox(%s): %v", sb.GetId(), err)
		}
	})
	return sb
}

// run runs argv in the sandbox through the Run RPC.
func run(t *testing.T, sandboxID string, argv ...string) *berthv1.RunResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: sandboxID, Process: &berthv1.ProcessSpec{Argv: argv}})
	if err != nil {
		// The agent's log says what it started and what it saw end: the
		// first thing to read when a Run hangs or fails.
		log, _ := os.ReadFile(env.rt.LogPath(sandboxID))
		t.Fatalf("Run(%q): %v\nagent log of %s:\n%s", argv, err, sandboxID, log)
	}
	return resp
}

// shortID returns a unique sandbox id for a test.
func shortID(prefix string) string {
	b := make([]byte, 3)
	rand.Read(b)
	return strings.ToLower(prefix) + "-" + hex.EncodeToString(b)
}
