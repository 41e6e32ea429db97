//go:build debian

package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestDebianImage imports a real Debian root file system (debootstrap
// minbase with python3, git and iputils-ping, built by
// scripts/debian-image.sh; `make test-debian` runs it) with one command,
// checks that its owners came through, and runs the unit tests of a Python
// project copied in with berth cp.
func TestDebianImage(t *testing.T) {
	need(t)
	root := os.Getenv("BERTH_DEBIAN_ROOT")
	if root == "" {
		t.Fatal("BERTH_DEBIAN_ROOT is not set: run make test-debian (scripts/debian-image.sh builds the tree)")
	}
	const ref = "test.berth.dev/debian:bookworm"
	start := time.Now()
	out, errOut, code := berthCLI(t, nil, "image", "import", "--name", ref, root)
	if code != 0 || !strings.HasPrefix(out, ref+" sha256:") {
		t.Fatalf("berth image import: exit %d: %s%s", code, out, errOut)
	}
	t.Logf("imported %s in %v", root, time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() { berthCLI(t, nil, "image", "rm", ref) })
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{Image: ref})
	id := sb.GetId()

	for cmd, want := range map[string]string{
		"stat -c '%G %a' /etc/shadow":      "shadow 640\n",
		"stat -c '%U:%G %a' /var/mail":     "root:mail 2775\n",
		"stat -c '%G %a' /usr/bin/chage":   "shadow 2755\n",
		`printf '%s %s\n' "$HOME" "$USER"`: "/root root\n",
	} {
		if got := string(runSh(t, id, cmd).GetStdout()); got != want {
			t.Errorf("%s = %q, want %q", cmd, got, want)
		}
	}
	// iputils' ping uses an ICMP datagram socket (ping_group_range), no
	// capability; the hostname is in /etc/hosts.
	if r := runSh(t, id, `ping -c1 -W5 "$(hostname)"`); r.GetResult().GetExitCode() != 0 {
		t.Errorf("ping -c1 $(hostname): exit %d: %s%s", r.GetResult().GetExitCode(), r.GetStdout(), r.GetStderr())
	}

	// A Python project, copied in with berth cp, runs its unit tests.
	proj := filepath.Join(t.TempDir(), "proj")
	for name, body := range map[string]string{
		"calc/__init__.py":     "",
		"calc/ops.py":          "def add(a, b):\n    return a + b\n",
		"tests/__init__.py":    "",
		"tests/test_ops.py":    "import unittest\nfrom calc.ops import add\n\nclass TestAdd(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n",
		"scripts/run-tests.sh": "#!/bin/sh\nexec python3 -m unittest -v\n",
	} {
		os.MkdirAll(filepath.Join(proj, filepath.Dir(name)), 0o755)
		os.WriteFile(filepath.Join(proj, name), []byte(body), 0o644)
	}
	os.Chmod(filepath.Join(proj, "scripts/run-tests.sh"), 0o755)
	if _, errOut, code := berthCLI(t, nil, "cp", proj, id+":/workspace/"); code != 0 {
		t.Fatalf("berth cp: exit %d: %s", code, errOut)
	}
	r := runSh(t, id, "cd /workspace/proj && scripts/run-tests.sh")
	if r.GetResult().GetExitCode() != 0 || !strings.Contains(string(r.GetStderr()), "Ran 1 test") || !strings.Contains(string(r.GetStderr()), "\nOK\n") {
		t.Errorf("python3 -m unittest: exit %d: %s", r.GetResult().GetExitCode(), r.GetStderr())
	}
	// git with a global config in HOME.
	r = runSh(t, id, "cd /workspace/proj && git init -q && git config --global user.email dev@example.com && git config --global user.name dev && git add -A && git commit -qm init && git log --oneline | wc -l")
	if string(r.GetStdout()) != "1\n" {
		t.Errorf("git: exit %d: %s%s", r.GetResult().GetExitCode(), r.GetStdout(), r.GetStderr())
	}
}
