// Package agentreach reaches a sandbox's agent before anything is sent to
// it, and tells a busy agent from an unreachable one: a stopped task, a
// missing socket, a stopped, hung or overloaded agent, or a listener that
// is not the sandbox's agent are *apierr.Unreachable with nothing sent,
// within the connect budget (server.Config.ConnectBudget, AgentBusyLimit).
package agentreach

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"

	"github.com/berth-sandbox/berth/internal/procfs"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/server/agentconn"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/auth"
	"github.com/berth-sandbox/berth/server/runtime"
	"github.com/berth-sandbox/berth/server/runtimes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Config configures a Reacher.
type Config struct {
	// ConnectBudget bounds how long a request waits for an agent to
	// connect and answer.
	ConnectBudget time.Duration
	// BusyLimit bounds how long a request waits for an agent that keeps
	// working without answering it (AGENT_BUSY past it).
	BusyLimit time.Duration
	// ServerVersion is berthd's version, compared with agents' (skew).
	ServerVersion string
}

// store is what a Reacher needs of containerd (*runtime.Runtime).
type store interface {
	Get(ctx context.Context, id string) (runtime.Sandbox, error)
	SocketPath(id string) string
	freezer
}

// Reacher reaches agents; see Reach.
type Reacher struct {
	cfg    Config
	rt     store
	ids    *runtimes.Registry
	agents *agentconn.Pool
	log    *slog.Logger

	mu     sync.Mutex
	warned map[string]bool // agent boot ids warned about version skew

	procs procSampler // what Watches read of agents' processes, shared

	freezer freezer
	pauses  pauses // the paused sandboxes (pause.go)
	// OnPause, when set before use, is told of each pause and resume
	// berthd made (the idle reaper stops counting a paused sandbox).
	OnPause func(id string, paused bool)
	// Waker, when set before use, wakes a hibernated sandbox: it starts
	// its new task and returns once the new agent answered, or once
	// another call woke it (the lifecycle engine).
	Waker func(ctx context.Context, id string) error
}

// New returns a Reacher of the agents of rt's sandboxes through agents,
// that records the runtimes it meets in ids.
func New(cfg Config, rt store, ids *runtimes.Registry, agents *agentconn.Pool, log *slog.Logger) *Reacher {
	return &Reacher{cfg: cfg, rt: rt, freezer: rt, ids: ids, agents: agents, log: log, warned: make(map[string]bool)}
}

// infoTimeout bounds a status query to an agent made while answering
// GetSandbox or ListSandboxes (Info).
const infoTimeout = 2 * time.Second

// sandboxNotFound is the error of a sandbox that does not exist, and of one
// the caller may not see: the same words, so that no answer tells the two
// apart.
func sandboxNotFound(id string) error {
	return fmt.Errorf("%w: %s", runtime.ErrSandboxNotFound, id)
}

// Reach returns a client for the agent of a running sandbox and the runtime
// it belongs to, once the agent has answered an Info call. Before anything
// is sent to the agent it makes sure someone answers: it fails with
// ErrSandboxNotFound, or with an *apierr.Unreachable (nothing ran) when the
// sandbox's task is not running (TASK_STOPPED), the agent's socket is
// missing (SOCKET_MISSING), or the agent did not connect and answer within
// Config.ConnectBudget (CONNECT_TIMEOUT: stopped, hung or overloaded).
// execID, which may be empty, only goes into the error. A sandbox the
// caller of ctx may not see (auth.Sees) is ErrSandboxNotFound, worded as
// for a missing one, decided before anything reaches its agent.
//
// When berthd knows the sandbox's runtime and containerd has not reported
// its task gone, the agent answering with that runtime's boot id proves the
// task runs (the agent is its PID 1), and containerd is not asked: that
// saves a third of an exec's latency (BenchmarkTaskState). Otherwise, and
// whenever the agent does not answer, containerd's record decides. An
// agent that proved that boot id on the open connection and sent on it
// within provenLive, not stopped, is not asked again (proven).
func (r *Reacher) Reach(ctx context.Context, sandboxID, execID string) (agentv1.AgentServiceClient, apierr.Runtime, error) {
	began := time.Now()
	last, known := r.ids.Live(sandboxID)
	var (
		sb      runtime.Sandbox
		checked bool // sb holds containerd's record
	)
	check := func() error {
		var err error
		sb, err = r.rt.Get(ctx, sandboxID)
		if err != nil {
			return err
		}
		if !auth.Sees(ctx, sb.Owner) {
			return sandboxNotFound(sandboxID)
		}
		checked = true
		unreachable := func(cause berthv1.UnreachableCause, what string) error {
			return &apierr.Unreachable{SandboxID: sandboxID, ExecID: execID, Cause: cause, TaskRunning: sb.Running,
				Runtime: last, Waited: time.Since(began), Admitted: berthv1.Admitted_ADMITTED_NOT_STARTED, What: what}
		}
		if sb.Hibernated {
			return nil // woken before its agent is asked (hibernate.go)
		}
		if !sb.Running && !sb.Paused {
			return unreachable(berthv1.UnreachableCause_UNREACHABLE_CAUSE_TASK_STOPPED, "the sandbox's task is not running")
		}
		switch err := agentconn.CheckSocket(sb.SocketPath); {
		case errors.Is(err, fs.ErrNotExist):
			return unreachable(berthv1.UnreachableCause_UNREACHABLE_CAUSE_SOCKET_MISSING,
				"the agent's socket does not exist: the agent has not started listening")
		case errors.Is(err, agentconn.ErrNotSocket):
			// Something in the sandbox replaced it: berthd never follows it.
			return unreachable(berthv1.UnreachableCause_UNREACHABLE_CAUSE_SOCKET_MISSING,
				"the agent's socket was replaced by something that is not a socket (berthd does not follow symlinks there)")
		}
		return nil
	}
	// The owner berthd verified for the live runtime spares containerd;
	// without one, containerd's record decides before the agent is asked.
	owner, ownerKnown := r.ids.OwnerOf(sandboxID, last.BootID)
	if known && ownerKnown && !auth.Sees(ctx, owner) {
		return nil, apierr.Runtime{}, sandboxNotFound(sandboxID)
	}
	if !known || !ownerKnown {
		if err := check(); err != nil {
			return nil, apierr.Runtime{}, err
		}
	}
	// A hibernated sandbox is woken (hibernate.go), a paused one resumed
	// (pause.go), before its agent is asked.
	woke, err := r.wakeHibernated(ctx, sandboxID, execID, checked && sb.Hibernated)
	if err != nil {
		return nil, apierr.Runtime{}, err
	}
	if woke {
		// A new task: the wake recorded its runtime.
		last, known = r.ids.Live(sandboxID)
		checked = false
	}
	if err := r.wake(ctx, sandboxID, execID, checked && sb.Paused); err != nil {
		return nil, apierr.Runtime{}, err
	}
	agent, err := r.agents.Get(r.rt.SocketPath(sandboxID))
	if err != nil {
		return nil, apierr.Runtime{}, err
	}
	if known && ownerKnown && r.proven(sandboxID, last) {
		return agent, last, nil
	}
	pid := last.TaskPID
	if checked {
		pid = sb.TaskPID
	}
	watch := r.NewWatch(sandboxID, pid)
	var info *agentv1.InfoResponse
	for {
		infoCtx, cancel := context.WithTimeout(ctx, r.cfg.ConnectBudget)
		info, err = agent.Info(infoCtx, &agentv1.InfoRequest{}, grpc.WaitForReady(true))
		cancel()
		if err == nil || ctx.Err() != nil || status.Code(err) != codes.DeadlineExceeded {
			break
		}
		if r.pauses.isAsleep(sandboxID) {
			// Hibernated while this call waited: it wakes it, as any call.
			if _, err := r.wakeHibernated(ctx, sandboxID, execID, false); err != nil {
				return nil, apierr.Runtime{}, err
			}
			last, known = r.ids.Live(sandboxID)
			checked = false
			if agent, err = r.agents.Get(r.rt.SocketPath(sandboxID)); err != nil {
				return nil, apierr.Runtime{}, err
			}
			watch = r.NewWatch(sandboxID, last.TaskPID)
			continue
		}
		if r.pauses.settled(sandboxID) {
			// Paused while this call waited: it resumes it, as any call.
			if err := r.wake(ctx, sandboxID, execID, false); err != nil {
				return nil, apierr.Runtime{}, err
			}
			continue
		}
		if !watch.Busy() {
			break
		}
		// Busy answering others: ask again.
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, apierr.Runtime{}, ctx.Err()
		}
		if refusal := r.agents.Refusal(r.rt.SocketPath(sandboxID)); refusal != nil {
			return nil, apierr.Runtime{}, &apierr.Unreachable{SandboxID: sandboxID, ExecID: execID, Cause: berthv1.UnreachableCause_UNREACHABLE_CAUSE_AGENT_UNVERIFIED,
				TaskRunning: true, Runtime: last, Waited: time.Since(began), Admitted: berthv1.Admitted_ADMITTED_NOT_STARTED,
				What: fmt.Sprintf("berthd refused what answered on the agent's socket (%v); nothing was sent to it", refusal)}
		}
		if err := r.DialFailure(sandboxID, time.Since(began)); err != nil {
			return nil, apierr.Runtime{}, err
		}
		if !checked {
			if err := check(); err != nil {
				return nil, apierr.Runtime{}, err
			}
		}
		cause, what := watch.Verdict("did not answer")
		return nil, apierr.Runtime{}, &apierr.Unreachable{SandboxID: sandboxID, ExecID: execID, Cause: cause,
			TaskRunning: sb.Running, Runtime: last, Waited: time.Since(began), Admitted: berthv1.Admitted_ADMITTED_NOT_STARTED,
			What: fmt.Sprintf("%s (%v)", what, GRPCMessage(err))}
	}
	if known && info.GetBootId() == last.BootID {
		if checked {
			r.ids.SetOwner(sandboxID, last.BootID, sb.Owner)
		}
		return agent, last, nil
	}
	if !checked {
		// A runtime berthd has not seen: containerd names its task.
		if err := check(); err != nil {
			return nil, apierr.Runtime{}, err
		}
	}
	id := apierr.Runtime{BootID: info.GetBootId(), TaskPID: sb.TaskPID, AgentVersion: info.GetVersion()}
	if last.TaskPID == id.TaskPID && last.BootID == id.BootID && !last.StartedAt.IsZero() {
		id.StartedAt = last.StartedAt
	} else {
		id.StartedAt, _ = procfs.StartTime(id.TaskPID)
	}
	r.ids.Observe(sandboxID, id)
	r.ids.SetOwner(sandboxID, id.BootID, sb.Owner)
	return agent, id, nil
}

// provenLive is how recently an agent must have sent berthd something on a
// connection it proved itself on for a request to skip Reach's Info.
const provenLive = time.Second

// proven reports whether the agent of sandboxID's runtime last answered an
// Info on berthd's connection to it, still open, with last's boot id (and
// the proof of the sandbox's secret), sent berthd something on it within
// provenLive, and its process (last.TaskPID) is not stopped by a signal:
// then a request sent on that connection reaches that agent as surely as
// after a fresh Info, whose round trip it saves (issue 23: one agent
// wake-up and two of berthd's per exec). A stopped agent gets the Info, so
// that its caller learns, within the connect budget, that nothing was
// sent. What Info would still catch: an agent that stopped answering
// without being stopped (hung) within provenLive of its last message; its
// request then ends after the connect budget as for an agent that hangs
// once it took a request (ADMITTED_UNKNOWN), not as NOT_STARTED.
func (r *Reacher) proven(sandboxID string, last apierr.Runtime) bool {
	boot, ok := r.agents.Proven(r.rt.SocketPath(sandboxID), provenLive)
	return ok && boot != "" && boot == last.BootID && last.TaskPID != 0 && !procfs.Stopped(last.TaskPID)
}

// DialFailure returns a *apierr.Dependency (nothing sent) when the last
// attempt to connect to the sandbox's agent failed for want of a resource
// of berthd's own host — its file descriptors, above all — rather than
// because of the agent; nil otherwise.
func (r *Reacher) DialFailure(sandboxID string, waited time.Duration) error {
	err := r.agents.DialError(r.rt.SocketPath(sandboxID))
	if _, ok := runtime.HostErrno(err); !ok {
		return nil
	}
	return apierr.WithMeta(&apierr.Attempt{Err: err, Op: "connect to the agent of sandbox " + sandboxID, Waited: waited,
		Admitted: berthv1.Admitted_ADMITTED_NOT_STARTED}, map[string]string{"sandbox_id": sandboxID})
}

// Watch tells a busy agent from an unreachable one while a request
// waits for its answer. A sandbox is working when, since the last check,
// its agent (or a launcher of the agent, which forks the processes it
// starts) used CPU, any process of its cgroup used CPU or was held back by
// its CPU limit, a thread of the agent or of a launcher is running,
// waiting for a CPU or waiting in the kernel (state D: a disk, a page
// fault, a vfork), or the agent sent berthd anything on its connection
// (other streams' events): it is busy — with a burst of execs, or on a
// loaded host — and is waited for, up to Config.AgentBusyLimit in all
// (then AGENT_BUSY). An agent whose process is stopped (SIGSTOP) is
// unreachable after one budget; so is one that did none of these while
// bytes berthd wrote to it lay unread in its socket from one check to the
// next (two budgets at most, one when they lay there when the wait began).
// Bytes found unread at one check alone prove nothing: berthd may just
// have written them to an agent that was idle only because a loaded
// berthd sent it nothing (issue 21: 1 of 300 execs failed so on a loaded
// host). When nothing waits unread the wait goes on, and ends as
// unreachable (a hung agent) at the limit without any work. A pid of 0
// (the task is unknown) leaves only what the connection shows.
type Watch struct {
	probe  probe
	budget time.Duration
	limit  time.Duration // Config.AgentBusyLimit
	began  time.Time

	last    progress // the counters at the last check
	unread  int      // bytes unread in the agent's socket at the last check
	worked  bool     // it worked at some time during the wait
	stopped bool     // it was found stopped (SIGSTOP)
	// paused reports whether the sandbox is paused (PauseSandbox): its
	// agent is waited for as long as it is, however long; nil: never.
	paused func() bool
}

// progress holds counters that grow while a sandbox works; only a change
// counts (a thread that exits takes its CPU time with it).
type progress struct {
	agentCPU  time.Duration // the agent's and its launchers' CPU time; -1 unknown
	cgroupCPU time.Duration // procfs.CgroupCPU of the agent's cgroup; -1 unknown
	frames    uint64        // what the agent had sent berthd
}

// changed reports whether p differs from an earlier reading in a counter
// known at both.
func (p progress) changed(earlier progress) bool {
	return (p.agentCPU >= 0 && earlier.agentCPU >= 0 && p.agentCPU != earlier.agentCPU) ||
		(p.cgroupCPU >= 0 && earlier.cgroupCPU >= 0 && p.cgroupCPU != earlier.cgroupCPU) ||
		p.frames > earlier.frames
}

// probe is what a Watch reads of a sandbox: /proc and the cgroup files of
// its agent, and berthd's connection to it (agentProbe); tests replace it.
type probe interface {
	// stopped reports whether the agent's process is stopped by a signal.
	stopped() bool
	// progress reads the counters.
	progress() progress
	// baseline reads the counters a Watch starts from, and a check reads
	// first, as cheaply as they can be compared with progress's: every
	// exec starts a Watch, and on a loaded host many check theirs.
	baseline() progress
	// states returns the states (proc(5) field 3) of the threads of the
	// agent and of its launchers.
	states() []byte
	// unread returns how many bytes berthd wrote to the agent lie unread
	// in its socket, and false when berthd holds no connection to it.
	unread() (int, bool)
}

// NewWatch starts watching the agent of sandboxID, whose task is host
// process pid (0 when unknown).
func (r *Reacher) NewWatch(sandboxID string, pid uint32) *Watch {
	socket := r.rt.SocketPath(sandboxID)
	w := newWatch(agentProbe{pid: pid, socket: socket, agents: r.agents, procs: &r.procs}, r.cfg.ConnectBudget, r.cfg.BusyLimit, time.Now())
	w.paused = func() bool { return r.pauses.get(sandboxID) }
	return w
}

func newWatch(p probe, budget, limit time.Duration, now time.Time) *Watch {
	w := &Watch{probe: p, budget: budget, limit: limit, began: now}
	w.last = p.baseline()
	w.unread, _ = p.unread()
	return w
}

// agentProbe is the probe of a running agent.
type agentProbe struct {
	pid    uint32
	socket string
	agents *agentconn.Pool
	procs  *procSampler
}

func (p agentProbe) stopped() bool { return procfs.Stopped(p.pid) }

func (p agentProbe) progress() progress {
	pr := p.procs.sample(p.pid).progress
	pr.frames = p.agents.Received(p.socket)
	return pr
}

func (p agentProbe) baseline() progress {
	pr := p.procs.baseline(p.pid)
	pr.frames = p.agents.Received(p.socket)
	return pr
}

func (p agentProbe) states() []byte { return p.procs.sample(p.pid).states }

// procSampler reads an agent's processes and cgroup for Watches (some
// hundred /proc and cgroup files) at most once per sampleTTL per agent:
// the hundreds of requests a burst leaves waiting on one agent check it
// every connect budget each, and reading for each of them took berthd a
// core on a loaded host, slowing the very agent they wait for.
type procSampler struct {
	mu   sync.Mutex
	last map[uint32]procSample
	// cgroups holds the cgroup CPU files of each agent read lately (an
	// agent, PID 1 of its sandbox, stays in its cgroup): a baseline then
	// reads one or two small files, not /proc/<pid>/cgroup as well
	// (issue 23). Kept past the agent's samples, which last a second,
	// so that execs seconds apart use them too; read afresh when a file
	// cannot be read (the sandbox, and its cgroup, are gone); dropped
	// all at once past maxCgroupFiles agents.
	cgroups map[uint32]procfs.CgroupCPUFiles
}

// maxCgroupFiles bounds procSampler.cgroups: three paths an agent.
const maxCgroupFiles = 4096

// sampleTTL is how long a procSample serves: far below any connect
// budget, so that a Watch's consecutive checks see distinct samples.
const sampleTTL = 10 * time.Millisecond

// procSample is what procSampler read of an agent at one time.
type procSample struct {
	at       time.Time // when the read began (the counters are of then)
	read     time.Time // when it ended: the sample serves until sampleTTL after
	progress progress  // without frames
	states   []byte    // of the agent's and its launchers' threads
	full     bool      // all of the above was read, not only a baseline
}

// cached returns the sample of pid whose read ended within sampleTTL of
// now, a full one when full. From the end, not the start: on a loaded host
// a full read takes longer than sampleTTL, and a sample timed from its
// start would then never be shared — the burst it exists for is when the
// host is loaded (TestProcSamplerShares failed so in CI: 18 ms apart).
func (ps *procSampler) cached(pid uint32, now time.Time, full bool) (procSample, bool) {
	ps.mu.Lock()
	s, ok := ps.last[pid]
	ps.mu.Unlock()
	return s, ok && now.Sub(s.read) < sampleTTL && (s.full || !full)
}

// baseline returns the counters a Watch starts from: a sample's within
// sampleTTL, or the agent cgroup's CPU alone (three small files; it counts
// the agent's and its launchers' CPU as well), or, where the cgroup cannot
// be read, the agent's and its launchers' CPU. A later full sample compares
// with it in the counter both know. The states of threads, which a check
// reads afresh anyway, are not read: a full sample was some hundred /proc
// files for every exec, half of berthd's CPU in a round trip (issue 23).
func (ps *procSampler) baseline(pid uint32) progress {
	now := time.Now()
	if s, ok := ps.cached(pid, now, false); ok {
		return s.progress
	}
	s := procSample{at: now, progress: progress{agentCPU: -1, cgroupCPU: -1}}
	if cpu, err := ps.cgroupCPU(pid); err == nil {
		s.progress.cgroupCPU = cpu
	} else if cpu, err := agentCPU(pid); err == nil {
		s.progress.agentCPU = cpu
	}
	ps.store(pid, s)
	return s.progress
}

func (ps *procSampler) sample(pid uint32) procSample {
	now := time.Now()
	if s, ok := ps.cached(pid, now, true); ok {
		return s
	}
	// Read without the lock: other agents' Watches need not wait (two
	// Watches of one agent may read it at once, rarely).
	s := procSample{at: now, progress: progress{agentCPU: -1, cgroupCPU: -1}, full: true}
	if cpu, err := agentCPU(pid); err == nil {
		s.progress.agentCPU = cpu
	}
	if cpu, err := ps.cgroupCPU(pid); err == nil {
		s.progress.cgroupCPU = cpu
	}
	s.states = procfs.ThreadStates(pid)
	for _, l := range agentLaunchers(pid) {
		s.states = append(s.states, procfs.ThreadStates(l)...)
	}
	ps.store(pid, s)
	return s
}

// cgroupCPU is procfs.CgroupCPU of pid, from the files found for it
// before when they can still be read.
func (ps *procSampler) cgroupCPU(pid uint32) (time.Duration, error) {
	ps.mu.Lock()
	files, ok := ps.cgroups[pid]
	ps.mu.Unlock()
	if ok {
		if cpu, err := files.Read(); err == nil {
			return cpu, nil
		}
	}
	files, err := procfs.CgroupCPUFilesOf(pid)
	if err != nil {
		return 0, err
	}
	cpu, err := files.Read()
	if err != nil {
		return 0, err
	}
	ps.mu.Lock()
	if ps.cgroups == nil || len(ps.cgroups) >= maxCgroupFiles {
		ps.cgroups = make(map[uint32]procfs.CgroupCPUFiles)
	}
	ps.cgroups[pid] = files
	ps.mu.Unlock()
	return cpu, nil
}

// store keeps s as pid's sample, its read ended now, and forgets those older
// than a second (not their cgroup files: see procSampler.cgroups).
func (ps *procSampler) store(pid uint32, s procSample) {
	s.read = time.Now()
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.last == nil {
		ps.last = make(map[uint32]procSample)
	}
	for p, old := range ps.last {
		if s.at.Sub(old.at) > time.Second {
			delete(ps.last, p)
		}
	}
	ps.last[pid] = s
}

func (p agentProbe) unread() (int, bool) { return p.agents.Unread(p.socket) }

// launcherComm is the command name of an agent's launcher, the process
// that forks the agent's workload processes (agent/launcher.Comm).
const launcherComm = "berth-launcher"

// agentCPU is procfs.CPU of the agent plus its launchers': an agent starting
// processes waits for a launcher, which does the work meanwhile.
func agentCPU(pid uint32) (time.Duration, error) {
	cpu, err := procfs.CPU(pid)
	for _, l := range agentLaunchers(pid) {
		if lcpu, lerr := procfs.CPU(l); lerr == nil {
			cpu += lcpu
		}
	}
	return cpu, err
}

// agentLaunchers returns the host pids of the agent's launchers (one for
// the workload user, one per other user that ran an exec, see
// agent.launcherFor): the children of its threads
// (/proc/<pid>/task/<tid>/children, proc(5)) named launcherComm.
func agentLaunchers(pid uint32) []uint32 {
	if pid == 0 {
		return nil
	}
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil
	}
	var pids []uint32
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		if err != nil {
			continue
		}
		for _, child := range strings.Fields(string(b)) {
			comm, err := os.ReadFile("/proc/" + child + "/comm")
			if err == nil && strings.TrimSpace(string(comm)) == launcherComm {
				if n, err := strconv.ParseUint(child, 10, 32); err == nil {
					pids = append(pids, uint32(n))
				}
			}
		}
	}
	return pids
}

// Busy is called when a wait ran out its budget: it reports whether the
// wait goes on (see Watch).
func (w *Watch) Busy() bool {
	return w.check(time.Now())
}

// check is Busy at now.
func (w *Watch) check(now time.Time) bool {
	if w.paused != nil && w.paused() {
		// Frozen on purpose: not unreachable, and the wait goes on
		// until a resume.
		w.began = now
		return true
	}
	if w.probe.stopped() {
		w.worked, w.stopped = false, true
		return false
	}
	// The cheap counters first (the cgroup's CPU, which counts the
	// agent's and its launchers' too, and the frames): a sandbox that
	// used CPU since is working, whatever its threads' states say. The
	// full sample (some hundred /proc files: every thread's state and CPU,
	// the launchers found through /proc/<pid>/task/*/children) is read
	// only for one that did not. Reading it first cost berthd 1.6 ms of
	// CPU an exec in the concurrent benchmark at load 60-90, where most
	// Runs waited past the connect budget for their start (issue 23).
	pr := w.probe.baseline()
	worked := pr.changed(w.last)
	if !worked {
		pr = w.probe.progress()
		worked = pr.changed(w.last) || slices.ContainsFunc(w.probe.states(), procfs.WorkingState)
	}
	w.last = pr
	w.worked = w.worked || worked
	if now.Sub(w.began) >= w.limit {
		return false
	}
	unread, connected := w.probe.unread()
	before := w.unread
	w.unread = unread
	switch {
	case worked:
		return true
	case !connected:
		return false
	}
	// Unread bytes prove a neglect only when they were there at the last
	// check too: the agent, which did no work since, cannot have read them.
	return unread == 0 || before == 0
}

// Verdict returns the cause and the description of a wait that ended
// without an answer; did says what the agent did not do.
func (w *Watch) Verdict(did string) (berthv1.UnreachableCause, string) {
	if w.stopped {
		return berthv1.UnreachableCause_UNREACHABLE_CAUSE_CONNECT_TIMEOUT,
			fmt.Sprintf("the agent %s within %v: its process is stopped (SIGSTOP; connect budget %v)", did, time.Since(w.began).Round(time.Millisecond), w.budget)
	}
	if w.worked {
		return berthv1.UnreachableCause_UNREACHABLE_CAUSE_AGENT_BUSY,
			fmt.Sprintf("the agent %s within %v although it kept working: it is overloaded", did, time.Since(w.began).Round(time.Millisecond))
	}
	return berthv1.UnreachableCause_UNREACHABLE_CAUSE_CONNECT_TIMEOUT,
		fmt.Sprintf("the agent %s within %v and did no work meanwhile (connect budget %v)", did, time.Since(w.began).Round(time.Millisecond), w.budget)
}

// Agent returns a client for the agent of a running sandbox once it
// answered within the connect budget. It fails with ErrSandboxNotFound or an
// *apierr.Unreachable (see reach).
func (r *Reacher) Agent(ctx context.Context, sandboxID string) (agentv1.AgentServiceClient, error) {
	agent, _, err := r.Reach(ctx, sandboxID, "")
	return agent, err
}

// Info asks the sandbox's agent for Info within infoTimeout
// and checks its version against berthd's.
func (r *Reacher) Info(ctx context.Context, sb runtime.Sandbox) (*agentv1.InfoResponse, error) {
	agent, err := r.agents.Get(sb.SocketPath)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, infoTimeout)
	defer cancel()
	info, err := agent.Info(ctx, &agentv1.InfoRequest{})
	if err != nil {
		return nil, AgentError(sb.ID, err)
	}
	r.CheckSkew(sb.ID, info)
	return info, nil
}

// CheckSkew logs a warning, once per agent boot, when the agent's version
// differs from berthd's.
func (r *Reacher) CheckSkew(id string, info *agentv1.InfoResponse) {
	if info == nil || info.GetVersion() == r.cfg.ServerVersion {
		return
	}
	r.mu.Lock()
	warned := r.warned[info.GetBootId()]
	r.warned[info.GetBootId()] = true
	r.mu.Unlock()
	if !warned {
		r.log.Warn("agent version differs from berthd's", slog.String("sandbox_id", id), slog.String("agent_version", info.GetVersion()),
			slog.String("agent_build", info.GetBuild()), slog.String("server_version", r.cfg.ServerVersion), slog.String("agent_boot_id", info.GetBootId()))
	}
}

// AgentError classifies an error from an agent RPC made outside an exec
// (see execGuard.failed for those). Statuses the agent built (with a berth
// ErrorInfo) pass unchanged; transport failures mean the agent is
// unreachable.
func AgentError(sandboxID string, err error) error {
	if rpcstatus.Reason(err) != "" {
		return err
	}
	if errors.Is(err, agentconn.ErrUnverified) {
		return &apierr.Unreachable{SandboxID: sandboxID, Cause: berthv1.UnreachableCause_UNREACHABLE_CAUSE_AGENT_UNVERIFIED,
			TaskRunning: true, Admitted: berthv1.Admitted_ADMITTED_NOT_STARTED, What: err.Error() + "; nothing was sent to it"}
	}
	switch status.Code(err) {
	case codes.Unavailable:
		return &apierr.Unreachable{SandboxID: sandboxID, Cause: berthv1.UnreachableCause_UNREACHABLE_CAUSE_CONNECTION_LOST,
			TaskRunning: true, Admitted: berthv1.Admitted_ADMITTED_UNKNOWN, What: "the connection to the agent broke: " + GRPCMessage(err)}
	case codes.Canceled:
		return context.Canceled
	case codes.DeadlineExceeded:
		return context.DeadlineExceeded
	}
	return fmt.Errorf("agent of sandbox %s: %w", sandboxID, err)
}

// GRPCMessage returns the message of a status error, or err's text.
func GRPCMessage(err error) string {
	if st, ok := status.FromError(err); ok {
		return st.Message()
	}
	return err.Error()
}

// Files returns the FileService client of sandbox id's agent, on the
// connection Reach verified.
func (r *Reacher) Files(sandboxID string) (agentv1.FileServiceClient, error) {
	return r.agents.Files(r.rt.SocketPath(sandboxID))
}
