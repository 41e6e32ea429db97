package integration

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/internal/e2e"
)

// grpcurl finds the grpcurl binary (scripts/deps.sh installs it with go
// install). Under BERTH_E2E=1 a missing grpcurl fails the test.
func grpcurl(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("grpcurl"); err == nil {
		return p
	}
	gobin, _ := exec.Command("go", "env", "GOPATH").Output()
	p := filepath.Join(strings.TrimSpace(string(gobin)), "bin", "grpcurl")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	e2e.Missing(t, "grpcurl not found; scripts/deps.sh installs it")
	return ""
}

// TestGrpcurl drives berthd the way an operator does: through server
// reflection, with grpcurl listing the services, calling Run, and reading a
// typed error.
func TestGrpcurl(t *testing.T) {
	need(t)
	bin := grpcurl(t)
	sock := strings.TrimPrefix(env.berthdAddr, "unix://")
	call := func(args ...string) (string, int) {
		cmd := exec.Command(bin, append([]string{"-plaintext", "-unix"}, args...)...)
		out, err := cmd.CombinedOutput()
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			return string(out), exitErr.ExitCode()
		}
		if err != nil {
			t.Fatalf("grpcurl %v: %v", args, err)
		}
		return string(out), 0
	}

	out, code := call(sock, "list")
	for _, svc := range []string{"berth.v1.SandboxService", "berth.v1.ImageService", "grpc.health.v1.Health"} {
		if code != 0 || !strings.Contains(out, svc) {
			t.Errorf("grpcurl list = %q (exit %d), want %s listed", out, code, svc)
		}
	}

	sb := newSandbox(t, nil)
	out, code = call("-d", `{"sandbox_id":"`+sb.GetId()+`","process":{"argv":["echo","hi from grpcurl"]}}`, sock, "berth.v1.SandboxService/Run")
	if code != 0 {
		t.Fatalf("grpcurl Run: exit %d: %s", code, out)
	}
	var resp struct {
		Stdout string `json:"stdout"`
		Result struct {
			ExitCode *int `json:"exitCode"`
		} `json:"result"`
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatalf("grpcurl Run output %q: %v", out, err)
	}
	// bytes are base64 in protojson: "hi from grpcurl\n".
	// exit_code has explicit presence: 0 is in the JSON too.
	if resp.Stdout != "aGkgZnJvbSBncnBjdXJsCg==" || resp.Result.ExitCode == nil || *resp.Result.ExitCode != 0 {
		t.Errorf("grpcurl Run = %q, want stdout base64 of %q and \"exitCode\": 0", out, "hi from grpcurl\n")
	}

	// grpcurl exits 64 + the gRPC code and prints the ErrorInfo detail.
	out, code = call("-d", `{"sandbox_id":"no-such-sandbox"}`, sock, "berth.v1.SandboxService/GetSandbox")
	if code != 64+5 || !strings.Contains(out, "SANDBOX_NOT_FOUND") || !strings.Contains(out, "google.rpc.ErrorInfo") {
		t.Errorf("grpcurl GetSandbox(unknown) = %q (exit %d), want exit 69 with an ErrorInfo of reason SANDBOX_NOT_FOUND", out, code)
	}
}
