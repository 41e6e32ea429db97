package runtimes

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/server/runtime"
)

func fired(w *Watch, te *TaskEvents) bool {
	select {
	case <-te.Fired(w):
		return true
	default:
		return false
	}
}

func TestTaskWatches(t *testing.T) {
	te := NewTaskEvents(nil, discard)
	var decided []runtime.TaskEvent
	te.OnExit = func(ev runtime.TaskEvent) ExitDecision {
		decided = append(decided, ev)
		return ExitRestarting
	}
	w := te.Watch("sb")
	other := te.Watch("other")
	if !te.Expect(w, 100, time.Time{}) {
		t.Fatal("expect on a fresh watch reported the task gone")
	}
	// An exit of another task of the sandbox (an older one) does not fire.
	te.dispatch(runtime.TaskEvent{Kind: runtime.TaskExited, SandboxID: "sb", Pid: 99, ExitStatus: 1})
	if fired(w, te) {
		t.Error("watch fired for another task's exit")
	}
	te.dispatch(runtime.TaskEvent{Kind: runtime.TaskOOM, SandboxID: "sb", At: time.Unix(50, 0)})
	at := time.Unix(60, 0)
	te.dispatch(runtime.TaskEvent{Kind: runtime.TaskExited, SandboxID: "sb", Pid: 100, ExitStatus: 137, At: at})
	if !fired(w, te) || fired(other, te) {
		t.Fatalf("after the exit: watch fired %v, other fired %v; want only the watch", fired(w, te), fired(other, te))
	}
	ev, decision, ok := te.Result(w)
	if !ok || ev.ExitStatus != 137 || !ev.At.Equal(at) || decision != ExitRestarting {
		t.Errorf("result = %v, %v, %v; want the exit with ExitRestarting", ev, decision, ok)
	}
	if len(decided) != 2 {
		t.Errorf("onExit saw %d exits, want 2", len(decided))
	}
	// The OOM at 50 is 10 s before the exit at 60: not the exit's cause.
	if te.OOMNear("sb", time.Time{}, at) || !te.OOMNear("sb", time.Time{}, time.Unix(50, 500)) || te.OOMNear("sb", time.Time{}, time.Time{}) {
		t.Error("oomNear does not match the OOM event at 50 only")
	}
	te.dispatch(runtime.TaskEvent{Kind: runtime.TaskOOM, SandboxID: "sb", At: at.Add(-15 * time.Millisecond)})
	if !te.OOMNear("sb", time.Unix(55, 0), at) {
		t.Error("oomNear misses an OOM 15 ms before the exit")
	}
	// An OOM seen before the task started was another task's: an earlier
	// sandbox of the same id.
	if te.OOMNear("sb", at.Add(-time.Millisecond), at) {
		t.Error("oomNear blames an exit on an OOM from before its task started")
	}
	// A later delete does not change how the watch fired, nor the OOM
	// record, which a restarted task's RUNTIME_REPLACED may still read.
	te.dispatch(runtime.TaskEvent{Kind: runtime.TaskDeleted, SandboxID: "sb", Pid: 100})
	if _, decision, _ := te.Result(w); decision != ExitRestarting {
		t.Errorf("decision after delete = %v, want unchanged", decision)
	}
	if !te.OOMNear("sb", time.Time{}, at) {
		t.Error("OOM record dropped at the task's delete")
	}
	te.Forget("sb")
	if te.OOMNear("sb", time.Time{}, at) {
		t.Error("OOM record kept after forget")
	}
	te.Unwatch(w)
	te.Unwatch(other)
	if len(te.watches) != 0 {
		t.Errorf("watches left: %v", te.watches)
	}
}

func TestTaskWatchExpectRearms(t *testing.T) {
	te := NewTaskEvents(nil, discard)
	w := te.Watch("sb")
	// The old task exits between watch and expect: the new task is what
	// the request reached, so the watch re-arms for it.
	te.dispatch(runtime.TaskEvent{Kind: runtime.TaskExited, SandboxID: "sb", Pid: 1})
	if !te.Expect(w, 2, time.Time{}) || fired(w, te) {
		t.Fatal("expect(2) after the exit of task 1 did not re-arm")
	}
	te.dispatch(runtime.TaskEvent{Kind: runtime.TaskExited, SandboxID: "sb", Pid: 2})
	if !fired(w, te) {
		t.Fatal("re-armed watch did not fire for its task")
	}
	// Fired for the task expected: expect reports it gone.
	w2 := te.Watch("sb")
	te.dispatch(runtime.TaskEvent{Kind: runtime.TaskExited, SandboxID: "sb", Pid: 3})
	if te.Expect(w2, 3, time.Time{}) {
		t.Error("expect(3) after task 3 exited reported it alive")
	}
}

// TestTaskWatchIdentity: an exit is a task's by its identity, pid and
// start time. A deleted sandbox's task whose exit event arrives late, with
// a pid that a new sandbox of the same id now has, is not the new task's.
func TestTaskWatchIdentity(t *testing.T) {
	te := NewTaskEvents(nil, discard)
	started := time.Unix(100, 0)
	w := te.Watch("sb")
	if !te.Expect(w, 7, started) {
		t.Fatal("expect on a fresh watch reported the task gone")
	}
	// The old task with pid 7 exited before the new one started.
	te.dispatch(runtime.TaskEvent{Kind: runtime.TaskExited, SandboxID: "sb", Pid: 7, At: started.Add(-time.Second)})
	if fired(w, te) {
		t.Fatal("watch fired for an exit before its task started")
	}
	// Seen before expect: re-armed.
	w2 := te.Watch("sb")
	te.dispatch(runtime.TaskEvent{Kind: runtime.TaskExited, SandboxID: "sb", Pid: 7, At: started.Add(-time.Second)})
	if !te.Expect(w2, 7, started) || fired(w2, te) {
		t.Fatal("expect did not re-arm after an exit of an earlier process with the same pid")
	}
	te.dispatch(runtime.TaskEvent{Kind: runtime.TaskExited, SandboxID: "sb", Pid: 7, At: started.Add(time.Second)})
	if !fired(w, te) || !fired(w2, te) {
		t.Error("watches did not fire for their task's own exit")
	}
}

// records answers Get from a table of sandboxes and errors.
type records struct {
	sandboxes map[string]runtime.Sandbox
	err       error
}

func (r *records) TaskEvents(context.Context) (<-chan runtime.TaskEvent, <-chan error) {
	return nil, nil
}

func (r *records) Get(_ context.Context, id string) (runtime.Sandbox, error) {
	if r.err != nil {
		return runtime.Sandbox{}, r.err
	}
	sb, ok := r.sandboxes[id]
	if !ok {
		return runtime.Sandbox{}, runtime.ErrSandboxNotFound
	}
	return sb, nil
}

// TestResyncOnlyOnContainerdsWord: after the event stream broke, watches
// fire for tasks containerd says are gone, never for tasks it could not
// answer about (it is down): their execs must keep running, as they do.
func TestResyncOnlyOnContainerdsWord(t *testing.T) {
	rec := &records{sandboxes: map[string]runtime.Sandbox{"up": {ID: "up", Running: true, TaskPID: 7}}}
	te := NewTaskEvents(rec, discard)
	up, gone := te.Watch("up"), te.Watch("gone")
	te.Expect(up, 7, time.Time{})
	te.Expect(gone, 8, time.Time{})

	rec.err = &runtime.UnavailableError{Op: "read sandbox", Err: errors.New("connection refused")}
	if te.resync(context.Background()) {
		t.Error("resync reported complete while containerd did not answer")
	}
	if fired(up, te) || fired(gone, te) {
		t.Fatal("a watch fired while containerd could not say whether its task runs")
	}
	rec.err = nil
	if !te.resync(context.Background()) {
		t.Error("resync reported incomplete with containerd answering")
	}
	if fired(up, te) || !fired(gone, te) {
		t.Errorf("after a resync: running task's watch fired %v, deleted task's %v; want only the deleted one", fired(up, te), fired(gone, te))
	}
}
