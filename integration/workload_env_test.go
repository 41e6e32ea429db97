package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// runSh runs a shell command in the sandbox through the Run RPC.
func runSh(t *testing.T, sandboxID, cmd string) *berthv1.RunResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: sandboxID, Process: &berthv1.ProcessSpec{ShellCommand: cmd}})
	if err != nil {
		t.Fatalf("Run(%q): %v", cmd, err)
	}
	return resp
}

// TestWorkloadEnvironment checks what a process finds as docker would
// give it: the workload user's HOME, USER, LOGNAME and SHELL from the
// image's /etc/passwd (HOME from the sandbox's env wins), a PATH, its
// hostname in /etc/hosts, and shell errors that say "sh:".
func TestWorkloadEnvironment(t *testing.T) {
	need(t)
	show := `printf '%s|%s|%s|%s|%s\n' "$HOME" "$USER" "$LOGNAME" "$SHELL" "$PATH"`
	for _, tt := range []struct {
		name string
		req  *berthv1.CreateSandboxRequest
		want string
	}{
		{"root", nil, "/root|root|root|/bin/bash|/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"},
		{"user 1000", &berthv1.CreateSandboxRequest{User: "1000:1000"}, "/home/berth|berth|berth|/bin/bash|/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"},
		{"user without an entry", &berthv1.CreateSandboxRequest{User: "4242"}, "/||||/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"},
		{"HOME from the sandbox's env", &berthv1.CreateSandboxRequest{User: "1000:1000", Env: map[string]string{"HOME": "/tmp", "USER": "me"}}, "/tmp|me|berth|/bin/bash|/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sb := newSandbox(t, tt.req)
			want := tt.want
			if got := string(runSh(t, sb.GetId(), show).GetStdout()); got != want {
				t.Errorf("HOME|USER|LOGNAME|SHELL|PATH = %q, want %q", got, want)
			}
		})
	}

	sb := newSandbox(t, &berthv1.CreateSandboxRequest{User: "1000:1000"})
	// `git config --global` and friends need a HOME the user may write.
	if r := runSh(t, sb.GetId(), `touch "$HOME/.gitconfig" && echo ok`); string(r.GetStdout()) != "ok\n" {
		t.Errorf("writing in $HOME: %q %q", r.GetStdout(), r.GetStderr())
	}
	// The hostname resolves (busybox's ping then needs a raw socket,
	// which no sandbox process has: it says so, not "bad address").
	r := runSh(t, sb.GetId(), `grep -w "$(hostname)" /etc/hosts; ping -c1 "$(hostname)"`)
	if out := string(r.GetStdout()); !strings.Contains(out, "127.0.1.1\t"+sb.GetId()+"\n") || !strings.Contains(out, "PING "+sb.GetId()+" (127.0.1.1)") {
		t.Errorf("hostname lookup: stdout %q stderr %q", out, r.GetStderr())
	}
	// A shell's errors say "sh:", as sh -c does (argv[0] is "sh").
	if r := runSh(t, sb.GetId(), "no-such-command"); !strings.HasPrefix(string(r.GetStderr()), "sh: ") || r.GetResult().GetExitCode() != 127 {
		t.Errorf("a missing command: exit %d, stderr %q; want 127 and \"sh: ...\"", r.GetResult().GetExitCode(), r.GetStderr())
	}
}

// TestShmBytes sizes /dev/shm: 64 MiB by default (docker's) or a quarter
// of a smaller memory limit, shm_bytes otherwise, and 256 MiB hold 200 MiB;
// /dev/shm always leaves 32 MiB of the memory limit to processes.
func TestShmBytes(t *testing.T) {
	need(t)
	sb := newSandbox(t, nil)
	if got := sb.GetResources().GetShmBytes(); got != 64<<20 {
		t.Errorf("default shm_bytes = %d, want %d", got, 64<<20)
	}
	if got := string(runSh(t, sb.GetId(), `df -k /dev/shm | awk 'NR==2 {print $2}'`).GetStdout()); got != "65536\n" {
		t.Errorf("default /dev/shm size = %q KiB, want 65536", got)
	}
	if r := runSh(t, sb.GetId(), "dd if=/dev/zero of=/dev/shm/big bs=1M count=100"); r.GetResult().GetExitCode() == 0 {
		t.Errorf("100 MiB fit in the default /dev/shm")
	}

	big := newSandbox(t, &berthv1.CreateSandboxRequest{Resources: &berthv1.Resources{ShmBytes: 256 << 20}})
	if got := big.GetResources().GetShmBytes(); got != 256<<20 {
		t.Errorf("shm_bytes = %d, want %d", got, 256<<20)
	}
	r := runSh(t, big.GetId(), `dd if=/dev/zero of=/dev/shm/big bs=1M count=200 2>/dev/null && ls -l /dev/shm/big | awk '{print $5}'`)
	if got := string(r.GetStdout()); got != "209715200\n" {
		t.Errorf("200 MiB in a 256 MiB /dev/shm: %q %q", got, r.GetStderr())
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, shm := range []uint64{128 << 20, 48 << 20} {
		_, err := env.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, Resources: &berthv1.Resources{MemoryBytes: 64 << 20, ShmBytes: shm}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "resources.shm_bytes") {
			t.Errorf("shm_bytes %d MiB with memory_bytes 64 MiB: %v, want INVALID_ARGUMENT naming resources.shm_bytes (32 MiB stay outside /dev/shm)", shm>>20, err)
		}
	}

	// A small sandbox's default /dev/shm is a quarter of its memory: filled
	// to the brim, it leaves the agent and the next command room.
	small := newSandbox(t, &berthv1.CreateSandboxRequest{Resources: &berthv1.Resources{MemoryBytes: 64 << 20}})
	if got := small.GetResources().GetShmBytes(); got != 16<<20 {
		t.Errorf("default shm_bytes with memory_bytes 64 MiB = %d, want 16 MiB", got)
	}
	boot := small.GetRuntime().GetAgentBootId()
	runSh(t, small.GetId(), "dd if=/dev/zero of=/dev/shm/fill bs=1M count=64 2>/dev/null; true")
	r = runSh(t, small.GetId(), "ls -l /dev/shm/fill | awk '{print $5}'; echo alive")
	if got := string(r.GetStdout()); got != fmt.Sprintf("%d\nalive\n", 16<<20) {
		t.Errorf("after filling /dev/shm: %q, want the 16 MiB file and the next command running", got)
	}
	if got := bootID(t, small.GetId()); got != boot {
		t.Errorf("the agent was replaced (boot %s, now %s) after /dev/shm was filled", boot, got)
	}
}
