package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestPolyglotExamples runs examples/node and examples/python against a real
// berthd (the binary, with the limits the examples provoke): each creates a
// sandbox, streams an exec with stdin, reads a file, and decodes FleetBusy
// with RetryInfo, StaleHandle, Unreachable and RuntimeReplaced with their
// ErrorInfo. They call on berthd's unix socket as root, which is how README
// says local callers authenticate (the socket peer's uid). The tools come
// from scripts/deps.sh and the Node client from `make clients`; under
// BERTH_E2E a missing one fails the test.
func TestPolyglotExamples(t *testing.T) {
	e := startClientBerthd(t, "polyglot", "--max-execs-per-sandbox", "1", "--task-restart-limit", "1")

	for _, tc := range []struct {
		name   string
		argv   []string
		needed string // what must exist first
	}{
		{"node", []string{"node", "examples/node/example.js"}, "clients/typescript/dist/index.js"},
		{"python", []string{"/usr/bin/python3", "examples/python/example.py"}, "clients/python/berth/v1/sandbox_pb2_grpc.py"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := os.Stat(filepath.Join(env.repo, tc.needed)); err != nil {
				missing(t, "%s (scripts/deps.sh and make clients make it): %v", tc.needed, err)
			}
			if _, err := exec.LookPath(tc.argv[0]); err != nil {
				missing(t, "%s (scripts/deps.sh installs it): %v", tc.argv[0], err)
			}
			cmd := exec.Command(tc.argv[0], tc.argv[1:]...)
			cmd.Dir = env.repo
			cmd.Env = append(os.Environ(), "BERTH_ADDR=unix://"+e.sock, "BERTH_IMAGE="+baseImage)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Run(); err != nil {
				t.Fatalf("%s: %v\n%s", strings.Join(tc.argv, " "), err, out.String())
			}
			for _, want := range []string{"hello from " + tc.name, "written in the sandbox", "FLEET_BUSY: 1 of 1 execs in use, retry after 1",
				"STALE_HANDLE: exec", "SANDBOX_UNREACHABLE: cause UNREACHABLE_CAUSE_TASK_STOPPED, ADMITTED_NOT_STARTED",
				"RUNTIME_REPLACED: cause REPLACED_CAUSE_SANDBOX_DELETED", tc.name + " example: ok"} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("%s example output lacks %q:\n%s", tc.name, want, out.String())
				}
			}
			t.Logf("%s example:\n%s", tc.name, out.String())
		})
	}
}

// startClientBerthd starts a berthd binary with flags on a namespace of its
// own, listening on env.dir/<name>.sock, with the base image imported: what
// the tests of the other languages' clients call.
func startClientBerthd(t *testing.T, name string, flags ...string) *berthEnv {
	t.Helper()
	need(t)
	rt, ns, stateDir := newNamespaceRuntime(t, name)
	e := &berthEnv{ns: ns, stateDir: stateDir, rt: rt, sock: env.dir + "/" + name + ".sock"}
	startBerthd(t, e, append(flags, "--log-level", "INFO")...)
	e.importBase(t)
	return e
}

// missing fails t under BERTH_E2E (CI) and skips it otherwise.
func missing(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("BERTH_E2E") == "1" {
		t.Fatalf("missing: "+format, args...)
	}
	t.Skipf("missing: "+format, args...)
}
