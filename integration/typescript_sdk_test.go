package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestTypeScriptSDK runs the TypeScript SDK's own tests
// (clients/typescript/test, with `node --test`) against a real berthd: the
// bot loop, typed errors, a timeout that stops the command, 64 MiB of
// output to a slow consumer, uploadDir/downloadDir with symlinks and modes,
// port forwarding, background commands, and the tarball of
// scripts/ts-sdk.sh installed into a fresh project. The caller is root on
// berthd's unix socket. node and npm come from scripts/deps.sh and dist/
// from `make clients`; under BERTH_E2E a missing part fails the test, and
// so do the node tests themselves.
func TestTypeScriptSDK(t *testing.T) {
	e := startClientBerthd(t, "tssdk")
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing(t, "%s (scripts/deps.sh installs it): %v", tool, err)
		}
	}
	if _, err := os.Stat(filepath.Join(env.repo, "clients", "typescript", "dist", "index.js")); err != nil {
		missing(t, "clients/typescript/dist (make clients builds it): %v", err)
	}
	args := []string{"--test", "--test-reporter=spec"}
	if p := os.Getenv("BERTH_TS_TEST_PATTERN"); p != "" { // to run one test while working on it
		args = append(args, "--test-name-pattern="+p)
	}
	cmd := exec.Command("node", append(args, "test/")...)
	cmd.Dir = filepath.Join(env.repo, "clients", "typescript")
	cmd.Env = append(os.Environ(), "BERTH_ADDR=unix://"+e.sock, "BERTH_IMAGE="+baseImage, "BERTH_TOKEN=", "BERTH_TOKEN_FILE=")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("node --test (clients/typescript/test): %v\n%s", err, out.String())
	}
	if os.Getenv("BERTH_TS_TEST_PATTERN") != "" {
		t.Logf("TypeScript SDK tests matching $BERTH_TS_TEST_PATTERN:\n%s", out.String())
		return
	}
	// node --test passes when tests are skipped or todo: each must have run.
	for _, name := range []string{"bot loop", "64 MiB streamed to a slow consumer", "uploadDir and downloadDir keep symlinks and modes",
		"port forward", "background commands", "the packed tarball installs into a fresh project", "examples/node/bot.js",
		"shell session keeps state between commands", "files.watch resumes without missing or repeating",
		"volume shared between sandboxes, refused deletion in use", "pause, resume, snapshot, fork, commit and hibernate",
		"a status's ErrorInfo reason chooses the class", "the retry policy waits the RetryInfo delay",
		"sessions.create and sessions.list give SessionInfo with numbers", "files.list depth -1 rejects with InvalidArgument naming depth",
		"an unreadable subdirectory keeps every entry listed"} {
		if !strings.Contains(out.String(), "✔ "+name) {
			t.Errorf("node --test output does not show %q passed:\n%s", name, out.String())
		}
	}
	for _, want := range []string{"ℹ skipped 0", "ℹ todo 0"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("node --test output lacks %q (a test skipped):\n%s", want, out.String())
		}
	}
	t.Logf("TypeScript SDK tests:\n%s", out.String())
}
