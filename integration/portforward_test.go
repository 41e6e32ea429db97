package integration

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// portForwardBigBytes is what goes through one forwarded connection.
const portForwardBigBytes = 256 << 20

// startInSandbox starts argv as a background exec in the sandbox and waits
// until port accepts connections (through PortForward: the only way in
// without a network).
func startInSandbox(t testing.TB, c *client.Client, id string, port uint16, argv ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.ExecBackground(ctx, id, &berthv1.ProcessSpec{Argv: argv}); err != nil {
		t.Fatalf("start %q: %v", argv, err)
	}
	waitPort(t, c, id, port)
}

// waitPort waits (bounded) until port in the sandbox accepts a connection.
func waitPort(t testing.TB, c *client.Client, id string, port uint16) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		pc, err := c.PortForward(context.Background(), id, port)
		if err == nil {
			pc.Close()
			return
		}
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Reason != client.ReasonPortClosed || time.Now().After(deadline) {
			t.Fatalf("port %d in %s: %v", port, id, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cliPortForward runs `berth port-forward id :port` and returns the local
// address it listens on; the process is interrupted at cleanup and must
// exit 0.
func cliPortForward(t testing.TB, id string, port uint16) string {
	t.Helper()
	cmd := exec.Command(env.cliBinary, "--addr", env.berthdAddr, "port-forward", id, fmt.Sprintf(":%d", port))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGINT)
		if err := cmd.Wait(); err != nil {
			t.Errorf("berth port-forward after SIGINT: %v; stderr: %s", err, stderr.String())
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	m := regexp.MustCompile(`^Forwarding from (127\.0\.0\.1:\d+) -> (\d+)\n$`).FindStringSubmatch(line)
	if err != nil || m == nil || m[2] != strconv.Itoa(int(port)) {
		t.Fatalf("berth port-forward printed %q (%v), want \"Forwarding from 127.0.0.1:PORT -> %d\"; stderr: %s", line, err, port, stderr.String())
	}
	return m[1]
}

// TestPortForwardHTTP serves busybox httpd in a sandbox without network
// through `berth port-forward` to a host HTTP client: 100 connections at
// once each get their own file, and 256 MiB through one connection arrive
// with the sandbox's sha256.
func TestPortForwardHTTP(t *testing.T) {
	need(t)
	ctx := context.Background()
	c, err := client.Dial(ctx, env.berthdAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	id := newSandbox(t, nil).GetId()
	made := run(t, id, "sh", "-c", fmt.Sprintf(`mkdir -p /srv && for i in $(seq 0 99); do echo "file $i" > /srv/f$i; done &&
		head -c %d /dev/urandom > /srv/big && sha256sum /srv/big`, portForwardBigBytes))
	want, _, _ := strings.Cut(string(made.GetStdout()), " ")
	if made.GetResult().GetExitCode() != 0 || len(want) != 64 {
		t.Fatalf("making /srv: %q, %q", made.GetStdout(), made.GetStderr())
	}
	startInSandbox(t, c, id, 8080, "httpd", "-f", "-p", "8080", "-h", "/srv")
	addr := cliPortForward(t, id, 8080)

	get := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, MaxConnsPerHost: 0}, Timeout: 2 * time.Minute}
	t.Run("100 at once", func(t *testing.T) {
		var wg sync.WaitGroup
		gate := make(chan struct{})
		errs := make([]error, 100)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-gate
				resp, err := get.Get(fmt.Sprintf("http://%s/f%d", addr, i))
				if err != nil {
					errs[i] = err
					return
				}
				defer resp.Body.Close()
				body, err := io.ReadAll(resp.Body)
				if want := fmt.Sprintf("file %d\n", i); err != nil || resp.StatusCode != 200 || string(body) != want {
					errs[i] = fmt.Errorf("status %d, body %q (%v), want %q", resp.StatusCode, body, err, want)
				}
			}()
		}
		close(gate)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("GET /f%d: %v", i, err)
			}
		}
	})
	t.Run("256 MiB", func(t *testing.T) {
		resp, err := get.Get("http://" + addr + "/big")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		h := sha256.New()
		n, err := io.Copy(h, resp.Body)
		if got := hex.EncodeToString(h.Sum(nil)); err != nil || n != portForwardBigBytes || got != want {
			t.Errorf("GET /big: %d bytes, sha256 %s (%v); want %d bytes, sha256 %s", n, got, err, portForwardBigBytes, want)
		}
	})
}

// TestPortForwardStreams: half-closes pass both ways; a closed port is
// PORT_CLOSED naming it; a bad port names the field; a missing sandbox is
// NOT_FOUND; many streams run at once on one connection.
func TestPortForwardStreams(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, env.berthdAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	id := newSandbox(t, nil).GetId()
	// sha256sum reads to end of file, answers, and exits: a half-close
	// each way. -ll keeps nc listening for the next connection.
	startInSandbox(t, c, id, 9000, "nc", "-ll", "-p", "9000", "-e", "sha256sum")

	t.Run("half-close", func(t *testing.T) {
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				pc, err := c.PortForward(ctx, id, 9000)
				if err != nil {
					t.Error(err)
					return
				}
				defer pc.Close()
				payload := []byte(strings.Repeat(fmt.Sprintf("stream %d;", i), 100000))
				if _, err := pc.Write(payload); err != nil {
					t.Error(err)
					return
				}
				if err := pc.CloseWrite(); err != nil {
					t.Error(err)
					return
				}
				got, err := io.ReadAll(pc)
				sum := sha256.Sum256(payload)
				if want := hex.EncodeToString(sum[:]) + "  -\n"; err != nil || string(got) != want {
					t.Errorf("stream %d: read %q (%v), want %q then end of file", i, got, err, want)
				}
			}()
		}
		wg.Wait()
	})
	t.Run("closed port", func(t *testing.T) {
		_, err := c.PortForward(ctx, id, 9)
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Code != codes.FailedPrecondition || ce.Reason != client.ReasonPortClosed || ce.Metadata["port"] != "9" || !strings.Contains(ce.Message, "port 9") {
			t.Errorf("PortForward to a closed port: %v, want FAILED_PRECONDITION PORT_CLOSED naming port 9", err)
		}
	})
	t.Run("bad requests", func(t *testing.T) {
		open := func(first *berthv1.PortForwardRequest) error {
			stream, err := env.sandboxes.PortForward(ctx)
			if err != nil {
				return err
			}
			if err := stream.Send(first); err != nil && !errors.Is(err, io.EOF) {
				return err
			}
			stream.CloseSend()
			for {
				if _, err := stream.Recv(); err != nil {
					return eofIsNil(err)
				}
			}
		}
		start := func(id string, port uint32) *berthv1.PortForwardRequest {
			return &berthv1.PortForwardRequest{Event: &berthv1.PortForwardRequest_Start{Start: &berthv1.PortForwardStart{SandboxId: id, Port: port}}}
		}
		wantStatus(t, open(start(id, 0)), codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "start.port")
		wantStatus(t, open(start(id, 65536)), codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "start.port")
		wantStatus(t, open(&berthv1.PortForwardRequest{Event: &berthv1.PortForwardRequest_Data{Data: []byte("x")}}), codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "start")
		wantStatus(t, open(start("no-such-sandbox", 80)), codes.NotFound, rpcstatus.ReasonSandboxNotFound, "")
	})
}

// TestPortForwardFlowControl: a reader that stops reading stops the
// server in the sandbox after a bounded number of bytes (socket buffers
// and the streams' flow-control windows), and reading again resumes it.
func TestPortForwardFlowControl(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, env.berthdAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	id := newSandbox(t, nil).GetId()
	startInSandbox(t, c, id, 9001, "nc", "-ll", "-p", "9001", "-e", "dd", "if=/dev/zero", "bs=65536")
	pc, err := c.PortForward(ctx, id, 9001)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	if _, err := io.CopyN(io.Discard, pc, 1<<20); err != nil {
		t.Fatal(err)
	}
	// dd's written bytes (/proc/PID/io wchar) stop growing while nobody
	// reads: poll until two readings a second apart agree.
	// The sum over every dd: the probe's may not have exited yet.
	written := func() int64 {
		out := run(t, id, "sh", "-c", "for p in $(pidof dd); do cat /proc/$p/io 2>/dev/null; done")
		ms := regexp.MustCompile(`wchar: (\d+)`).FindAllSubmatch(out.GetStdout(), -1)
		if len(ms) == 0 {
			t.Fatalf("/proc/PID/io of dd: %q %q", out.GetStdout(), out.GetStderr())
		}
		var n int64
		for _, m := range ms {
			v, _ := strconv.ParseInt(string(m[1]), 10, 64)
			n += v
		}
		return n
	}
	const bound = 64 << 20
	last := written()
	for i := 0; ; i++ {
		time.Sleep(time.Second)
		now := written()
		if now == last {
			break
		}
		if now > bound || i == 60 {
			t.Fatalf("the server in the sandbox wrote %d bytes with the reader stopped after 1 MiB (want it held below %d)", now, bound)
		}
		last = now
	}
	t.Logf("held after %d bytes written in the sandbox", last)
	// Reading again resumes it.
	if _, err := io.CopyN(io.Discard, pc, 2*bound); err != nil {
		t.Fatal(err)
	}
	if now := written(); now < 2*bound {
		t.Errorf("after reading %d more bytes the server wrote %d in all", 2*bound, now)
	}
}

// dialInSandbox connects to 127.0.0.1:port in the network namespace of the
// sandbox's task with pid: the direct path that PortForward is measured
// beside.
func dialInSandbox(pid uint32, port uint16) (net.Conn, error) {
	var c net.Conn
	err := inNetNS(fmt.Sprintf("/proc/%d/ns/net", pid), func() (err error) {
		c, err = net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))))
		return err
	})
	return c, err
}

// inNetNS runs fn on a thread moved into the network namespace at nsPath
// (setns(2)); sockets fn makes stay there. The thread is never unlocked,
// so Go ends it afterwards.
func inNetNS(nsPath string, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		fd, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			done <- err
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			done <- err
			return
		}
		done <- fn()
	}()
	return <-done
}

// TestPortForwardPath: berthd dials a forwarded port of a runc sandbox
// itself, in the sandbox's network namespace, so no process in the
// sandbox holds the connection's client side; under gVisor, whose network
// is its own stack, the agent (PID 1 there) dials and holds it. Each
// connection works either way, to 127.0.0.1 in the sandbox, with its
// half-close (cat echoes until the caller's end of file), and a closed
// port is PORT_CLOSED alike.
func TestPortForwardPath(t *testing.T) {
	need(t)
	for _, tc := range []struct {
		runtime     string
		agentHolds  int // the agent's connections to the port while one is forwarded
		description string
	}{
		{"runc", 0, "berthd dials in the sandbox's network namespace"},
		{"gvisor", 1, "the agent dials"},
	} {
		t.Run(tc.runtime, func(t *testing.T) {
			if tc.runtime == "gvisor" {
				needGVisor(t)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			c := dialClient(t, env.berthdAddr)
			id := newSandbox(t, &berthv1.CreateSandboxRequest{Runtime: tc.runtime}).GetId()
			startInSandbox(t, c, id, 9002, "nc", "-ll", "-p", "9002", "-e", "cat")
			sb, err := c.GetSandbox(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			pid := sb.GetRuntime().GetTaskPid()
			// The agent's TCP connections to the port: counted by socket
			// inode, so that its other sockets (berthd's connections come
			// and go) do not count. waitPort's probe connection closes
			// after its stream ends: wait (bounded) until it has gone.
			deadline := time.Now().Add(30 * time.Second)
			for n := agentConnsTo(t, tc.runtime, id, pid, 9002); n != 0; n = agentConnsTo(t, tc.runtime, id, pid, 9002) {
				if time.Now().After(deadline) {
					t.Fatalf("the agent still holds %d connections to port 9002 with no forward open", n)
				}
				time.Sleep(20 * time.Millisecond)
			}
			pc, err := c.PortForward(ctx, id, 9002)
			if err != nil {
				t.Fatal(err)
			}
			defer pc.Close()
			if during := agentConnsTo(t, tc.runtime, id, pid, 9002); during != tc.agentHolds {
				t.Errorf("the agent holds %d connections to port 9002 with a forwarded connection open; want %d (%s)", during, tc.agentHolds, tc.description)
			}
			echoThrough(t, pc)
			_, err = c.PortForward(ctx, id, 9)
			var ce *client.Error
			if !errors.As(err, &ce) || ce.Code != codes.FailedPrecondition || ce.Reason != client.ReasonPortClosed || ce.Metadata["port"] != "9" ||
				ce.Message != "port 9 in the sandbox is closed: nothing listens on it" {
				t.Errorf("PortForward to a closed port: %v, want FAILED_PRECONDITION PORT_CLOSED \"port 9 in the sandbox is closed: nothing listens on it\"", err)
			}
		})
	}
}

// agentConnsTo counts the TCP connections to port that the sandbox's
// agent (task pid, PID 1 inside) holds: its socket inodes
// (/proc/<pid>/fd) that /proc/net/tcp and tcp6 of its network namespace
// list with that remote port (proc(5)). runc: read from the host (the
// agent is not dumpable, so the sandbox cannot read its fds); gVisor:
// read inside, whose sockets and network stack the host does not see.
func agentConnsTo(t *testing.T, runtime, id string, pid uint32, port uint16) int {
	t.Helper()
	var fds, tables string
	if runtime == "gvisor" {
		out := run(t, id, "sh", "-c", "ls -l /proc/1/fd; echo ==; cat /proc/net/tcp /proc/net/tcp6")
		var ok bool
		if fds, tables, ok = strings.Cut(string(out.GetStdout()), "==\n"); !ok || len(out.GetStderr()) > 0 {
			t.Fatalf("sockets of the agent: %q %q", out.GetStdout(), out.GetStderr())
		}
	} else {
		dir := fmt.Sprintf("/proc/%d/fd", pid)
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for _, e := range ents {
			if l, err := os.Readlink(dir + "/" + e.Name()); err == nil {
				b.WriteString(l + "\n")
			}
		}
		fds = b.String()
		for _, f := range []string{"tcp", "tcp6"} {
			data, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, f))
			if err != nil {
				t.Fatal(err)
			}
			tables += string(data)
		}
	}
	held := make(map[string]bool)
	for _, m := range regexp.MustCompile(`socket:\[(\d+)\]`).FindAllStringSubmatch(fds, -1) {
		held[m[1]] = true
	}
	if len(held) == 0 {
		t.Fatalf("the agent of %s holds no socket: %q", id, fds)
	}
	suffix := fmt.Sprintf(":%04X", port)
	n := 0
	for _, line := range strings.Split(tables, "\n") {
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
		f := strings.Fields(line)
		if len(f) > 9 && strings.HasSuffix(f[2], suffix) && held[f[9]] {
			n++
		}
	}
	return n
}

// echoThrough sends 1.2 MB on pc to a cat in the sandbox, half-closes, and
// wants them back, then end of file.
func echoThrough(t *testing.T, pc *client.PortConn) {
	t.Helper()
	payload := strings.Repeat("berth;", 200000)
	go func() {
		pc.Write([]byte(payload))
		pc.CloseWrite()
	}()
	got, err := io.ReadAll(pc)
	if err != nil || string(got) != payload {
		t.Errorf("echo: %d bytes (%v), want the %d sent then end of file", len(got), err, len(payload))
	}
}

// TestPortForwardAfterRestart: a berthd killed and started again finds
// the sandbox's network namespace anew (from the task it reaches) and
// dials there itself, as before the kill.
func TestPortForwardAfterRestart(t *testing.T) {
	need(t)
	e := newBinaryEnv(t, "pfr")
	p1 := startBerthd(t, e)
	e.importBase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	created, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: "pfr", Image: baseImage})
	if err != nil {
		t.Fatal(err)
	}
	id, pid := created.GetSandbox().GetId(), created.GetSandbox().GetRuntime().GetTaskPid()
	forward := func(c *client.Client) {
		t.Helper()
		pc, err := c.PortForward(ctx, id, 9004)
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		if during := agentConnsTo(t, "runc", id, pid, 9004); during != 0 {
			t.Errorf("the agent holds %d connections to port 9004 with a forwarded connection open; want berthd to hold it", during)
		}
		echoThrough(t, pc)
	}
	c1 := dialClient(t, "unix://"+e.sock)
	startInSandbox(t, c1, id, 9004, "nc", "-ll", "-p", "9004", "-e", "cat")
	forward(c1)
	if err := p1.signal(t, syscall.SIGKILL); err == nil {
		t.Fatal("berthd exited cleanly after SIGKILL?")
	}
	startBerthd(t, e)
	forward(dialClient(t, "unix://"+e.sock))
}

// TestPortForwardEndsWithSandbox: a connection berthd dialed in a runc
// sandbox's network namespace is closed when the sandbox is deleted, even
// while the caller keeps its side open and sends nothing: before, berthd
// held the socket (and with it the deleted sandbox's network namespace)
// as long as the caller held the stream.
func TestPortForwardEndsWithSandbox(t *testing.T) {
	need(t)
	e, p, id := startBerthdWithSandbox(t, "pfd", "pfd")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := dialClient(t, "unix://"+e.sock)
	startInSandbox(t, c, id, 9005, "nc", "-ll", "-p", "9005", "-e", "cat")
	berthd := p.cmd.Process.Pid
	sockets := func() map[string]bool {
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", berthd))
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]bool{}
		for _, fd := range fds {
			if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", berthd, fd.Name())); err == nil && strings.HasPrefix(l, "socket:") {
				m[l] = true
			}
		}
		return m
	}
	before := sockets()
	pc, err := c.PortForward(ctx, id, 9005)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	var opened []string
	for s := range sockets() {
		if !before[s] {
			opened = append(opened, s)
		}
	}
	if len(opened) == 0 {
		t.Fatal("berthd holds no new socket with a forwarded connection open; want it to hold the connection it dialed")
	}
	if err := c.DeleteSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
	held := func() []string {
		now := sockets()
		var still []string
		for _, s := range opened {
			if now[s] {
				still = append(still, s)
			}
		}
		return still
	}
	if !poll(30*time.Second, func() bool { return len(held()) == 0 }) {
		t.Errorf("30 s after the sandbox was deleted berthd still holds %v of the sockets it opened for the forwarded connection (%v)", held(), opened)
	}
}
