package integration

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/runtime"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestIdempotentCreate checks that concurrent creates of one id with one
// spec build one sandbox and all get it, that a create with another spec is
// ALREADY_EXISTS naming the differing fields, and that a request id makes a
// create without an id repeatable.
func TestIdempotentCreate(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id := shortID("idem")
	req := &berthv1.CreateSandboxRequest{SandboxId: id, Image: env.image, Env: map[string]string{"TOKEN": "s3cret"}, Labels: map[string]string{"k": "v"}}
	t.Cleanup(func() {
		env.sandboxes.DeleteSandbox(context.Background(), &berthv1.DeleteSandboxRequest{SandboxId: id})
	})

	const n = 8
	var wg sync.WaitGroup
	boots := make([]string, n)
	pids := make([]uint32, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := env.sandboxes.CreateSandbox(ctx, req)
			if err != nil {
				t.Errorf("concurrent CreateSandbox %d: %v", i, err)
				return
			}
			boots[i], pids[i] = resp.GetSandbox().GetRuntime().GetAgentBootId(), resp.GetSandbox().GetRuntime().GetTaskPid()
		}()
	}
	wg.Wait()
	for i := range n {
		if boots[i] == "" || boots[i] != boots[0] || pids[i] != pids[0] {
			t.Fatalf("concurrent creates of %s: agent boot ids %v, task pids %v; want one sandbox for all", id, boots, pids)
		}
	}
	sbs, err := env.rt.List(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	containers := 0
	for _, sb := range sbs {
		if sb.ID == id {
			containers++
		}
	}
	if containers != 1 {
		t.Errorf("containers with id %s = %d, want 1", id, containers)
	}

	// Later, the same request returns the same sandbox.
	again, err := env.sandboxes.CreateSandbox(ctx, req)
	if err != nil || again.GetSandbox().GetRuntime().GetAgentBootId() != boots[0] {
		t.Errorf("repeated CreateSandbox = %v, %v; want the sandbox with agent boot id %s", again.GetSandbox(), err, boots[0])
	}

	// Another spec under the same id is refused, naming what differs.
	other := &berthv1.CreateSandboxRequest{SandboxId: id, Image: env.image, Env: map[string]string{"TOKEN": "changed-token"}, Labels: map[string]string{"k": "v"},
		Resources: &berthv1.Resources{MemoryBytes: 64 << 20}}
	_, err = env.sandboxes.CreateSandbox(ctx, other)
	if status.Code(err) != codes.AlreadyExists || rpcstatus.Reason(err) != rpcstatus.ReasonSandboxExists {
		t.Fatalf("CreateSandbox with another spec = %v, want ALREADY_EXISTS %s", err, rpcstatus.ReasonSandboxExists)
	}
	if got := errorMeta(err)["fields"]; got != "env,resources.memory_bytes" {
		t.Errorf("conflict fields = %q, want %q (message %q)", got, "env,resources.memory_bytes", status.Convert(err).Message())
	}
	if strings.Contains(status.Convert(err).Message(), "s3cret") || strings.Contains(status.Convert(err).Message(), "changed-token") {
		t.Errorf("conflict message %q shows an env value", status.Convert(err).Message())
	}

	// A request id stands for a sandbox id.
	rq := &berthv1.CreateSandboxRequest{RequestId: "job-42/attempt-" + id, Image: env.image}
	first, err := env.sandboxes.CreateSandbox(ctx, rq)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		env.sandboxes.DeleteSandbox(context.Background(), &berthv1.DeleteSandboxRequest{SandboxId: first.GetSandbox().GetId()})
	})
	second, err := env.sandboxes.CreateSandbox(ctx, rq)
	if err != nil || second.GetSandbox().GetId() != first.GetSandbox().GetId() || second.GetSandbox().GetRuntime().GetAgentBootId() != first.GetSandbox().GetRuntime().GetAgentBootId() {
		t.Errorf("CreateSandbox with request id twice: %v then %v (%v); want the same sandbox", first.GetSandbox().GetId(), second.GetSandbox().GetId(), err)
	}
}

// errorMeta returns the berth ErrorInfo metadata of err.
func errorMeta(err error) map[string]string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetMetadata()
		}
	}
	return nil
}

// TestWorkloadUserEnvWorkdir checks that processes run as the workload user
// with the sandbox's env, in a working directory that user owns, and hold
// no capabilities; GetSandbox shows the spec without env values.
func TestWorkloadUserEnvWorkdir(t *testing.T) {
	need(t)
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{User: "1000:1000", Env: map[string]string{"GREETING": "hello world", "EMPTY": ""}})
	got := run(t, sb.GetId(), "sh", "-c", `id -u; id -g; stat -c %u:%g .; pwd; echo "$GREETING"; touch mine && stat -c %u mine; grep -E '^Cap(Prm|Eff|Bnd|Amb|Inh)' /proc/self/status`)
	want := "1000\n1000\n1000:1000\n/workspace\nhello world\n1000\n" +
		"CapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\n"
	if string(got.GetStdout()) != want {
		t.Errorf("as user 1000:1000: stdout %q (stderr %q), want %q", got.GetStdout(), got.GetStderr(), want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := env.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: sb.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	g := resp.GetSandbox()
	if g.GetUser() != "1000:1000" || g.GetWorkdir() != "/workspace" || strings.Join(g.GetEnvKeys(), ",") != "EMPTY,GREETING" {
		t.Errorf("GetSandbox: user %q workdir %q env_keys %v; want 1000:1000, /workspace, [EMPTY GREETING]", g.GetUser(), g.GetWorkdir(), g.GetEnvKeys())
	}
	if u := g.GetUsage(); u.GetMemoryBytes() == 0 || u.GetCpuTime().AsDuration() <= 0 || u.GetPids() == 0 {
		t.Errorf("GetSandbox usage = %v, want memory, CPU time and pids above zero", u)
	}
	if g.GetAgentVersion() == "" || g.GetAgentBuild() == "" || g.GetVersionSkew() {
		t.Errorf("GetSandbox: agent version %q build %q skew %v; want both set and no skew", g.GetAgentVersion(), g.GetAgentBuild(), g.GetVersionSkew())
	}

	// A custom working directory is created for the user too.
	sb2 := newSandbox(t, &berthv1.CreateSandboxRequest{User: "1234", Workdir: "/home/dev/src"})
	got = run(t, sb2.GetId(), "sh", "-c", `id -u; id -g; pwd; stat -c %u:%g .`)
	if want := "1234\n1234\n/home/dev/src\n1234:1234\n"; string(got.GetStdout()) != want {
		t.Errorf("user 1234, workdir /home/dev/src: stdout %q (stderr %q), want %q", got.GetStdout(), got.GetStderr(), want)
	}

	for _, bad := range []struct {
		req   *berthv1.CreateSandboxRequest
		field string
	}{
		{&berthv1.CreateSandboxRequest{User: "alice"}, "user"},
		{&berthv1.CreateSandboxRequest{Workdir: "rel/dir"}, "workdir"},
		{&berthv1.CreateSandboxRequest{Workdir: "/proc/x"}, "workdir"},
		{&berthv1.CreateSandboxRequest{Env: map[string]string{"A=B": "x"}}, "env"},
		{&berthv1.CreateSandboxRequest{IdleTimeout: durationpb.New(time.Millisecond)}, "idle_timeout"},
		{&berthv1.CreateSandboxRequest{MaxLifetime: durationpb.New(365 * 24 * time.Hour)}, "max_lifetime"},
		{&berthv1.CreateSandboxRequest{RequestId: "has space"}, "request_id"},
	} {
		bad.req.Image = env.image
		_, err := env.sandboxes.CreateSandbox(ctx, bad.req)
		if status.Code(err) != codes.InvalidArgument || errorMeta(err)["field"] != bad.field {
			t.Errorf("CreateSandbox(%v) = %v, want INVALID_ARGUMENT naming %s", bad.req, err, bad.field)
		}
	}
}

// TestLimitsHold runs a memory hog and a fork bomb in limited sandboxes:
// each is stopped by its limit while the sandbox and its agent live on.
func TestLimitsHold(t *testing.T) {
	need(t)
	t.Run("memory", func(t *testing.T) {
		sb := newSandbox(t, &berthv1.CreateSandboxRequest{Resources: &berthv1.Resources{MemoryBytes: 64 << 20}})
		// bash keeps the 200 MB string in memory: far beyond 64 MiB.
		got := run(t, sb.GetId(), "bash", "-c", `x=$(head -c 200000000 /dev/zero | tr '\0' a); echo ${#x}`)
		if got.GetResult().GetExitCode() == 0 || strings.Contains(string(got.GetStdout()), "200000000") {
			t.Errorf("200 MB in a 64 MiB sandbox: exit %d stdout %q; want it killed", got.GetResult().GetExitCode(), got.GetStdout())
		}
		assertAlive(t, sb)
	})
	t.Run("pids", func(t *testing.T) {
		const limit = 64
		sb := newSandbox(t, &berthv1.CreateSandboxRequest{Resources: &berthv1.Resources{PidsLimit: limit}})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		done := make(chan *berthv1.RunResponse, 1)
		go func() {
			// A fork bomb in bash, which retries a failed fork(2) with
			// back-off instead of giving up, so the bomb lasts until the
			// exec's timeout kills its process group.
			resp, err := env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: sb.GetId(), Process: &berthv1.ProcessSpec{
				ShellCommand: "bomb() { bomb | bomb; }; bomb", Shell: berthv1.Shell_SHELL_BASH, Timeout: durationpb.New(3 * time.Second)}})
			if err != nil {
				log, _ := os.ReadFile(env.rt.LogPath(sb.GetId()))
				t.Errorf("fork bomb Run: %v\nagent log:\n%s", err, log)
			}
			done <- resp
		}()
		var peak uint64
		var result *berthv1.RunResponse
	poll:
		for {
			select {
			case result = <-done:
				break poll
			case <-time.After(50 * time.Millisecond):
			}
			g, err := env.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: sb.GetId()})
			if err == nil {
				peak = max(peak, g.GetSandbox().GetUsage().GetPids())
			}
		}
		if result == nil {
			t.Fatal("fork bomb Run failed")
		}
		if !result.GetResult().GetTimedOut() {
			t.Errorf("fork bomb result = %v, want it ended by its 3s timeout", result.GetResult())
		}
		t.Logf("fork bomb: peak %d pids under a limit of %d, ended after %v", peak, limit, result.GetResult().GetDuration().AsDuration())
		// The cgroup's count includes the agent's threads, which have
		// runtime.AgentPidsReserve on top of the limit.
		if top := uint64(limit + runtime.AgentPidsReserve); peak > top || peak < limit/2 {
			t.Errorf("peak pids during the fork bomb = %d, want between %d and the limit %d + the agent's reserve %d", peak, limit/2, limit, runtime.AgentPidsReserve)
		}
		assertAlive(t, sb)
	})
}

// assertAlive checks that sb's agent is the one it was created with and
// still runs commands.
func assertAlive(t *testing.T, sb *berthv1.Sandbox) {
	t.Helper()
	got := run(t, sb.GetId(), "echo", "alive")
	if string(got.GetStdout()) != "alive\n" {
		t.Errorf("echo after the limit was hit: stdout %q stderr %q, want \"alive\\n\"", got.GetStdout(), got.GetStderr())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g, err := env.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: sb.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if g.GetSandbox().GetRuntime().GetAgentBootId() != sb.GetRuntime().GetAgentBootId() {
		t.Errorf("agent boot id %s after the limit was hit, want %s: the agent restarted", g.GetSandbox().GetRuntime().GetAgentBootId(), sb.GetRuntime().GetAgentBootId())
	}
}

// startDetached starts argv in the sandbox and drops the stream once the
// process runs: nothing but the running process keeps the sandbox busy.
func startDetached(t *testing.T, sandboxID string, argv ...string) {
	t.Helper()
	startDetachedIn(t, env.sandboxes, sandboxID, argv...)
}

// startDetachedIn is startDetached through sandboxes; it returns the
// exec's id.
func startDetachedIn(t testing.TB, sandboxes berthv1.SandboxServiceClient, sandboxID string, argv ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream, err := sandboxes.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&berthv1.ExecRequest{Event: &berthv1.ExecRequest_Start{Start: &berthv1.ExecStart{SandboxId: sandboxID, Process: &berthv1.ProcessSpec{Argv: argv}}}}); err != nil {
		t.Fatal(err)
	}
	msg, err := stream.Recv()
	if err != nil || msg.GetStarted().GetPid() == 0 {
		t.Fatalf("start %q: %v %v, want started with a pid", argv, msg, err)
	}
	return msg.GetStarted().GetExecId()
}

// TestIdleTimeout checks that an idle sandbox is removed after its idle
// timeout while one running a silent command longer than that survives
// until the command ends, and that KeepAlive holds a sandbox.
func TestIdleTimeout(t *testing.T) {
	need(t)
	const idle = 2 * time.Second
	mk := func() *berthv1.Sandbox {
		return newSandbox(t, &berthv1.CreateSandboxRequest{IdleTimeout: durationpb.New(idle)})
	}
	// Each sandbox's earliest possible removal is measured from before the
	// request that last made it active, its latest from after it.
	before := map[string]time.Time{}
	after := map[string]time.Time{}
	t0 := time.Now()
	idleSB := mk()
	before[idleSB.GetId()], after[idleSB.GetId()] = t0, time.Now()
	busySB, heldSB := mk(), mk()
	t0 = time.Now()
	startDetached(t, busySB.GetId(), "sleep", "6")
	before[busySB.GetId()], after[busySB.GetId()] = t0, time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t0 = time.Now()
	if _, err := env.sandboxes.KeepAlive(ctx, &berthv1.KeepAliveRequest{SandboxId: heldSB.GetId(), HoldFor: durationpb.New(4 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	before[heldSB.GetId()], after[heldSB.GetId()] = t0, time.Now()

	gone := map[string]time.Time{}
	deadline := time.Now().Add(30 * time.Second)
	for len(gone) < 3 && time.Now().Before(deadline) {
		for _, sb := range []*berthv1.Sandbox{idleSB, busySB, heldSB} {
			if _, ok := gone[sb.GetId()]; ok {
				continue
			}
			// GetSandbox itself is activity, so look in containerd.
			if _, err := env.rt.Get(ctx, sb.GetId()); err != nil {
				gone[sb.GetId()] = time.Now()
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The reaper checks every second; a removal takes a moment.
	const slack = 3 * time.Second
	check := func(name string, sb *berthv1.Sandbox, expiry time.Duration) {
		at, ok := gone[sb.GetId()]
		if !ok {
			t.Errorf("%s sandbox still exists 30s later", name)
			return
		}
		early, late := before[sb.GetId()].Add(expiry), after[sb.GetId()].Add(expiry+slack)
		t.Logf("%s sandbox removed %v after its expiry could start", name, at.Sub(early))
		if at.Before(early) || at.After(late) {
			t.Errorf("%s sandbox removed at %v, want between %v and %v", name, at, early, late)
		}
	}
	check("idle", idleSB, idle)
	check("busy (silent sleep 6)", busySB, 6*time.Second+idle)
	check("held (4s)", heldSB, 4*time.Second)
}

// TestMaxLifetime checks that a busy sandbox is stopped at its maximum
// lifetime.
func TestMaxLifetime(t *testing.T) {
	need(t)
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{MaxLifetime: durationpb.New(2 * time.Second)})
	startDetached(t, sb.GetId(), "sleep", "60")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g, err := env.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: sb.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if want := sb.GetCreatedAt().AsTime().Add(2 * time.Second); !g.GetSandbox().GetExpiresAt().AsTime().Equal(want) || g.GetSandbox().GetRunningExecs() != 1 {
		t.Errorf("GetSandbox: expires_at %v running_execs %d, want %v and 1", g.GetSandbox().GetExpiresAt().AsTime(), g.GetSandbox().GetRunningExecs(), want)
	}
	// Until its lifetime ends the sandbox runs, busy or not; then it is
	// STOPPING (MAX_LIFETIME) while berthd removes it, then gone.
	expires := sb.GetCreatedAt().AsTime().Add(2 * time.Second)
	var stoppingAt, goneAt time.Time
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		asked := time.Now()
		g, err := env.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: sb.GetId()})
		if status.Code(err) == codes.NotFound {
			goneAt = asked
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		state := g.GetSandbox().GetState()
		switch {
		case state == berthv1.SandboxState_SANDBOX_STATE_STOPPING && g.GetSandbox().GetStopReason() == berthv1.StopReason_STOP_REASON_MAX_LIFETIME:
			if stoppingAt.IsZero() {
				stoppingAt = asked
			}
		case state != berthv1.SandboxState_SANDBOX_STATE_RUNNING || !stoppingAt.IsZero():
			t.Fatalf("GetSandbox at %v after creation: state %v reason %v, want RUNNING, then STOPPING with MAX_LIFETIME, then gone",
				asked.Sub(sb.GetCreatedAt().AsTime()), state, g.GetSandbox().GetStopReason())
		}
	}
	if goneAt.IsZero() {
		t.Fatalf("sandbox with max_lifetime 2s still exists 15 s later")
	}
	if _, err := env.rt.Get(ctx, sb.GetId()); err == nil {
		t.Fatal("GetSandbox says NOT_FOUND but containerd still has the sandbox")
	}
	// The reaper checks every second (--reap-interval).
	if stoppingAt.IsZero() || stoppingAt.Before(expires) || goneAt.After(expires.Add(5*time.Second)) {
		t.Errorf("STOPPING seen at %v, gone at %v after creation; want STOPPING seen, not before the 2 s lifetime, and gone within 5 s of it",
			stoppingAt.Sub(sb.GetCreatedAt().AsTime()), goneAt.Sub(sb.GetCreatedAt().AsTime()))
	}
}

// TestImportCreateDeleteImage imports the base archive under a new name,
// creates a sandbox from it, deletes the image and checks that a create
// from it is then NOT_FOUND naming the reference.
func TestImportCreateDeleteImage(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := "berth.dev/imported-" + shortID("img") + ":v1"
	if err := importImageAs(ctx, archivePath(), name); err != nil {
		t.Fatal(err)
	}
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{Image: name})
	if got := run(t, sb.GetId(), "echo", "from", "import"); string(got.GetStdout()) != "from import\n" {
		t.Errorf("echo in a sandbox of the imported image: %q %q", got.GetStdout(), got.GetStderr())
	}
	if _, err := env.images.DeleteImage(ctx, &berthv1.DeleteImageRequest{Name: name}); err != nil {
		t.Fatalf("DeleteImage: %v", err)
	}
	list, err := env.images.ListImages(ctx, &berthv1.ListImagesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range list.GetImages() {
		if img.GetName() == name {
			t.Errorf("ListImages after DeleteImage still has %s", name)
		}
	}
	// The sandbox made from it runs on.
	if got := run(t, sb.GetId(), "true"); got.GetResult().GetExitCode() != 0 {
		t.Errorf("true after the image was deleted: %v", got.GetResult())
	}
	_, err = env.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: name})
	if status.Code(err) != codes.NotFound || rpcstatus.Reason(err) != rpcstatus.ReasonImageNotFound || !strings.Contains(status.Convert(err).Message(), name) {
		t.Errorf("CreateSandbox from a deleted image = %v, want NOT_FOUND %s naming %s", err, rpcstatus.ReasonImageNotFound, name)
	}
	_, err = env.images.DeleteImage(ctx, &berthv1.DeleteImageRequest{Name: name})
	if status.Code(err) != codes.NotFound {
		t.Errorf("second DeleteImage = %v, want NOT_FOUND", err)
	}
}

// importImageAs imports archive under name through the suite's berthd.
func importImageAs(ctx context.Context, archive, name string) error {
	return importImageTo(ctx, env.images, archive, name)
}

// importImageTo imports archive under name through images.
func importImageTo(ctx context.Context, images berthv1.ImageServiceClient, archive, name string) error {
	stream, err := images.ImportImage(ctx)
	if err != nil {
		return err
	}
	if err := stream.Send(&berthv1.ImportImageRequest{Part: &berthv1.ImportImageRequest_Header{Header: &berthv1.ImportImageHeader{Name: name}}}); err != nil {
		return err
	}
	b, err := os.ReadFile(archive)
	if err != nil {
		return err
	}
	for len(b) > 0 {
		n := min(len(b), 1<<20)
		if err := stream.Send(&berthv1.ImportImageRequest{Part: &berthv1.ImportImageRequest_Chunk{Chunk: b[:n]}}); err != nil {
			return err
		}
		b = b[n:]
	}
	_, err = stream.CloseAndRecv()
	return err
}

// recvAll reads a server stream to its end.
func recvAll[T any](recv func() (T, error)) ([]T, error) {
	var out []T
	for {
		m, err := recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, m)
	}
}

func archivePath() string {
	if p := os.Getenv("BERTH_TEST_IMAGE"); p != "" {
		return p
	}
	return filepath.Join(env.repo, "build", "base.oci.tar")
}
