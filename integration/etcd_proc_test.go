package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/agentbin"
	"github.com/berth-sandbox/berth/server/cluster"
)

// testEtcdEnv, set to "<data dir> <client URL> <peer URL>", makes the test
// binary run an embedded etcd (cluster.StartEmbedded, as berthd
// --etcd-embed does) until SIGTERM instead of the tests: an etcd process of
// its own that a test stops (SIGSTOP) and resumes (SIGCONT) under the
// nodes of a fleet.
const testEtcdEnv = "BERTH_TEST_ETCD"

func runTestEtcd() int {
	var dir, clientURL, peerURL string
	if _, err := fmt.Sscan(os.Getenv(testEtcdEnv), &dir, &clientURL, &peerURL); err != nil {
		fmt.Fprintf(os.Stderr, "%s=%q: want \"<dir> <client URL> <peer URL>\": %v\n", testEtcdEnv, os.Getenv(testEtcdEnv), err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	e, err := cluster.StartEmbedded(ctx, cluster.EmbedConfig{Dir: dir, ClientURL: clientURL, PeerURL: peerURL}, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Fprintln(os.Stderr, "test etcd serving")
	<-ctx.Done()
	e.Close()
	return 0
}

// etcdProc is an etcd process of a test's own.
type etcdProc struct {
	url    string
	cmd    *exec.Cmd
	log    *agentbin.Buffer
	exited chan struct{}
}

// startEtcdProc runs an etcd process with its data in dir and waits until
// it serves; it is stopped at cleanup.
func startEtcdProc(t *testing.T, dir string) *etcdProc {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := &etcdProc{url: fmt.Sprintf("http://127.0.0.1:%d", freePort(t)), log: &agentbin.Buffer{}, exited: make(chan struct{})}
	peer := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	p.cmd = exec.Command(self)
	p.cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %s %s", testEtcdEnv, filepath.Join(dir, "etcd"), p.url, peer))
	p.cmd.Stdout, p.cmd.Stderr = io.Discard, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		p.cmd.Process.Signal(syscall.SIGCONT)
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			p.cmd.Process.Kill()
			<-p.exited
		}
	})
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(p.log.String(), "test etcd serving") {
		select {
		case <-p.exited:
			t.Fatalf("the test etcd exited: %s", tail(p.log.String(), 4<<10))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the test etcd did not serve within a minute: %s", tail(p.log.String(), 4<<10))
		}
	}
	return p
}

// signal sends sig to the etcd process. For SIGSTOP it returns once
// every thread of etcd is stopped (state T in /proc/<pid>/task/*/stat):
// kill(2) only queues the signal, and a thread busy on another CPU
// answered a request 29 ms after it in one CI run.
func (p *etcdProc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to the test etcd: %v", sig, err)
	}
	if sig != syscall.SIGSTOP {
		return
	}
	pid := p.cmd.Process.Pid
	if !poll(5*time.Second, func() bool { return allThreadsStopped(pid) }) {
		t.Fatalf("etcd (pid %d) not stopped 5s after SIGSTOP", pid)
	}
}

// allThreadsStopped reports whether every thread of process pid is in
// the stopped state (proc(5): field 3 of stat, "T").
func allThreadsStopped(pid int) bool {
	stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(stats) == 0 {
		return false
	}
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			return false
		}
		// The command name, in parentheses, may hold spaces: the state
		// follows the last ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
			return false
		}
	}
	return true
}
