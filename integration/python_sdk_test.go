package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestPythonSDK runs the Python SDK's own tests (clients/python/tests, with
// Python's unittest) against a real berthd: the bot loop, typed errors, a
// timeout that stops the command, 64 MiB of output to a slow consumer,
// upload_dir/download_dir with symlinks and modes, port forwarding, and the
// wheel installed into a fresh venv. The caller is root on berthd's unix
// socket. /usr/bin/python3 with python3-grpcio, python3-protobuf,
// python3-setuptools, python3-wheel, python3-venv and python3-pip comes
// from scripts/deps.sh; under BERTH_E2E a missing part fails the test, and
// so do the Python tests themselves (BERTH_E2E reaches them).
func TestPythonSDK(t *testing.T) {
	e := startClientBerthd(t, "pysdk")
	const python = "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		missing(t, "%s (scripts/deps.sh installs it): %v", python, err)
	}
	if out, err := exec.Command(python, "-c", "import grpc, google.protobuf, setuptools, wheel, venv, pip").CombinedOutput(); err != nil {
		missing(t, "Python modules of scripts/deps.sh (python3-grpcio, -protobuf, -setuptools, -wheel, -venv, -pip): %v\n%s", err, out)
	}
	cmd := exec.Command(python, "-m", "unittest", "discover", "-v", "-s", filepath.Join("clients", "python", "tests"))
	cmd.Dir = env.repo
	cmd.Env = append(os.Environ(), "BERTH_ADDR=unix://"+e.sock, "BERTH_IMAGE="+baseImage, "BERTH_TOKEN=", "BERTH_TOKEN_FILE=")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("python3 -m unittest (clients/python/tests): %v\n%s", err, out.String())
	}
	// unittest says OK also when everything skipped: each test must have run.
	for _, name := range []string{"test_bot_loop", "test_streamed_64mib_slow_consumer", "test_upload_download_dir_keeps_symlinks_and_modes",
		"test_port_forward", "test_background_commands", "test_session", "test_volume", "test_state", "test_watch", "test_code_context", "test_wheel_installs_in_a_venv", "test_retry_policy", "test_session_and_context_reasons",
		"test_bad_numbers_raise_invalid_argument_naming_the_parameter", "test_unreadable_subdirectory_keeps_all_entries"} {
		if !strings.Contains(out.String(), name+" ") || strings.Contains(out.String(), "skipped") {
			t.Errorf("unittest output does not show %s run (or something skipped):\n%s", name, out.String())
		}
	}
	t.Logf("python SDK tests:\n%s", out.String())
}
