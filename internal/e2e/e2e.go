// Package e2e decides what a test does when a part of its environment is
// missing (root, a cgroup controller, a tool scripts/deps.sh installs): it
// skips on a developer's machine, and fails where CI asks for every test
// with BERTH_E2E=1, so that a test CI should run never passes by not
// running; and CopyFile, which the end-to-end tests of both modules
// (integration/, kubernetes/integration/) use. Tests only.
package e2e

import (
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// Required reports whether BERTH_E2E=1 asks for every test to run.
func Required() bool { return os.Getenv("BERTH_E2E") == "1" }

// Missing ends the test because why (what is missing) holds: t.Fatal under
// BERTH_E2E=1, t.Skip otherwise.
func Missing(t testing.TB, why string) {
	t.Helper()
	if Required() {
		t.Fatal("BERTH_E2E=1 but the test cannot run: " + why)
	}
	t.Skip(why)
}

// NeedRoot ends the test with Missing unless it runs as root.
func NeedRoot(t testing.TB, what string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, what+" needs root")
	}
}

// CopyFile copies the file src to dst with mode, making dst's directories
// (0755); any failure fails t.
func CopyFile(t testing.TB, src, dst string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err == nil {
		err = os.MkdirAll(filepath.Dir(dst), 0o755)
	}
	if err == nil {
		err = os.WriteFile(dst, b, mode)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// UnmountUnder detaches (umount2(2) MNT_DETACH) every mount whose mount
// point is dir or under it, deepest first, as listed by
// /proc/self/mountinfo (proc(5): the fifth field, octal escapes such as
// \040 for a space). A test whose daemons are stopped without deleting
// their sandboxes calls it before removing dir, so that the sandboxes'
// root and run mounts do not outlive the test on the host. Failures are
// logged: a cleanup that cannot unmount leaves the mount to be seen.
func UnmountUnder(t testing.TB, dir string) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Logf("unmount under %s: %v", dir, err)
		return
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		p := unescapeMountinfo(f[4])
		if p == dir || strings.HasPrefix(p, dir+"/") {
			points = append(points, p)
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			t.Logf("unmount %s: %v", p, err)
		}
	}
}

// unescapeMountinfo undoes mountinfo's octal escapes (\ooo).
func unescapeMountinfo(s string) string {
	var out strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				out.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		out.WriteByte(s[i])
	}
	return out.String()
}
