package sandboxsvc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/sandboxid"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/admit"
	"github.com/berth-sandbox/berth/server/agentconn"
	"github.com/berth-sandbox/berth/server/agentreach"
	"github.com/berth-sandbox/berth/server/auth"
	"github.com/berth-sandbox/berth/server/lifecycle"
	"github.com/berth-sandbox/berth/server/network"
	"github.com/berth-sandbox/berth/server/runtime"
	"github.com/berth-sandbox/berth/server/runtimes"
	"github.com/berth-sandbox/berth/server/status"
)

// The handlers of this package run here on the real engines — the
// lifecycle Manager, the reacher, the registry, admission — over a fake
// containerd (fakeStore): no root, no containerd, no agent. What a
// handler decides about ownership and idempotency is decided for real.

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// fakeStore stands in for *runtime.Runtime: sandbox records in a map, as
// runtime.RecordOf makes them from a spec; no task runs.
type fakeStore struct {
	dir string

	mu        sync.Mutex
	sandboxes map[string]runtime.Sandbox
	images    map[string]bool
	holds     map[string]time.Time
	deleted   []string
	// frozen: what Pause and Resume left; onPause runs inside Pause, whose
	// freeze takes effect even when it then returns ctx's error (a reply
	// lost to the caller's cancel); snapFreeze makes CreateSnapshot call
	// its freeze.
	frozen     map[string]bool
	onPause    func()
	snapFreeze bool
	// committed are the CommitSnapshot calls that reached the store.
	committed []runtime.CommitOptions
	// hibernated are the sandboxes whose Hibernate reached the store.
	hibernated []string
}

func newFakeStore(t *testing.T) *fakeStore {
	return &fakeStore{dir: t.TempDir(), sandboxes: map[string]runtime.Sandbox{}, images: map[string]bool{"berth.dev/base:latest": true}, holds: map[string]time.Time{}, frozen: map[string]bool{}}
}

// put records a sandbox created from spec.
func (f *fakeStore) put(spec runtime.SandboxSpec) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sandboxes[spec.ID] = runtime.RecordOf(spec, time.Now())
}

func (f *fakeStore) has(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.sandboxes[id]
	return ok
}

func (f *fakeStore) Get(_ context.Context, id string) (runtime.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sandboxes[id]
	if !ok {
		return runtime.Sandbox{}, fmt.Errorf("%w: %s", runtime.ErrSandboxNotFound, id)
	}
	return sb, nil
}

// List filters by label as containerd's label filter does: the owner
// label among them.
func (f *fakeStore) List(_ context.Context, selector map[string]string) ([]runtime.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []runtime.Sandbox
	for _, sb := range f.sandboxes {
		ok := true
		for k, v := range selector {
			if k == runtime.LabelOwner {
				ok = ok && sb.Owner == v
			} else {
				ok = ok && sb.Labels[k] == v
			}
		}
		if ok {
			out = append(out, sb)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// testSnapshotID is the one snapshot fakeStore holds: alice's, of the base
// image.
const testSnapshotID = "snap-0123456789abcdef0123"

func (f *fakeStore) GetSnapshot(_ context.Context, id string) (runtime.Snapshot, error) {
	if id != testSnapshotID {
		return runtime.Snapshot{}, fmt.Errorf("%w: %s", runtime.ErrSnapshotNotFound, id)
	}
	return runtime.Snapshot{ID: id, Owner: "alice", Image: "berth.dev/base:latest"}, nil
}

func (f *fakeStore) CreateSnapshot(ctx context.Context, _, _ string, _ map[string]string, freeze func(context.Context) (func(), error)) (runtime.Snapshot, error) {
	if !f.snapFreeze {
		return runtime.Snapshot{}, runtime.ErrSnapshotUnsupported
	}
	thaw, err := freeze(ctx)
	if err != nil {
		return runtime.Snapshot{}, err
	}
	thaw()
	return runtime.Snapshot{ID: testSnapshotID}, nil
}

func (f *fakeStore) CommitSnapshot(_ context.Context, _ string, opts runtime.CommitOptions) (runtime.Commit, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.committed = append(f.committed, opts)
	return runtime.Commit{Image: runtime.Image{Name: opts.Ref}}, nil
}

func (f *fakeStore) SandboxDiskUsed(context.Context, string) (uint64, error) { return 0, nil }

func (f *fakeStore) ListSnapshots(context.Context, func(string) bool) ([]runtime.Snapshot, error) {
	return nil, nil
}

func (f *fakeStore) DeleteSnapshot(context.Context, string) error {
	return runtime.ErrSnapshotUnsupported
}

func (f *fakeStore) ForkSnapshot(context.Context, string, func(context.Context) (func(), error), func(string), *runtime.Phases) (string, func() error, error) {
	return "", nil, runtime.ErrSnapshotUnsupported
}

func (f *fakeStore) ForkMemory(string, string) (func() error, error) {
	return nil, runtime.ErrSnapshotUnsupported
}

func (f *fakeStore) ForkMemoryDir(string, string) string { return "" }

func (f *fakeStore) SandboxEnv(context.Context, string) (map[string]string, error) { return nil, nil }

// ImageUser knows the users of every image: root (0:0) and dev
// (1000:1000), group staff (50).
func (f *fakeStore) ImageUser(_ context.Context, ref, spec string) (uint32, uint32, error) {
	users := map[string][2]uint32{"root": {0, 0}, "dev": {1000, 1000}, "dev:staff": {1000, 50}}
	if ids, ok := users[spec]; ok {
		return ids[0], ids[1], nil
	}
	return 0, 0, fmt.Errorf("%w: %s is not in image %s's /etc/passwd", runtime.ErrUnknownUser, spec, ref)
}

func (f *fakeStore) ResolveImage(_ context.Context, ref string, _ runtime.ImageViewer) (string, error) {
	if !strings.Contains(ref, ":") {
		ref += ":latest"
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.images[ref] {
		return "", fmt.Errorf("%w: %s", runtime.ErrImageNotFound, ref)
	}
	return ref, nil
}

func (f *fakeStore) Delete(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.sandboxes, id)
	f.deleted = append(f.deleted, id)
	return nil
}

func (f *fakeStore) SetHoldUntil(_ context.Context, id string, until time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.holds[id] = until
	return nil
}

func (f *fakeStore) Promised(context.Context) (map[string]runtime.Promise, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]runtime.Promise{}
	for id, sb := range f.sandboxes {
		out[id] = runtime.Promise{Owner: sb.Owner, Pooled: sb.Pooled, MemoryBytes: sb.MemoryBytes, DiskBytes: sb.DiskBytes}
	}
	return out, nil
}

// held is what the fake store's sandboxes hold, for admission.
func (f *fakeStore) held(ctx context.Context) (map[string]admit.Held, error) {
	promised, _ := f.Promised(ctx)
	out := map[string]admit.Held{}
	for id, p := range promised {
		out[id] = admit.Held(p)
	}
	return out, nil
}

var errNoContainers = errors.New("the fake store makes no containers")

func (f *fakeStore) Create(context.Context, runtime.SandboxSpec) error { return errNoContainers }
func (f *fakeStore) Claim(context.Context, string, runtime.SandboxSpec) error {
	return errNoContainers
}
func (f *fakeStore) RestartTask(context.Context, string, uint32) (uint32, error) {
	return 0, errNoContainers
}
func (f *fakeStore) WaitExit(context.Context, string) (<-chan containerd.ExitStatus, error) {
	return nil, errNoContainers
}
func (f *fakeStore) MarkExpired(context.Context, string, string) error   { return nil }
func (f *fakeStore) ListImages(context.Context) ([]runtime.Image, error) { return nil, nil }

// TaskEvents keeps runtime.TaskEvents' contract with no events: when ctx
// ends, the error channel receives nil and both channels close.
func (f *fakeStore) TaskEvents(ctx context.Context) (<-chan runtime.TaskEvent, <-chan error) {
	events, errs := make(chan runtime.TaskEvent), make(chan error, 1)
	go func() {
		<-ctx.Done()
		errs <- nil
		close(errs)
		close(events)
	}()
	return events, errs
}
func (f *fakeStore) HostDirs() ([]string, error) { return nil, nil }
func (f *fakeStore) RemoveHostDir(string) error  { return nil }
func (f *fakeStore) SocketPath(id string) string { return f.dir + "/" + id + ".sock" }

func (f *fakeStore) ReclaimForkMemory(string) (int, error) { return 0, nil }
func (f *fakeStore) Pause(ctx context.Context, id string) error {
	f.mu.Lock()
	f.frozen[id] = true
	hook := f.onPause
	f.mu.Unlock()
	if hook != nil {
		hook()
	}
	return ctx.Err()
}

func (f *fakeStore) Hibernate(_ context.Context, id string, _ runtime.KeepMemory) (runtime.Hibernation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hibernated = append(f.hibernated, id)
	return runtime.Hibernation{Kept: runtime.HibernatedProcessesEnded}, nil
}

func (f *fakeStore) Woken(context.Context, string) error { return nil }

func (f *fakeStore) Resume(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.frozen[id] = false
	return nil
}

func (f *fakeStore) LogTail(string, int64) []byte        { return nil }
func (f *fakeStore) TrimLog(string, int64) (bool, error) { return false, nil }
func (f *fakeStore) CreateWorkLimit() time.Duration      { return time.Minute }
func (f *fakeStore) Ping(context.Context) error          { return nil }
func (f *fakeStore) PoolSpace() (runtime.PoolSpace, bool, error) {
	return runtime.PoolSpace{}, false, nil
}
func (f *fakeStore) Usage(context.Context, string) (runtime.Usage, error) {
	return runtime.Usage{}, errNoContainers
}
func (f *fakeStore) GVisorEnabled() bool { return true }
func (f *fakeStore) DiskQuota() error    { return nil }

// fakeNetwork is a sandbox network that exists: EGRESS requests validate.
type fakeNetwork struct{}

func (fakeNetwork) Start(context.Context, map[string]bool) error { return nil }
func (fakeNetwork) Attach(context.Context, string, network.Policy) (network.Attachment, error) {
	return network.Attachment{}, errNoContainers
}
func (fakeNetwork) Detach(context.Context, string) error { return nil }
func (fakeNetwork) Addr(string) (netip.Addr, bool)       { return netip.Addr{}, false }
func (fakeNetwork) Subnet() netip.Prefix                 { return netip.MustParsePrefix("10.88.0.0/24") }
func (fakeNetwork) Close()                               {}

type noObserver struct{}

func (noObserver) SandboxCreated(bool, time.Duration) {}
func (noObserver) AgentRestarted()                    {}

// newHandlers returns the handlers over real engines and a fake store.
func newHandlers(t *testing.T) (*Service, *fakeStore) {
	t.Helper()
	st := newFakeStore(t)
	ids := runtimes.NewRegistry("", discard)
	events := runtimes.NewTaskEvents(st, discard)
	agents := agentconn.NewPool(nil)
	t.Cleanup(agents.Close)
	reach := agentreach.New(agentreach.Config{ConnectBudget: time.Second, BusyLimit: time.Second, ServerVersion: "test"}, st, ids, agents, discard)
	cfg := withDefaults(Config{AllowHostUsers: true, ServerVersion: "test", NodeID: "node-1"})
	defaults := runtime.SandboxSpec{PidsLimit: cfg.DefaultPidsLimit, CPUMillis: uint64(cfg.DefaultCPUMillis), MemoryBytes: uint64(cfg.DefaultMemoryBytes),
		OpenFiles: cfg.DefaultOpenFiles, IdleTimeout: cfg.DefaultIdleTimeout, MaxLifetime: cfg.DefaultMaxLifetime}
	life := lifecycle.New(lifecycle.Config{AgentReadyTimeout: time.Second, ConnectBudget: time.Second, Defaults: defaults,
		Network: fakeNetwork{}, Observer: noObserver{}}, st, agents, reach, ids, events, admit.New(admit.Limits{}, nil, st.held), discard)
	t.Cleanup(life.Close)
	return New(cfg, st, life, reach, discard), st
}

var (
	alice = auth.Principal{Name: "alice"}
	bob   = auth.Principal{Name: "bob"}
	admin = auth.Principal{Name: "root", Admin: true}
)

func as(p auth.Principal) context.Context { return auth.NewContext(context.Background(), p) }

// answer is what a caller gets for err: its code, reason and ErrorInfo
// metadata, after the error boundary (server/status).
type answer struct {
	code   codes.Code
	reason string
	meta   map[string]string
}

func answerOf(err error) answer {
	if err == nil {
		return answer{code: codes.OK}
	}
	st := grpcstatus.Convert(status.Of(err))
	a := answer{code: st.Code()}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			a.reason, a.meta = info.GetReason(), info.GetMetadata()
		}
	}
	return a
}

// baseRequest sets every field of a CreateSandboxRequest to a value other
// than its default, so that a change of any one of them is a change.
func baseRequest(id string) *berthv1.CreateSandboxRequest {
	return &berthv1.CreateSandboxRequest{
		SandboxId: id,
		Image:     "berth.dev/base:latest",
		Labels:    map[string]string{"team": "a"},
		Env:       map[string]string{"A": "1"},
		Resources: &berthv1.Resources{PidsLimit: 100, CpuMillis: 500, MemoryBytes: 512 << 20, OpenFilesLimit: 256,
			DiskBytes: 64 << 20, ShmBytes: 8 << 20},
		User:        "1000:1000",
		Workdir:     "/work",
		IdleTimeout: durationpb.New(10 * time.Minute),
		MaxLifetime: durationpb.New(2 * time.Hour),
		Network:     &berthv1.NetworkPolicy{Mode: berthv1.NetworkMode_NETWORK_MODE_EGRESS, Allow: []string{"10.1.0.0/16:443"}, MaxConnections: 10, EgressBytesPerSecond: 1 << 20, IngressBytesPerSecond: 1 << 20},
		Runtime:     runtime.RuntimeRunc,
	}
}

// existing records the sandbox that req makes for p, as a create that
// finished would have left it.
func existing(t *testing.T, s *Service, st *fakeStore, req *berthv1.CreateSandboxRequest, p auth.Principal) runtime.SandboxSpec {
	t.Helper()
	spec, err := s.sandboxSpec(req, p.Name)
	if err != nil {
		t.Fatalf("sandboxSpec(%v) = %v", req, err)
	}
	st.put(spec)
	return spec
}

// TestCreateSandboxIdempotent: a CreateSandbox of an existing sandbox's
// id returns it when every field is the same, and is ALREADY_EXISTS naming
// the one field that differs for a change of any field of the request —
// each field of CreateSandboxRequest, Resources and NetworkPolicy is
// listed, or the test fails. Another principal's id is taken, with nothing
// said about the sandbox.
func TestCreateSandboxIdempotent(t *testing.T) {
	s, st := newHandlers(t)
	const id = "sb-idem"
	existing(t, s, st, baseRequest(id), alice)

	resp, err := s.CreateSandbox(as(alice), baseRequest(id))
	if err != nil || resp.GetSandbox().GetId() != id || resp.GetSandbox().GetOwner() != "alice" || resp.GetFromWarmPool() {
		t.Fatalf("the same request again = %v, %v; want the existing sandbox", resp, err)
	}
	if got := answerOf(func() error { _, err := s.CreateSandbox(as(bob), baseRequest(id)); return err }()); got.code != codes.AlreadyExists ||
		got.reason != rpcstatus.ReasonSandboxExists || got.meta["fields"] != "" {
		t.Errorf("another principal's id: %+v, want ALREADY_EXISTS without the differing fields", got)
	}

	// Each case changes one request field (by its path); want is the field
	// the conflict names (specDiff's words).
	cases := []struct {
		path   string
		change func(*berthv1.CreateSandboxRequest)
		want   string
	}{
		{"image", func(r *berthv1.CreateSandboxRequest) { r.Image = "berth.dev/other:v2" }, "image"},
		{"labels", func(r *berthv1.CreateSandboxRequest) { r.Labels = map[string]string{"team": "b"} }, "labels"},
		{"env", func(r *berthv1.CreateSandboxRequest) { r.Env = map[string]string{"A": "2"} }, "env"},
		{"resources.pids_limit", func(r *berthv1.CreateSandboxRequest) { r.Resources.PidsLimit = 200 }, "resources.pids_limit"},
		{"resources.cpu_millis", func(r *berthv1.CreateSandboxRequest) { r.Resources.CpuMillis = 700 }, "resources.cpu_millis"},
		{"resources.memory_bytes", func(r *berthv1.CreateSandboxRequest) { r.Resources.MemoryBytes = 256 << 20 }, "resources.memory_bytes"},
		{"resources.open_files_limit", func(r *berthv1.CreateSandboxRequest) { r.Resources.OpenFilesLimit = 512 }, "resources.open_files_limit"},
		{"resources.disk_bytes", func(r *berthv1.CreateSandboxRequest) { r.Resources.DiskBytes = 128 << 20 }, "resources.disk_bytes"},
		{"resources.shm_bytes", func(r *berthv1.CreateSandboxRequest) { r.Resources.ShmBytes = 16 << 20 }, "resources.shm_bytes"},
		{"user", func(r *berthv1.CreateSandboxRequest) { r.User = "1001:1000" }, "user"},
		{"workdir", func(r *berthv1.CreateSandboxRequest) { r.Workdir = "/other" }, "workdir"},
		{"idle_timeout", func(r *berthv1.CreateSandboxRequest) { r.IdleTimeout = durationpb.New(20 * time.Minute) }, "idle_timeout"},
		{"max_lifetime", func(r *berthv1.CreateSandboxRequest) { r.MaxLifetime = durationpb.New(3 * time.Hour) }, "max_lifetime"},
		{"network.mode", func(r *berthv1.CreateSandboxRequest) { r.Network = nil }, "network"},
		{"network.allow", func(r *berthv1.CreateSandboxRequest) { r.Network.Allow = []string{"10.2.0.0/16:443"} }, "network"},
		{"network.max_connections", func(r *berthv1.CreateSandboxRequest) { r.Network.MaxConnections = 20 }, "network"},
		{"network.egress_bytes_per_second", func(r *berthv1.CreateSandboxRequest) { r.Network.EgressBytesPerSecond = 2 << 20 }, "network"},
		{"network.ingress_bytes_per_second", func(r *berthv1.CreateSandboxRequest) { r.Network.IngressBytesPerSecond = 2 << 20 }, "network"},
		{"idle_action", func(r *berthv1.CreateSandboxRequest) { r.IdleAction = berthv1.IdleAction_IDLE_ACTION_PAUSE }, "idle_action"},
		{"runtime", func(r *berthv1.CreateSandboxRequest) { r.Runtime = runtime.RuntimeGVisor }, "runtime"},
		{"host_users", func(r *berthv1.CreateSandboxRequest) { r.HostUsers = true }, "host_users"},
		{"from_snapshot", func(r *berthv1.CreateSandboxRequest) { r.FromSnapshot = testSnapshotID }, "from_snapshot"},
		{"volumes.name", func(r *berthv1.CreateSandboxRequest) {
			r.Volumes = []*berthv1.VolumeMount{{Name: "data", Path: "/data"}}
		}, "volumes"},
		{"volumes.path", func(r *berthv1.CreateSandboxRequest) {
			r.Volumes = []*berthv1.VolumeMount{{Name: "data", Path: "/other"}}
		}, "volumes"},
		{"volumes.read_only", func(r *berthv1.CreateSandboxRequest) {
			r.Volumes = []*berthv1.VolumeMount{{Name: "data", Path: "/data", ReadOnly: true}}
		}, "volumes"},
	}
	// Fields that are not part of a sandbox's spec, and why.
	notSpec := map[string]string{
		"sandbox_id": "the id itself: another id is another sandbox",
		"request_id": "ignored beside sandbox_id; without it, it derives the id (TestCreateSandboxRequestID)",
	}
	covered := map[string]bool{}
	for _, c := range cases {
		covered[c.path] = true
		t.Run(c.path, func(t *testing.T) {
			req := baseRequest(id)
			c.change(req)
			_, err := s.CreateSandbox(as(alice), req)
			if got := answerOf(err); got.code != codes.AlreadyExists || got.reason != rpcstatus.ReasonSandboxExists || got.meta["fields"] != c.want {
				t.Errorf("a request differing in %s: %+v (%v), want ALREADY_EXISTS naming %q", c.path, got, err, c.want)
			}
		})
	}
	var walk func(prefix string, md protoreflect.MessageDescriptor)
	walk = func(prefix string, md protoreflect.MessageDescriptor) {
		for i := range md.Fields().Len() {
			f := md.Fields().Get(i)
			path := prefix + string(f.Name())
			if f.Kind() == protoreflect.MessageKind && !f.IsMap() && f.Message().FullName() != "google.protobuf.Duration" {
				walk(path+".", f.Message())
				continue
			}
			if !covered[path] && notSpec[path] == "" {
				t.Errorf("CreateSandboxRequest field %s has no idempotency case: add one (or say in notSpec why it is not part of the spec)", path)
			}
		}
	}
	walk("", (&berthv1.CreateSandboxRequest{}).ProtoReflect().Descriptor())
	if st.has("sb-other") || len(st.deleted) != 0 {
		t.Errorf("conflicts changed the store: deleted %v", st.deleted)
	}
}

// TestCreateSandboxRequestID: request_id derives the sandbox id from the
// caller and the key, so a retry finds the sandbox and another principal's
// same key is another sandbox.
func TestCreateSandboxRequestID(t *testing.T) {
	s, st := newHandlers(t)
	req := baseRequest("")
	req.RequestId = "retry-key-1"
	spec := existing(t, s, st, req, alice)
	if want := sandboxid.FromRequest("alice", "retry-key-1"); spec.ID != want {
		t.Fatalf("derived id %q, want %q", spec.ID, want)
	}
	resp, err := s.CreateSandbox(as(alice), req)
	if err != nil || resp.GetSandbox().GetId() != spec.ID {
		t.Fatalf("a retry with the same request_id = %v, %v; want sandbox %s", resp, err, spec.ID)
	}
	bobSpec, err := s.sandboxSpec(req, "bob")
	if err != nil || bobSpec.ID == spec.ID {
		t.Errorf("bob's spec for the same key: id %q, %v; want another id than alice's %q", bobSpec.ID, err, spec.ID)
	}
}

// TestCreateSandboxUserName: a user name resolves against the image to the
// ids the sandbox keeps, so a create by name of a sandbox created by those
// ids (and the other way round) returns it, and another user is a
// conflict naming user.
func TestCreateSandboxUserName(t *testing.T) {
	s, st := newHandlers(t)
	req := baseRequest("sb-named")
	req.User = "1000:50"
	existing(t, s, st, req, alice)
	for _, user := range []string{"dev:staff", "1000:50"} {
		req.User = user
		if resp, err := s.CreateSandbox(as(alice), req); err != nil || resp.GetSandbox().GetUser() != "1000:50" {
			t.Errorf("create of sb-named (1000:50) again as %s = %v, %v; want it back", user, resp, err)
		}
	}
	req.User = "dev"
	_, err := s.CreateSandbox(as(alice), req)
	if got := answerOf(err); got.code != codes.AlreadyExists || got.meta["fields"] != "user" {
		t.Errorf("create of sb-named (1000:50) as dev (1000:1000) = %v, want ALREADY_EXISTS naming user", err)
	}
}

// TestCreateSandboxRefuses: bad requests are INVALID_ARGUMENT naming the
// field, and a request without a principal is UNAUTHENTICATED; nothing is
// created.
func TestCreateSandboxRefuses(t *testing.T) {
	s, st := newHandlers(t)
	for _, c := range []struct {
		name  string
		ctx   context.Context
		req   *berthv1.CreateSandboxRequest
		code  codes.Code
		field string
	}{
		{"no principal", context.Background(), baseRequest("sb-x"), codes.Unauthenticated, ""},
		{"bad id", as(alice), baseRequest("Not_An_Id"), codes.InvalidArgument, "sandbox_id"},
		{"no image", as(alice), func() *berthv1.CreateSandboxRequest { r := baseRequest("sb-x"); r.Image = ""; return r }(), codes.InvalidArgument, "image"},
		{"reserved label", as(alice), func() *berthv1.CreateSandboxRequest {
			r := baseRequest("sb-x")
			r.Labels = map[string]string{runtime.LabelOwner: "bob"}
			return r
		}(), codes.InvalidArgument, "labels"},
		{"unknown user name", as(alice), func() *berthv1.CreateSandboxRequest { r := baseRequest("sb-x"); r.User = "nosuch"; return r }(), codes.InvalidArgument, "user"},
		{"user name with a slash", as(alice), func() *berthv1.CreateSandboxRequest { r := baseRequest("sb-x"); r.User = "dev/x"; return r }(), codes.InvalidArgument, "user"},
		{"user name with an empty group", as(alice), func() *berthv1.CreateSandboxRequest { r := baseRequest("sb-x"); r.User = "dev:"; return r }(), codes.InvalidArgument, "user"},
		{"relative workdir", as(alice), func() *berthv1.CreateSandboxRequest { r := baseRequest("sb-x"); r.Workdir = "work"; return r }(), codes.InvalidArgument, "workdir"},
		{"idle timeout too long", as(alice), func() *berthv1.CreateSandboxRequest {
			r := baseRequest("sb-x")
			r.IdleTimeout = durationpb.New(25 * time.Hour)
			return r
		}(), codes.InvalidArgument, "idle_timeout"},
		{"allow-list without EGRESS", as(alice), func() *berthv1.CreateSandboxRequest {
			r := baseRequest("sb-x")
			r.Network.Mode = berthv1.NetworkMode_NETWORK_MODE_NONE
			return r
		}(), codes.InvalidArgument, "network.allow"},
		{"unknown runtime", as(alice), func() *berthv1.CreateSandboxRequest { r := baseRequest("sb-x"); r.Runtime = "kata"; return r }(), codes.InvalidArgument, "runtime"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := s.CreateSandbox(c.ctx, c.req)
			got := answerOf(err)
			if got.code != c.code || (c.field != "" && got.meta["field"] != c.field) {
				t.Errorf("CreateSandbox = %+v (%v), want %v naming %q", got, err, c.code, c.field)
			}
		})
	}
	if st.has("sb-x") {
		t.Error("a refused request left a sandbox")
	}
}

// TestGetSandbox: a caller sees its own sandboxes, an admin every one;
// another principal's sandbox and an unclaimed warm-pool member are
// NOT_FOUND in the same words as a missing one.
func TestGetSandbox(t *testing.T) {
	s, st := newHandlers(t)
	spec := existing(t, s, st, baseRequest("sb-get"), alice)
	st.put(runtime.SandboxSpec{ID: "sb-pooled", Image: "berth.dev/base:latest", Pooled: true})
	missing := answerOf(func() error {
		_, err := s.GetSandbox(as(alice), &berthv1.GetSandboxRequest{SandboxId: "sb-missing"})
		return err
	}())
	for _, c := range []struct {
		p    auth.Principal
		id   string
		code codes.Code
	}{
		{alice, "sb-get", codes.OK},
		{admin, "sb-get", codes.OK},
		{bob, "sb-get", codes.NotFound},
		{alice, "sb-pooled", codes.NotFound},
		{alice, "sb-missing", codes.NotFound},
		{alice, "SB GET", codes.InvalidArgument},
	} {
		resp, err := s.GetSandbox(as(c.p), &berthv1.GetSandboxRequest{SandboxId: c.id})
		got := answerOf(err)
		if got.code != c.code {
			t.Errorf("GetSandbox(%s) as %s = %+v, want %v", c.id, c.p.Name, got, c.code)
			continue
		}
		if c.code == codes.NotFound && (got.reason != missing.reason || got.meta["sandbox_id"] != c.id) {
			t.Errorf("GetSandbox(%s) as %s = %+v, want the answer for a missing sandbox (%+v)", c.id, c.p.Name, got, missing)
		}
		if c.code == codes.OK {
			sb := resp.GetSandbox()
			if sb.GetId() != spec.ID || sb.GetOwner() != "alice" || sb.GetImage() != spec.Image || sb.GetNodeId() != "node-1" ||
				sb.GetState() != berthv1.SandboxState_SANDBOX_STATE_STOPPED || sb.GetResources().GetMemoryBytes() != spec.MemoryBytes ||
				sb.GetNetwork().GetMode() != berthv1.NetworkMode_NETWORK_MODE_EGRESS || !slices.Equal(sb.GetEnvKeys(), []string{"A"}) {
				t.Errorf("GetSandbox(%s) = %v, want the record of %+v", c.id, sb, spec)
			}
		}
	}
}

// TestListSandboxes: a caller lists its own sandboxes in id order, an
// admin all; warm-pool members are never listed; pages follow the token.
func TestListSandboxes(t *testing.T) {
	s, st := newHandlers(t)
	for _, sb := range []struct {
		id string
		p  auth.Principal
	}{{"sb-a2", alice}, {"sb-a1", alice}, {"sb-b1", bob}} {
		existing(t, s, st, baseRequest(sb.id), sb.p)
	}
	st.put(runtime.SandboxSpec{ID: "sb-pool", Image: "berth.dev/base:latest", Pooled: true})
	ids := func(resp *berthv1.ListSandboxesResponse) []string {
		var out []string
		for _, sb := range resp.GetSandboxes() {
			out = append(out, sb.GetId())
		}
		return out
	}
	for _, c := range []struct {
		p    auth.Principal
		req  *berthv1.ListSandboxesRequest
		want []string
		next bool
		code codes.Code
	}{
		{alice, &berthv1.ListSandboxesRequest{}, []string{"sb-a1", "sb-a2"}, false, codes.OK},
		{bob, &berthv1.ListSandboxesRequest{}, []string{"sb-b1"}, false, codes.OK},
		{admin, &berthv1.ListSandboxesRequest{}, []string{"sb-a1", "sb-a2", "sb-b1"}, false, codes.OK},
		{admin, &berthv1.ListSandboxesRequest{LabelSelector: map[string]string{"team": "b"}}, nil, false, codes.OK},
		{alice, &berthv1.ListSandboxesRequest{PageSize: 1}, []string{"sb-a1"}, true, codes.OK},
		{alice, &berthv1.ListSandboxesRequest{PageSize: 1001}, nil, false, codes.InvalidArgument},
		{alice, &berthv1.ListSandboxesRequest{PageToken: "%%%"}, nil, false, codes.InvalidArgument},
	} {
		resp, err := s.ListSandboxes(as(c.p), c.req)
		if got := answerOf(err); got.code != c.code {
			t.Errorf("ListSandboxes(%v) as %s = %+v, want %v", c.req, c.p.Name, got, c.code)
			continue
		}
		if got := ids(resp); !slices.Equal(got, c.want) || (resp.GetNextPageToken() != "") != c.next {
			t.Errorf("ListSandboxes(%v) as %s = %v next %q, want %v (next page: %v)", c.req, c.p.Name, got, resp.GetNextPageToken(), c.want, c.next)
		}
		if c.next {
			page2, err := s.ListSandboxes(as(c.p), &berthv1.ListSandboxesRequest{PageSize: 1, PageToken: resp.GetNextPageToken()})
			if got := ids(page2); err != nil || !slices.Equal(got, []string{"sb-a2"}) {
				t.Errorf("the next page = %v, %v; want [sb-a2]", got, err)
			}
		}
	}
}

// TestDeleteSandbox: the owner and an admin remove a sandbox; another
// principal's delete answers as for a missing sandbox and leaves it
// untouched; a missing sandbox is no error.
func TestDeleteSandbox(t *testing.T) {
	for _, c := range []struct {
		p       auth.Principal
		id      string
		code    codes.Code
		removed bool
	}{
		{alice, "sb-del", codes.OK, true},
		{admin, "sb-del", codes.OK, true},
		{bob, "sb-del", codes.OK, false},
		{alice, "sb-missing", codes.OK, false},
		{alice, "Bad_Id", codes.InvalidArgument, false},
	} {
		t.Run(c.p.Name+"/"+c.id, func(t *testing.T) {
			s, st := newHandlers(t)
			existing(t, s, st, baseRequest("sb-del"), alice)
			_, err := s.DeleteSandbox(as(c.p), &berthv1.DeleteSandboxRequest{SandboxId: c.id})
			if got := answerOf(err); got.code != c.code {
				t.Errorf("DeleteSandbox = %+v, want %v", got, c.code)
			}
			if st.has("sb-del") == c.removed {
				t.Errorf("after %s's delete of %s the sandbox exists: %v, want %v", c.p.Name, c.id, st.has("sb-del"), !c.removed)
			}
			if !c.removed && len(st.deleted) != 0 {
				t.Errorf("containerd was asked to delete %v", st.deleted)
			}
		})
	}
	s, _ := newHandlers(t)
	if _, err := s.DeleteSandbox(context.Background(), &berthv1.DeleteSandboxRequest{SandboxId: "sb-del"}); answerOf(err).code != codes.Unauthenticated {
		t.Errorf("DeleteSandbox without a principal = %v, want UNAUTHENTICATED", err)
	}
}

// TestKeepAlive: hold_for is bounded by the server's maximum idle timeout
// and stored on the sandbox's record; another principal's sandbox is
// NOT_FOUND and keeps no hold.
func TestKeepAlive(t *testing.T) {
	s, st := newHandlers(t)
	existing(t, s, st, baseRequest("sb-keep"), alice)
	for _, c := range []struct {
		p     auth.Principal
		hold  *durationpb.Duration
		code  codes.Code
		field string
		held  bool
	}{
		{alice, nil, codes.OK, "", false},
		{alice, durationpb.New(-time.Second), codes.InvalidArgument, "hold_for", false},
		{alice, durationpb.New(25 * time.Hour), codes.InvalidArgument, "hold_for", false},
		{bob, durationpb.New(time.Hour), codes.NotFound, "", false},
		{alice, durationpb.New(time.Hour), codes.OK, "", true},
	} {
		before := time.Now()
		_, err := s.KeepAlive(as(c.p), &berthv1.KeepAliveRequest{SandboxId: "sb-keep", HoldFor: c.hold})
		got := answerOf(err)
		if got.code != c.code || got.meta["field"] != c.field {
			t.Errorf("KeepAlive(%v) as %s = %+v, want %v naming %q", c.hold, c.p.Name, got, c.code, c.field)
		}
		st.mu.Lock()
		until, held := st.holds["sb-keep"]
		st.mu.Unlock()
		if held != c.held || (held && (until.Before(before.Add(time.Hour)) || until.After(time.Now().Add(time.Hour)))) {
			t.Errorf("KeepAlive(%v) as %s: hold %v (%v), want held %v for an hour", c.hold, c.p.Name, until, held, c.held)
		}
	}
}

// TestCreateSandboxFromSnapshotChecks: from_snapshot must be a snapshot id
// (refused naming from_snapshot, also without an image: it once said
// "image: is empty"), the caller's, and image (when set) the snapshot's.
func TestCreateSandboxFromSnapshotChecks(t *testing.T) {
	s, _ := newHandlers(t)
	for _, c := range []struct {
		name   string
		who    auth.Principal
		req    *berthv1.CreateSandboxRequest
		code   codes.Code
		reason string
		field  string
	}{
		{"not an id", alice, &berthv1.CreateSandboxRequest{FromSnapshot: "nope"}, codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "from_snapshot"},
		{"a path", alice, &berthv1.CreateSandboxRequest{FromSnapshot: "../x", Image: "berth.dev/base:latest"}, codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "from_snapshot"},
		{"another principal's", bob, &berthv1.CreateSandboxRequest{FromSnapshot: testSnapshotID}, codes.NotFound, rpcstatus.ReasonSnapshotNotFound, ""},
		{"missing", alice, &berthv1.CreateSandboxRequest{FromSnapshot: "snap-ffffffffffffffffffff"}, codes.NotFound, rpcstatus.ReasonSnapshotNotFound, ""},
		{"another image", alice, &berthv1.CreateSandboxRequest{FromSnapshot: testSnapshotID, Image: "berth.dev/other:v2"}, codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "image"},
	} {
		_, err := s.CreateSandbox(as(c.who), c.req)
		if got := answerOf(err); got.code != c.code || got.reason != c.reason || got.meta["field"] != c.field {
			t.Errorf("%s: %+v (%v), want %v %s naming %q", c.name, got, err, c.code, c.reason, c.field)
		}
	}
}

// TestCreateSandboxFromSnapshotImageGone: a snapshot whose image was
// deleted from the store is NOT_FOUND IMAGE_NOT_FOUND on a create from it
// (docs/state.md "Kept"), with image empty or named: it was INVALID_ARGUMENT
// "image is not the snapshot's image", which told the caller to change a
// request that was right.
func TestCreateSandboxFromSnapshotImageGone(t *testing.T) {
	s, st := newHandlers(t)
	st.mu.Lock()
	delete(st.images, "berth.dev/base:latest")
	st.mu.Unlock()
	for _, image := range []string{"", "berth.dev/base", "berth.dev/base:latest"} {
		_, err := s.CreateSandbox(as(alice), &berthv1.CreateSandboxRequest{FromSnapshot: testSnapshotID, Image: image})
		if got := answerOf(err); got.code != codes.NotFound || got.reason != rpcstatus.ReasonImageNotFound {
			t.Errorf("image %q: %+v (%v), want NOT_FOUND %s", image, got, err, rpcstatus.ReasonImageNotFound)
		}
	}
}

// TestCreateSnapshotLabelsFit: labels a sandbox may carry but a snapshot
// cannot store (one containerd label of at most 4096 bytes holds them all
// as JSON) are INVALID_ARGUMENT naming labels before anything is done:
// they failed containerd's Commit after the sandbox had been paused and
// snapshotted. Characters JSON could escape (<, >, &) count once.
func TestCreateSnapshotLabelsFit(t *testing.T) {
	s, st := newHandlers(t)
	ctx := as(alice)
	id := "sb-labelled"
	st.put(runtime.SandboxSpec{ID: id, Image: "berth.dev/base:latest", Owner: "alice"})
	for _, c := range []struct {
		name   string
		labels map[string]string
		bad    bool
	}{
		{"one long value", map[string]string{"k": strings.Repeat("v", 4090)}, true},
		{"three values that fit a sandbox", map[string]string{"a": strings.Repeat("v", 2000), "b": strings.Repeat("v", 2000), "c": strings.Repeat("v", 2000)}, true},
		{"angle brackets", map[string]string{"k": strings.Repeat("<", 3000)}, false},
	} {
		_, err := s.CreateSnapshot(ctx, &berthv1.CreateSnapshotRequest{SandboxId: id, Labels: c.labels})
		got := answerOf(err)
		if isBad := got.code == codes.InvalidArgument && got.meta["field"] == "labels"; isBad != c.bad {
			t.Errorf("%s: %+v (%v), want INVALID_ARGUMENT labels: %v", c.name, got, err, c.bad)
		}
	}
}

// TestForkSandboxBounds: a count outside 1-16, an overlong request_id and a
// malformed sandbox id are INVALID_ARGUMENT naming the field before the
// sandbox is looked at; another principal's sandbox is NOT_FOUND.
func TestForkSandboxBounds(t *testing.T) {
	s, st := newHandlers(t)
	id := "sb-forked"
	st.put(runtime.SandboxSpec{ID: id, Image: "berth.dev/base:latest", Owner: "alice"})
	for _, c := range []struct {
		name  string
		req   *berthv1.ForkSandboxRequest
		field string
	}{
		{"count 0", &berthv1.ForkSandboxRequest{SandboxId: id}, "count"},
		{"count 17", &berthv1.ForkSandboxRequest{SandboxId: id, Count: 17}, "count"},
		{"request_id too long", &berthv1.ForkSandboxRequest{SandboxId: id, Count: 1, RequestId: strings.Repeat("r", 129)}, "request_id"},
		{"bad sandbox_id", &berthv1.ForkSandboxRequest{SandboxId: "no/such", Count: 1}, "sandbox_id"},
		{"bad label", &berthv1.ForkSandboxRequest{SandboxId: id, Count: 1, Labels: map[string]string{"": "v"}}, "labels"},
	} {
		_, err := s.ForkSandbox(as(alice), c.req)
		if got := answerOf(err); got.code != codes.InvalidArgument || got.meta["field"] != c.field {
			t.Errorf("%s: %+v (%v), want INVALID_ARGUMENT %s", c.name, got, err, c.field)
		}
	}
	_, err := s.ForkSandbox(as(bob), &berthv1.ForkSandboxRequest{SandboxId: id, Count: 1})
	if got := answerOf(err); got.code != codes.NotFound {
		t.Errorf("bob's fork of alice's sandbox: %+v (%v), want NOT_FOUND", got, err)
	}
}

// TestFreezeOthersSandbox: another principal's PauseSandbox, ResumeSandbox
// and HibernateSandbox of a sandbox are NOT_FOUND, as for a sandbox that
// does not exist, and never reach the runtime: the sandbox is neither
// frozen nor hibernated. Its owner's HibernateSandbox reaches it.
func TestFreezeOthersSandbox(t *testing.T) {
	s, st := newHandlers(t)
	id := "sb-alices"
	st.put(runtime.SandboxSpec{ID: id, Image: "berth.dev/base:latest", Owner: "alice"})
	calls := map[string]func() error{
		"PauseSandbox": func() error {
			_, err := s.PauseSandbox(as(bob), &berthv1.PauseSandboxRequest{SandboxId: id})
			return err
		},
		"ResumeSandbox": func() error {
			_, err := s.ResumeSandbox(as(bob), &berthv1.ResumeSandboxRequest{SandboxId: id})
			return err
		},
		"HibernateSandbox": func() error {
			_, err := s.HibernateSandbox(as(bob), &berthv1.HibernateSandboxRequest{SandboxId: id})
			return err
		},
	}
	for name, call := range calls {
		if got := answerOf(call()); got.code != codes.NotFound || got.reason != rpcstatus.ReasonSandboxNotFound {
			t.Errorf("bob's %s of alice's sandbox: %+v, want NOT_FOUND SANDBOX_NOT_FOUND", name, got)
		}
	}
	st.mu.Lock()
	frozen, hibernated := st.frozen[id], st.hibernated
	st.mu.Unlock()
	if frozen || len(hibernated) != 0 {
		t.Errorf("after bob's calls: frozen %v, hibernated %v; want neither", frozen, hibernated)
	}
	if _, err := s.HibernateSandbox(as(alice), &berthv1.HibernateSandboxRequest{SandboxId: id}); err != nil {
		t.Fatalf("alice's HibernateSandbox of her sandbox: %v", err)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.hibernated) != 1 || st.hibernated[0] != id {
		t.Errorf("after alice's HibernateSandbox the store hibernated %v, want [%s]", st.hibernated, id)
	}
}

// TestCreateSnapshotCancelDuringPause: a caller that goes away while
// CreateSnapshot pauses its sandbox leaves the sandbox running: the pause
// may have frozen the task before its reply was lost to the cancel, and
// nothing resumed it (berthd did not know it paused).
func TestCreateSnapshotCancelDuringPause(t *testing.T) {
	s, st := newHandlers(t)
	id := "sb-snapped"
	st.put(runtime.SandboxSpec{ID: id, Image: "berth.dev/base:latest", Owner: "alice"})
	ctx, cancel := context.WithCancel(as(alice))
	defer cancel()
	st.mu.Lock()
	st.snapFreeze, st.onPause = true, cancel
	st.mu.Unlock()
	_, err := s.CreateSnapshot(ctx, &berthv1.CreateSnapshotRequest{SandboxId: id})
	if got := answerOf(err); got.code != codes.Canceled {
		t.Errorf("CreateSnapshot cancelled during its pause: %v, want CANCELED", err)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.frozen[id] {
		t.Errorf("sandbox %s left frozen by a CreateSnapshot cancelled during its pause", id)
	}
}

// TestCommitSnapshotChecks: CommitSnapshot's refusals before containerd:
// malformed snapshot ids, references and config changes are
// INVALID_ARGUMENT, replace by a principal that is not an admin is
// PERMISSION_DENIED, another principal's snapshot NOT_FOUND; the owner the
// store records is the caller.
func TestCommitSnapshotChecks(t *testing.T) {
	s, st := newHandlers(t)
	admin := auth.Principal{Name: "ops", Admin: true}
	req := func(mod func(*berthv1.CommitSnapshotRequest)) *berthv1.CommitSnapshotRequest {
		r := &berthv1.CommitSnapshotRequest{SnapshotId: testSnapshotID, Reference: "tools/py:v2"}
		mod(r)
		return r
	}
	for _, c := range []struct {
		name  string
		who   auth.Principal
		req   *berthv1.CommitSnapshotRequest
		code  codes.Code
		field string
	}{
		{"not an id", alice, req(func(r *berthv1.CommitSnapshotRequest) { r.SnapshotId = "nope" }), codes.InvalidArgument, "snapshot_id"},
		{"no reference", alice, req(func(r *berthv1.CommitSnapshotRequest) { r.Reference = "" }), codes.InvalidArgument, "reference"},
		{"upper case", alice, req(func(r *berthv1.CommitSnapshotRequest) { r.Reference = "tools/Py" }), codes.InvalidArgument, "reference"},
		{"env without =", alice, req(func(r *berthv1.CommitSnapshotRequest) {
			r.Changes = &berthv1.ImageConfigChanges{Env: []string{"A=1", "NOVALUE"}}
		}), codes.InvalidArgument, "changes.env"},
		{"env without key", alice, req(func(r *berthv1.CommitSnapshotRequest) { r.Changes = &berthv1.ImageConfigChanges{Env: []string{"=1"}} }), codes.InvalidArgument, "changes.env"},
		{"relative working_dir", alice, req(func(r *berthv1.CommitSnapshotRequest) { r.Changes = &berthv1.ImageConfigChanges{WorkingDir: "src"} }), codes.InvalidArgument, "changes.working_dir"},
		{"replace, not an admin", alice, req(func(r *berthv1.CommitSnapshotRequest) { r.Replace = true }), codes.PermissionDenied, ""},
		{"another principal's", bob, req(func(*berthv1.CommitSnapshotRequest) {}), codes.NotFound, ""},
		{"missing", alice, req(func(r *berthv1.CommitSnapshotRequest) { r.SnapshotId = "snap-ffffffffffffffffffff" }), codes.NotFound, ""},
		{"alice's own", alice, req(func(*berthv1.CommitSnapshotRequest) {}), codes.OK, ""},
		{"replace by an admin", admin, req(func(r *berthv1.CommitSnapshotRequest) { r.Replace = true }), codes.OK, ""},
	} {
		_, err := s.CommitSnapshot(as(c.who), c.req)
		got := answerOf(err)
		if got.code != c.code {
			t.Errorf("%s: %+v (%v), want %v", c.name, got, err, c.code)
		}
		if c.field != "" && !strings.Contains(fmt.Sprint(err), c.field) {
			t.Errorf("%s: %v does not name %s", c.name, err, c.field)
		}
	}
	if len(st.committed) != 2 || st.committed[0].Owner != "alice" || st.committed[1].Owner != "ops" || !st.committed[1].Replace {
		t.Errorf("commits that reached the store: %+v, want alice's, then ops's replace", st.committed)
	}
}
