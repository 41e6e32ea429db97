package server

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/internal/procfs"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/agentconn"
	"github.com/berth-sandbox/berth/server/auth"
	"github.com/berth-sandbox/berth/server/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// reach returns a client for the agent of a running sandbox and the runtime
// it belongs to, once the agent has answered an Info call. Before anything
// is sent to the agent it makes sure someone answers: it fails with
// ErrSandboxNotFound, or with an *unreachableError (nothing ran) when the
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
// whenever the agent does not answer, containerd's record decides.
func (s *Service) reach(ctx context.Context, sandboxID, execID string) (agentv1.AgentServiceClient, identity, error) {
	began := time.Now()
	last, known := s.ids.live(sandboxID)
	var (
		sb      runtime.Sandbox
		checked bool // sb holds containerd's record
	)
	check := func() error {
		var err error
		sb, err = s.rt.Get(ctx, sandboxID)
		if err != nil {
			return err
		}
		if !auth.Sees(ctx, sb.Owner) {
			return sandboxNotFound(sandboxID)
		}
		checked = true
		unreachable := func(cause berthv1.UnreachableCause, what string) error {
			return &unreachableError{sandboxID: sandboxID, execID: execID, cause: cause, taskRunning: sb.Running,
				runtime: last, waited: time.Since(began), admitted: berthv1.Admitted_ADMITTED_NOT_STARTED, what: what}
		}
		if !sb.Running {
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
	owner, ownerKnown := s.ids.ownerOf(sandboxID, last.BootID)
	if known && ownerKnown && !auth.Sees(ctx, owner) {
		return nil, identity{}, sandboxNotFound(sandboxID)
	}
	if !known || !ownerKnown {
		if err := check(); err != nil {
			return nil, identity{}, err
		}
	}
	agent, err := s.agents.Get(s.rt.SocketPath(sandboxID))
	if err != nil {
		return nil, identity{}, err
	}
	pid := last.TaskPID
	if checked {
		pid = sb.TaskPID
	}
	watch := s.newAgentWatch(sandboxID, pid)
	var info *agentv1.InfoResponse
	for {
		infoCtx, cancel := context.WithTimeout(ctx, s.cfg.ConnectBudget)
		info, err = agent.Info(infoCtx, &agentv1.InfoRequest{}, grpc.WaitForReady(true))
		cancel()
		if err == nil || ctx.Err() != nil || status.Code(err) != codes.DeadlineExceeded || !watch.busy() {
			break
		}
		// Busy answering others: ask again.
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, identity{}, ctx.Err()
		}
		if refusal := s.agents.Refusal(s.rt.SocketPath(sandboxID)); refusal != nil {
			return nil, identity{}, &unreachableError{sandboxID: sandboxID, execID: execID, cause: berthv1.UnreachableCause_UNREACHABLE_CAUSE_AGENT_UNVERIFIED,
				taskRunning: true, runtime: last, waited: time.Since(began), admitted: berthv1.Admitted_ADMITTED_NOT_STARTED,
				what: fmt.Sprintf("berthd refused what answered on the agent's socket (%v); nothing was sent to it", refusal)}
		}
		if err := s.dialFailure(sandboxID, time.Since(began)); err != nil {
			return nil, identity{}, err
		}
		if !checked {
			if err := check(); err != nil {
				return nil, identity{}, err
			}
		}
		cause, what := watch.verdict("did not answer")
		return nil, identity{}, &unreachableError{sandboxID: sandboxID, execID: execID, cause: cause,
			taskRunning: sb.Running, runtime: last, waited: time.Since(began), admitted: berthv1.Admitted_ADMITTED_NOT_STARTED,
			what: fmt.Sprintf("%s (%v)", what, grpcMessage(err))}
	}
	if known && info.GetBootId() == last.BootID {
		if checked {
			s.ids.setOwner(sandboxID, last.BootID, sb.Owner)
		}
		return agent, last, nil
	}
	if !checked {
		// A runtime berthd has not seen: containerd names its task.
		if err := check(); err != nil {
			return nil, identity{}, err
		}
	}
	id := identity{BootID: info.GetBootId(), TaskPID: sb.TaskPID, AgentVersion: info.GetVersion()}
	if last.TaskPID == id.TaskPID && last.BootID == id.BootID && !last.StartedAt.IsZero() {
		id.StartedAt = last.StartedAt
	} else {
		id.StartedAt, _ = procStartTime(id.TaskPID)
	}
	s.ids.observe(sandboxID, id)
	s.ids.setOwner(sandboxID, id.BootID, sb.Owner)
	return agent, id, nil
}

// dialFailure returns a *dependencyError (nothing sent) when the last
// attempt to connect to the sandbox's agent failed for want of a resource
// of berthd's own host — its file descriptors, above all — rather than
// because of the agent; nil otherwise.
func (s *Service) dialFailure(sandboxID string, waited time.Duration) error {
	err := s.agents.DialError(s.rt.SocketPath(sandboxID))
	if _, ok := runtime.HostErrno(err); !ok {
		return nil
	}
	d, _ := dependencyOf(err, sandboxID)
	d.op = "connect to the agent of sandbox " + sandboxID
	d.waited = waited
	d.admitted = berthv1.Admitted_ADMITTED_NOT_STARTED
	return d
}

// agentWatch tells a busy agent from an unreachable one while a request
// waits for its answer. An agent is working when, since the last check, its
// process (or its launcher, which forks the processes it starts) used CPU, one of its threads is running or waiting for a CPU, or
// it sent berthd anything on its connection (other streams' events): it is
// busy — with a burst of execs, or on a loaded host — and is waited for, up
// to Config.AgentBusyLimit in all (then AGENT_BUSY). An agent whose process
// is stopped (SIGSTOP), or that did none of these while bytes berthd wrote
// to it lay unread in its socket, is unreachable after one budget. When
// nothing waits unread, berthd itself may not have sent the request yet (a
// loaded berthd): the wait goes on, and ends as unreachable (a hung agent)
// at the limit without any work. A pid of 0 (the task is unknown) leaves
// only what the connection shows.
type agentWatch struct {
	pid      uint32
	budget   time.Duration
	began    time.Time
	received func() uint64
	unread   func() (int, bool)

	cpu     time.Duration // the agent's CPU time at the last check
	frames  uint64        // what it had sent at the last check
	worked  bool          // it worked at some time during the wait
	stopped bool          // it was found stopped (SIGSTOP)
	limit   time.Duration // Config.AgentBusyLimit
}

func (s *Service) newAgentWatch(sandboxID string, pid uint32) *agentWatch {
	socket := s.rt.SocketPath(sandboxID)
	w := &agentWatch{pid: pid, budget: s.cfg.ConnectBudget, limit: s.cfg.AgentBusyLimit, began: time.Now(),
		received: func() uint64 { return s.agents.Received(socket) },
		unread:   func() (int, bool) { return s.agents.Unread(socket) }}
	w.cpu, _ = agentCPU(pid)
	w.frames = w.received()
	return w
}

// launcherComm is the command name of an agent's launcher, the process
// that forks the agent's workload processes (agent/launcher.Comm).
const launcherComm = "berth-launcher"

// agentCPU is procCPU of the agent plus its launchers': an agent starting
// processes waits for a launcher, which does the work meanwhile.
func agentCPU(pid uint32) (time.Duration, error) {
	cpu, err := procCPU(pid)
	for _, l := range agentLaunchers(pid) {
		if lcpu, lerr := procCPU(l); lerr == nil {
			cpu += lcpu
		}
	}
	return cpu, err
}

// launcherForking reports whether one of the launcher pids is running,
// waiting for a CPU, or waiting for the child it just forked to exec
// (vfork(2): state D), from /proc/<pid>/stat (proc(5)).
func launcherForking(pids []uint32) bool {
	for _, pid := range pids {
		fields, err := procfs.Stat(pid)
		if err == nil && (fields[3] == "R" || fields[3] == "D") {
			return true
		}
	}
	return false
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

// busy is called when a wait ran out its budget: it reports whether the
// wait goes on (see agentWatch).
func (w *agentWatch) busy() bool {
	if procStopped(w.pid) {
		w.worked, w.stopped = false, true
		return false
	}
	cpu, err := agentCPU(w.pid)
	frames := w.received()
	worked := (err == nil && cpu != w.cpu) || frames > w.frames || procRunnable(w.pid) || launcherForking(agentLaunchers(w.pid))
	w.cpu, w.frames = cpu, frames
	w.worked = w.worked || worked
	if time.Since(w.began) >= w.limit {
		return false
	}
	if worked {
		return true
	}
	unread, connected := w.unread()
	return connected && unread == 0
}

// verdict returns the cause and the description of a wait that ended
// without an answer; did says what the agent did not do.
func (w *agentWatch) verdict(did string) (berthv1.UnreachableCause, string) {
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
