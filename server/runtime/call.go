package runtime

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// UnavailableError says a call to containerd failed because containerd did
// not answer: it refused the connection (not running, its socket gone), or
// it took longer than Config.CallBudget (stopped, hung, overloaded). Every
// method of Runtime returns one, wrapping containerd's error, in that case;
// a caller's own cancellation or deadline is never reported as one.
type UnavailableError struct {
	// Op says what berthd asked containerd, e.g. "read sandbox sb-1".
	Op string
	// Slow is true when containerd did not answer within Budget; false
	// when it refused the connection.
	Slow bool
	// Waited is how long the call took.
	Waited time.Duration
	// Budget is Config.CallBudget, or Config.CreateWorkLimit for the long
	// work of a create.
	Budget time.Duration
	// Changed is true when the call may have changed containerd's state
	// before it failed: a container or task may exist, or be gone, in
	// part.
	Changed bool
	// Err is containerd's error.
	Err error
}

func (e *UnavailableError) Error() string {
	what := "containerd refused the connection"
	if e.Slow {
		what = fmt.Sprintf("containerd did not answer within %v", e.Budget)
	}
	return fmt.Sprintf("%s: %s (after %v): %v", e.Op, what, e.Waited.Round(time.Millisecond), e.Err)
}

func (e *UnavailableError) Unwrap() error { return e.Err }

// HostError says an operation failed for want of a resource of berthd's own
// host: the disk of its state directory is full (ENOSPC, EDQUOT) or berthd
// is out of file descriptors (EMFILE, ENFILE).
type HostError struct {
	// Op says what berthd was doing, e.g. "create sandbox sb-1".
	Op string
	// Changed is true when the operation may have changed containerd's
	// state before it failed.
	Changed bool
	// Err is the failure; errors.As finds its syscall.Errno.
	Err error
}

func (e *HostError) Error() string { return fmt.Sprintf("%s: %v", e.Op, e.Err) }

func (e *HostError) Unwrap() error { return e.Err }

// PoolFullError says an operation failed because the file system that
// holds the sandboxes' writable snapshots is full: containerd's snapshotter
// (preparing or unpacking a snapshot, runc writing into the root)
// reported ENOSPC or EDQUOT, or berthd's own call did inside the pool (in
// a sandbox's mounted root, a snapshot it mounted to chown, a quota
// group). It is the pool's condition, not berthd's state directory's, nor
// a caller's mistake: server/status answers RESOURCE_EXHAUSTED NO_SPACE
// naming the pool (issue 21).
type PoolFullError struct {
	// Pool names the file system: "the btrfs pool DIR" (the btrfs
	// snapshotter's root) when disk quotas are on, else "containerd's NAME
	// snapshotter".
	Pool string
	// Op says what berthd was doing, e.g. "create sandbox sb-1".
	Op string
	// Changed is true when the operation may have changed containerd's
	// state before it failed.
	Changed bool
	// Err is the failure.
	Err error
}

func (e *PoolFullError) Error() string {
	return fmt.Sprintf("%s: no space left in %s, which holds the sandboxes' file systems: %v", e.Op, e.Pool, e.Err)
}

func (e *PoolFullError) Unwrap() error { return e.Err }

// errnoTexts are the texts of the errnos of a full file system as
// containerd's errors carry them: its gRPC boundary keeps only the text of
// an errno (errdefs has no class for ENOSPC; the client turns the status
// into an errdefs error of code Unknown), and Go formats an errno with
// syscall.Errno.Error, so the text is the errno's own. runc's "open
// .../root/.berth-agent: no space left on device" reaches berthd so.
var errnoTexts = []string{syscall.ENOSPC.Error(), syscall.EDQUOT.Error()}

// poolName names the file system that holds the sandboxes' writable
// layers, for messages.
func (r *Runtime) poolName() string {
	if r.pool != "" {
		return "the btrfs pool " + r.pool
	}
	return "containerd's " + r.cfg.Snapshotter + " snapshotter"
}

// poolFull reports whether err says the pool (see PoolFullError) is full,
// and names it. An errno of berthd's own call counts when the call was
// not in berthd's state directory (SERVER_DISK_FULL) or was in a
// sandbox's root, which is mounted from the pool; without disk quotas
// berthd touches no pool and only containerd's report counts.
func (r *Runtime) poolFull(err error) (string, bool) {
	pool := r.poolName()
	if errno, ok := HostErrno(err); ok {
		if r.pool == "" || (errno != syscall.ENOSPC && errno != syscall.EDQUOT) {
			return "", false
		}
		var pe *fs.PathError
		if errors.As(err, &pe) && r.inStateDir(pe.Path) {
			return "", false
		}
		return pool, true
	}
	for _, t := range errnoTexts {
		if strings.Contains(err.Error(), t) {
			return pool, true
		}
	}
	return "", false
}

// inStateDir reports whether path is in berthd's state directory but not
// in a sandbox's root, which is a mount of its snapshot.
func (r *Runtime) inStateDir(path string) bool {
	rel, err := filepath.Rel(r.cfg.StateDir, path)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return false
	}
	parts := strings.Split(rel, string(filepath.Separator))
	return !(len(parts) > 3 && parts[0] == "s" && parts[2] == "root")
}

// HostErrno returns the errno of err when it is one of a host resource
// running out (ENOSPC, EDQUOT, EMFILE, ENFILE).
func HostErrno(err error) (syscall.Errno, bool) {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return 0, false
	}
	switch errno {
	case syscall.ENOSPC, syscall.EDQUOT, syscall.EMFILE, syscall.ENFILE:
		return errno, true
	}
	return 0, false
}

// call is one Runtime operation on containerd: it bounds each step with the
// call budget and classifies what failed.
type call struct {
	r        *Runtime
	parent   context.Context
	op       string
	began    time.Time
	budgeted bool // its steps take step's contexts
	changed  bool
}

// begin starts an operation op under ctx whose requests take step's
// contexts; end it with end.
func (r *Runtime) begin(ctx context.Context, op string) *call {
	return &call{r: r, parent: ctx, op: op, began: time.Now(), budgeted: true}
}

// beginLong starts an operation that moves data (an import, a pull) under
// ctx alone: only containerd refusing the connection is classified, since
// a deadline inside it may be a registry's.
func (r *Runtime) beginLong(ctx context.Context, op string) *call {
	return &call{r: r, parent: ctx, op: op, began: time.Now()}
}

// step returns a context for one request to containerd that should answer
// at once (reading or changing a record, creating or signalling a task):
// the caller's, bounded by Config.CallBudget.
func (c *call) step() (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.parent, c.r.cfg.CallBudget)
}

// mutation returns a context for one request to containerd that changes
// its state, bounded by Config.CallBudget but not ended when the caller
// gives up: containerd goes on with a request its client abandoned (a
// snapshot is prepared, a shim starts and creates the task's log file),
// so an abandoned request would leave what the caller's clean-up cannot
// see yet. The caller checks its own context after it.
func (c *call) mutation() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(c.parent), c.r.cfg.CallBudget)
}

// longWork classifies err, which ended work bounded by
// Config.CreateWorkLimit under work: running past the limit while the
// caller still waits is an *UnavailableError whose Budget is the limit.
func (c *call) longWork(work context.Context, err error) error {
	if c.parent.Err() == nil && (errors.Is(work.Err(), context.DeadlineExceeded) || c.workDeadline(work, err)) {
		return &UnavailableError{Op: c.op, Slow: true, Waited: time.Since(c.began), Budget: c.r.cfg.CreateWorkLimit, Changed: c.changed, Err: err}
	}
	return err
}

// deadlineSlack is how much sooner than the client containerd may end a
// request at the deadline the client sent it: the server counts from
// when the request reached it.
const deadlineSlack = 100 * time.Millisecond

// workDeadline reports whether err is containerd ending a request at
// work's own deadline (CreateWorkLimit, not the caller's) a moment before
// work's timer fired on this side.
func (c *call) workDeadline(work context.Context, err error) bool {
	if !errors.Is(err, context.DeadlineExceeded) && status.Code(err) != codes.DeadlineExceeded {
		return false
	}
	wd, ok := work.Deadline()
	if !ok || time.Until(wd) > deadlineSlack {
		return false
	}
	pd, ok := c.parent.Deadline()
	return !ok || pd.After(wd)
}

// changes notes that the next request may change containerd's state.
func (c *call) changes() { c.changed = true }

// end classifies *err: containerd refusing the connection, or a step's
// budget running out while the caller's context lives, becomes an
// *UnavailableError; the sandboxes' pool running out of space a
// *PoolFullError; the host's disk or descriptors running out a
// *HostError.
func (c *call) end(err *error) {
	if *err == nil || c.parent.Err() != nil {
		return
	}
	var (
		unavailable *UnavailableError
		host        *HostError
		full        *PoolFullError
	)
	if errors.As(*err, &unavailable) || errors.As(*err, &host) || errors.As(*err, &full) {
		return
	}
	if pool, ok := c.r.poolFull(*err); ok {
		*err = &PoolFullError{Pool: pool, Op: c.op, Changed: c.changed, Err: *err}
		return
	}
	if _, ok := HostErrno(*err); ok {
		*err = &HostError{Op: c.op, Changed: c.changed, Err: *err}
		return
	}
	e := &UnavailableError{Op: c.op, Waited: time.Since(c.began), Budget: c.r.cfg.CallBudget, Changed: c.changed, Err: *err}
	switch {
	case errdefs.IsUnavailable(*err) || status.Code(*err) == codes.Unavailable:
	case c.budgeted && (errors.Is(*err, context.DeadlineExceeded) || status.Code(*err) == codes.DeadlineExceeded):
		e.Slow = true
	default:
		return
	}
	*err = e
}
