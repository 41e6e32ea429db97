package integration

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// TestFilesGrpcurl runs the README's grpcurl recipes for Stat and ListDir
// and a FILE_NOT_FOUND error.
func TestFilesGrpcurl(t *testing.T) {
	need(t)
	bin := grpcurl(t)
	sock := strings.TrimPrefix(env.berthdAddr, "unix://")
	call := func(args ...string) (string, int) {
		out, err := exec.Command(bin, append([]string{"-plaintext", "-unix"}, args...)...).CombinedOutput()
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			return string(out), exitErr.ExitCode()
		}
		if err != nil {
			t.Fatalf("grpcurl %v: %v", args, err)
		}
		return string(out), 0
	}
	sb := newSandbox(t, nil)
	run(t, sb.GetId(), "sh", "-c", "mkdir -p /workspace/g/sub && echo hi > /workspace/g/sub/f")
	out, code := call("-d", `{"sandbox_id":"`+sb.GetId()+`","path":"/workspace/g/sub/f"}`, sock, "berth.v1.FileService/Stat")
	if code != 0 || !strings.Contains(out, `"displayPath": "/workspace/g/sub/f"`) || !strings.Contains(out, `"sizeBytes": "3"`) || !strings.Contains(out, "FILE_TYPE_REGULAR") {
		t.Errorf("grpcurl Stat = %s (exit %d)", out, code)
	}
	out, code = call("-d", `{"sandbox_id":"`+sb.GetId()+`","path":"/workspace/g","max_depth":2}`, sock, "berth.v1.FileService/ListDir")
	if code != 0 || !strings.Contains(out, `"displayPath": "/workspace/g/sub"`) || !strings.Contains(out, `"displayPath": "/workspace/g/sub/f"`) {
		t.Errorf("grpcurl ListDir = %s (exit %d)", out, code)
	}
	out, code = call("-d", `{"sandbox_id":"`+sb.GetId()+`","path":"/workspace/missing"}`, sock, "berth.v1.FileService/Stat")
	if code != 64+5 || !strings.Contains(out, "FILE_NOT_FOUND") || !strings.Contains(out, `"path": "/workspace/missing"`) {
		t.Errorf("grpcurl Stat of a missing path = %s (exit %d), want exit 69 and FILE_NOT_FOUND naming the path", out, code)
	}
}
