package agent_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/berth-sandbox/berth/internal/e2e"
)

// TestWorkloadUser checks that --user makes processes run as that uid and
// gid with no supplementary groups.
func TestWorkloadUser(t *testing.T) {
	e2e.NeedRoot(t, "switching users")
	a := startAgent(t, "--user", "65534:65533")
	spec := shell("id -u; id -g; id -G")
	spec.Cwd = "/" // the test's workdir is private to root
	r := a.run(t, "user", spec)
	if got, want := string(r.stdout), "65534\n65533\n65533\n"; got != want {
		t.Errorf("id as --user 65534:65533 = %q (stderr %q, result %v), want %q", got, r.stderr, r.result, want)
	}
}

// TestWorkDirOwnedByWorkloadUser checks that the agent gives the working
// directory it creates to the workload user.
func TestWorkDirOwnedByWorkloadUser(t *testing.T) {
	e2e.NeedRoot(t, "chown")
	a := startAgent(t, "--user", "65534:65533")
	fi, err := os.Stat(filepath.Join(a.dir, "work"))
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if st.Uid != 65534 || st.Gid != 65533 {
		t.Errorf("workdir owner = %d:%d, want 65534:65533", st.Uid, st.Gid)
	}
}
