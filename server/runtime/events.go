package runtime

import (
	"context"
	"fmt"
	"time"

	apievents "github.com/containerd/containerd/api/events"
	"github.com/containerd/typeurl/v2"
)

// TaskEventKind says what happened to a sandbox's task.
type TaskEventKind int

const (
	// TaskExited: the task's init process (the agent, PID 1) exited or was
	// killed; the whole pid namespace died with it (containerd /tasks/exit).
	TaskExited TaskEventKind = iota + 1
	// TaskOOM: the kernel's OOM killer killed a process in the sandbox's
	// cgroup (containerd /tasks/oom).
	TaskOOM
	// TaskDeleted: the task was deleted (containerd /tasks/delete).
	TaskDeleted
	// TaskStarted: a task was started for the sandbox (containerd
	// /tasks/start).
	TaskStarted
)

func (k TaskEventKind) String() string {
	switch k {
	case TaskExited:
		return "exit"
	case TaskOOM:
		return "oom"
	case TaskDeleted:
		return "delete"
	case TaskStarted:
		return "start"
	}
	return fmt.Sprintf("TaskEventKind(%d)", int(k))
}

// TaskEvent is one containerd task event of a sandbox in the runtime's
// namespace.
type TaskEvent struct {
	Kind TaskEventKind
	// SandboxID is the container id.
	SandboxID string
	// Pid is the host pid of the task's init process (exit, delete, start);
	// zero for OOM.
	Pid uint32
	// ExitStatus is the init process's exit status as containerd reports it
	// (128+N when killed by signal N); set for exit and delete.
	ExitStatus uint32
	// At is when it happened: the exit time for exits, containerd's event
	// time otherwise.
	At time.Time
}

// taskTopics are the containerd event topics TaskEvents subscribes to.
var taskTopics = []string{"/tasks/exit", "/tasks/oom", "/tasks/delete", "/tasks/start"}

// TaskEvents subscribes to containerd's task events in the runtime's
// namespace. Events arrive on the first channel in containerd's order until
// ctx ends or the subscription fails; then the error channel receives the
// cause (nil when ctx ended) and both channels are closed. Exits of processes
// other than a task's init (containerd execs, which berth does not use) are
// dropped. Events published while nobody is subscribed are lost: a caller
// that resubscribes must re-check the tasks it cares about.
func (r *Runtime) TaskEvents(ctx context.Context) (<-chan TaskEvent, <-chan error) {
	filters := make([]string, len(taskTopics))
	for i, t := range taskTopics {
		// Comma is AND within a filter; separate filters are ORed.
		filters[i] = fmt.Sprintf("namespace==%q,topic==%q", r.cfg.Namespace, t)
	}
	envelopes, errs := r.client.Subscribe(ctx, filters...)
	out := make(chan TaskEvent, 64)
	outErr := make(chan error, 1)
	go func() {
		defer close(outErr)
		defer close(out)
		for {
			select {
			case env, ok := <-envelopes:
				if !ok {
					outErr <- fmt.Errorf("containerd event stream closed")
					return
				}
				ev, ok := decodeTaskEvent(env.Timestamp, env.Event)
				if !ok {
					continue
				}
				select {
				case out <- ev:
				case <-ctx.Done():
					outErr <- nil
					return
				}
			case err := <-errs:
				if ctx.Err() != nil {
					err = nil
				} else if err == nil {
					err = fmt.Errorf("containerd event stream ended")
				}
				outErr <- err
				return
			}
		}
	}()
	return out, outErr
}

// decodeTaskEvent turns a containerd event into a TaskEvent; it reports
// false for events berth does not act on.
func decodeTaskEvent(at time.Time, payload typeurl.Any) (TaskEvent, bool) {
	if payload == nil {
		return TaskEvent{}, false
	}
	v, err := typeurl.UnmarshalAny(payload)
	if err != nil {
		return TaskEvent{}, false
	}
	switch e := v.(type) {
	case *apievents.TaskExit:
		if e.ID != e.ContainerID {
			return TaskEvent{}, false // a containerd exec, not the init process
		}
		ev := TaskEvent{Kind: TaskExited, SandboxID: e.ContainerID, Pid: e.Pid, ExitStatus: e.ExitStatus, At: at}
		if e.ExitedAt != nil {
			ev.At = e.ExitedAt.AsTime()
		}
		return ev, true
	case *apievents.TaskOOM:
		return TaskEvent{Kind: TaskOOM, SandboxID: e.ContainerID, At: at}, true
	case *apievents.TaskDelete:
		if e.ID != "" && e.ID != e.ContainerID {
			return TaskEvent{}, false
		}
		return TaskEvent{Kind: TaskDeleted, SandboxID: e.ContainerID, Pid: e.Pid, ExitStatus: e.ExitStatus, At: at}, true
	case *apievents.TaskStart:
		return TaskEvent{Kind: TaskStarted, SandboxID: e.ContainerID, Pid: e.Pid, At: at}, true
	}
	return TaskEvent{}, false
}
