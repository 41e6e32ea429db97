package agent

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestStdioPipe checks stdioPipe's ends: both close-on-exec, the child's
// blocking (a program writing to a non-blocking stdout would meet EAGAIN),
// the agent's non-blocking and in the poller (a read deadline works), for
// an output pipe and for stdin; and that bytes go through.
func TestStdioPipe(t *testing.T) {
	for _, childReads := range []bool{false, true} {
		r, w, err := stdioPipe(childReads)
		if err != nil {
			t.Fatal(err)
		}
		parent, child := r, w
		if childReads {
			parent, child = w, r
		}
		for name, tt := range map[string]struct {
			fd       uintptr
			nonblock bool
		}{"agent's end": {parent.Fd(), true}, "child's end": {child.Fd(), false}} {
			fl, err := unix.FcntlInt(tt.fd, unix.F_GETFL, 0)
			if err != nil {
				t.Fatal(err)
			}
			fd, err := unix.FcntlInt(tt.fd, unix.F_GETFD, 0)
			if err != nil {
				t.Fatal(err)
			}
			if got := fl&unix.O_NONBLOCK != 0; got != tt.nonblock {
				t.Errorf("childReads %v, %s: O_NONBLOCK %v, want %v", childReads, name, got, tt.nonblock)
			}
			if fd&unix.FD_CLOEXEC == 0 {
				t.Errorf("childReads %v, %s: not close-on-exec", childReads, name)
			}
		}
		if childReads {
			if _, err := w.Write([]byte("in")); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 2)
			if n, err := r.Read(buf); err != nil || string(buf[:n]) != "in" {
				t.Errorf("stdin pipe read %q, %v; want \"in\"", buf[:n], err)
			}
		} else if err := r.SetReadDeadline(time.Now().Add(10 * time.Millisecond)); err != nil {
			t.Errorf("SetReadDeadline on the agent's end: %v, want it in the poller", err)
		}
		r.Close()
		w.Close()
	}
}
