// Package e2e decides what a test does when a part of its environment is
// missing (root, a cgroup controller, a tool scripts/deps.sh installs): it
// skips on a developer's machine, and fails where CI asks for every test
// with BERTH_E2E=1, so that a test CI should run never passes by not
// running; and CopyFile, which the end-to-end tests of both modules
// (integration/, kubernetes/integration/) use. Tests only.
package e2e

import (
	"os"
	"path/filepath"
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
