package integration

import (
	"fmt"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/internal/sandboxid"
)

// TestCLIVolumeSessionWatch drives the volume, session and watch commands
// of the CLI against a real berthd: `berth volume create`, `berth sandbox
// create --volume` twice (read-write and :ro), `berth volume ls` with the
// users, `berth volume rm` refused in use then done; `berth session
// create`, `berth exec --session` keeping cwd and variables, `berth
// session ls|rm`; `berth watch --count` printing the creations in order.
func TestCLIVolumeSessionWatch(t *testing.T) {
	need(t)
	name := "cli-" + sandboxid.New("", 6)
	if out, code := berthOut(t, "volume", "create", "--quota-bytes", fmt.Sprint(4<<20), name); code != 0 || out != name+"\n" {
		t.Fatalf("volume create = %q, exit %d", out, code)
	}
	t.Cleanup(func() { berthCLI(t, nil, "volume", "rm", name) })
	create := func(args ...string) string {
		t.Helper()
		out, code := berthOut(t, append([]string{"sandbox", "create", "--image", env.image}, args...)...)
		if code != 0 {
			t.Fatalf("sandbox create %q: exit %d", args, code)
		}
		id := strings.TrimSpace(out)
		t.Cleanup(func() { berthCLI(t, nil, "sandbox", "rm", id) })
		return id
	}
	rw := create("--volume", name+":/data")
	ro := create("-v", name+":/ro:ro")
	if out, code := berthOut(t, "exec", "--shell", "echo via-cli > /data/f", rw); code != 0 {
		t.Fatalf("write into the volume: exit %d %s", code, out)
	}
	if out, code := berthOut(t, "exec", ro, "--", "cat", "/ro/f"); code != 0 || out != "via-cli\n" {
		t.Errorf("read-only mount reads %q, exit %d", out, code)
	}
	if _, errOut, code := berthCLI(t, nil, "exec", "--shell", "echo x > /ro/g", ro); code == 0 || !strings.Contains(errOut, "Read-only file system") {
		t.Errorf("write into the read-only mount: exit %d, stderr %q; want EROFS", code, errOut)
	}
	out, code := berthOut(t, "volume", "ls")
	if code != 0 || !strings.Contains(out, name) || !strings.Contains(out, rw) || !strings.Contains(out, ro) || !strings.Contains(out, "4.0 MiB") {
		t.Errorf("volume ls = %q, exit %d; want %s with its quota and both sandboxes", out, code, name)
	}
	if _, errOut, code := berthCLI(t, nil, "volume", "rm", name); code == 0 || !strings.Contains(errOut, "VOLUME_IN_USE") && !strings.Contains(errOut, "mounted by") {
		t.Errorf("volume rm in use: exit %d, stderr %q; want a refusal naming the sandboxes", code, errOut)
	}

	sess, code := berthOut(t, "session", "create", "--bash", "--name", "cli", rw)
	sess = strings.TrimSpace(sess)
	if code != 0 || sess == "" {
		t.Fatalf("session create: %q exit %d", sess, code)
	}
	if _, code := berthOut(t, "exec", "--session", sess, "--shell", "cd /tmp; export A=1; f() { echo $A; }", rw); code != 0 {
		t.Fatalf("exec --session: exit %d", code)
	}
	if out, code := berthOut(t, "exec", "--session", sess, "--shell", "pwd; f", rw); code != 0 || out != "/tmp\n1\n" {
		t.Errorf("exec --session 'pwd; f' = %q, exit %d; want /tmp and 1", out, code)
	}
	if _, _, code := berthCLI(t, nil, "exec", "--session", sess, "--shell", "false", rw); code != 1 {
		t.Errorf("exec --session false: exit %d, want 1", code)
	}
	if out, code := berthOut(t, "session", "ls", rw); code != 0 || !strings.Contains(out, sess) || !strings.Contains(out, "bash") {
		t.Errorf("session ls = %q, exit %d", out, code)
	}
	if out, code := berthOut(t, "session", "rm", rw, sess); code != 0 || !strings.Contains(out, sess) {
		t.Errorf("session rm = %q, exit %d", out, code)
	}
	if out, _ := berthOut(t, "session", "ls", rw); strings.Contains(out, sess) {
		t.Errorf("session ls after rm still lists %s: %q", sess, out)
	}

	berthOut(t, "exec", rw, "--", "mkdir", "-p", "/workspace/w")
	done := make(chan struct{})
	var watchOut, watchErr string
	var watchCode int
	go func() {
		defer close(done)
		watchOut, watchErr, watchCode = berthCLI(t, nil, "watch", "--count", "3", "--include", "n-*", rw, "/workspace/w")
	}()
	// The watch starts before its first line; files made before it would
	// be missed, so each round makes the next files until the watch ends.
	for i := 1; ; i++ {
		select {
		case <-done:
		default:
			berthOut(t, "exec", "--shell", fmt.Sprintf(": > /workspace/w/n-%d", i), rw)
			continue
		}
		break
	}
	lines := strings.Split(strings.TrimSpace(watchOut), "\n")
	if watchCode != 0 || len(lines) != 4 || !strings.HasPrefix(lines[0], "watch wt-") {
		t.Fatalf("watch --count 3 = %q (exit %d, %s); want the watch line and 3 events", watchOut, watchCode, watchErr)
	}
	for i, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) != 3 || f[1] != "create" || !strings.HasPrefix(f[2], "/workspace/w/n-") {
			t.Errorf("watch event line %d = %q, want SEQ create /workspace/w/n-N", i, l)
		}
	}
}
