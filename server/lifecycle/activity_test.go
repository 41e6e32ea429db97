package lifecycle

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/auth"
	"github.com/berth-sandbox/berth/server/runtimes"
)

// TestActivityOnlyFromWhoSeesTheSandbox: a request naming a sandbox keeps
// it busy (not idle) while it lasts when it comes from the owner, an admin,
// or before berthd knows the owner; another principal's request, which
// gets NOT_FOUND, does not keep it from idling out (the red team counted
// such calls as activity and no test noticed).
func TestActivityOnlyFromWhoSeesTheSandbox(t *testing.T) {
	s := &Manager{ids: runtimes.NewRegistry("", discard), reaper: NewReaper(ReaperConfig{}, nil, nil, discard)}
	const id = "sb-activity"
	s.reaper.Track(id, Limits{IdleTimeout: time.Hour, CreatedAt: time.Now()})
	busy := func() bool {
		st, ok := s.reaper.Status(id)
		if !ok {
			t.Fatal("the sandbox is not tracked")
		}
		return st.Busy
	}
	as := func(p auth.Principal) context.Context { return auth.NewContext(context.Background(), p) }

	// Owner unknown yet: every request counts.
	end := s.beginActivity(as(auth.Principal{Name: "mallory"}), id)
	if !busy() {
		t.Error("a request before berthd knows the owner did not count")
	}
	end()

	s.ids.Observe(id, apierr.Runtime{BootID: boot(1), TaskPID: 10})
	s.ids.SetOwner(id, boot(1), "alice")
	for _, tc := range []struct {
		p     auth.Principal
		count bool
	}{
		{auth.Principal{Name: "alice"}, true},
		{auth.Principal{Name: "root", Admin: true}, true},
		{auth.Principal{Name: "mallory"}, false},
	} {
		end := s.beginActivity(as(tc.p), id)
		if got := busy(); got != tc.count {
			t.Errorf("a request of %v: busy = %v, want %v", tc.p, got, tc.count)
		}
		end()
		if busy() {
			t.Errorf("still busy after %v's request ended", tc.p)
		}
	}
}

func boot(n int) string { return fmt.Sprintf("%032x", n) }
