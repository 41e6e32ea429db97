package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/internal/agentbin"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
)

// randomBlockBytes is the size of the random block the flow tests repeat:
// a stream of N blocks has a known SHA-256 and no two offsets within a
// block alike, so a lost, doubled or reordered chunk changes it.
const randomBlockBytes = 16 << 20

// randomBlock writes a random block to path in the sandbox and returns its
// bytes, read back through an uncapped Exec.
func randomBlock(t *testing.T, sandboxID, path string) []byte {
	t.Helper()
	ev := runExec(t, env.sandboxes, sandboxID, "", sh(fmt.Sprintf("head -c %d /dev/urandom > %s && cat %s", randomBlockBytes, path, path)))
	if ev.result.GetExitCode() != 0 || len(ev.stdout) != randomBlockBytes || len(ev.dropped) != 0 {
		t.Fatalf("random block: exit %d, %d bytes, %d dropped; want 0, %d, 0", ev.result.GetExitCode(), len(ev.stdout), len(ev.dropped), randomBlockBytes)
	}
	return ev.stdout
}

// repeatedSum is the SHA-256 of block repeated n times.
func repeatedSum(block []byte, n int) [sha256.Size]byte {
	h := sha256.New()
	for range n {
		h.Write(block)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// TestExecFlowControl streams 16 MiB, 256 MiB and 1 GiB of random data
// through Exec to a deliberately slow reader: it stops reading for half a
// second twice (the writer would fill the 8 MiB ring many times over) and
// pauses every 16 MiB. Every byte must arrive, in order, with no dropped
// event: the writer waits for the reader. The 1 GiB case also shows that a
// stream has no ceiling (the agent used to stop at 64 MiB).
func TestExecFlowControl(t *testing.T) {
	need(t)
	sb := newSandbox(t, nil).GetId()
	block := randomBlock(t, sb, "/tmp/block")
	for _, blocks := range []int{1, 16, 64} {
		size := blocks * randomBlockBytes
		t.Run(fmt.Sprintf("%d MiB", size>>20), func(t *testing.T) {
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			stream, err := env.sandboxes.Exec(ctx)
			if err != nil {
				t.Fatal(err)
			}
			cmd := fmt.Sprintf("for i in $(seq %d); do cat /tmp/block; done", blocks)
			if err := stream.Send(startReq(sb, "", sh(cmd))); err != nil {
				t.Fatal(err)
			}
			h := sha256.New()
			var (
				got, messages uint64
				paused        int
				res           *berthv1.ExecResult
			)
			for res == nil {
				resp, err := stream.Recv()
				if err != nil {
					t.Fatalf("Recv after %d bytes: %v", got, err)
				}
				switch ev := resp.GetEvent().(type) {
				case *berthv1.ExecResponse_Output:
					if ev.Output.GetStream() != berthv1.Stream_STREAM_STDOUT {
						t.Fatalf("output on %v: %q", ev.Output.GetStream(), ev.Output.GetData())
					}
					before := got
					got += uint64(len(ev.Output.GetData()))
					messages++
					h.Write(ev.Output.GetData())
					// The slow reader: two long stalls, then a pause every
					// 16 MiB.
					switch {
					case paused < 2 && got >= uint64(size/4*(paused+1)):
						paused++
						time.Sleep(500 * time.Millisecond)
					case before>>24 != got>>24:
						time.Sleep(5 * time.Millisecond)
					}
				case *berthv1.ExecResponse_Dropped:
					t.Fatalf("dropped %v while the reader was attached", ev.Dropped)
				case *berthv1.ExecResponse_Exited:
					res = ev.Exited.GetResult()
				}
			}
			elapsed := time.Since(start)
			t.Logf("%d MiB to a slow reader in %v (%.0f MiB/s including 1 s of stalls), %d messages of %d KiB on average",
				size>>20, elapsed.Round(time.Millisecond), float64(size>>20)/elapsed.Seconds(), messages, got/max(messages, 1)>>10)
			if got != uint64(size) || res.GetStdoutBytes() != uint64(size) {
				t.Errorf("received %d bytes, stdout_bytes %d; want %d", got, res.GetStdoutBytes(), size)
			}
			var sum [sha256.Size]byte
			h.Sum(sum[:0])
			if sum != repeatedSum(block, blocks) {
				t.Errorf("sha256 of what arrived differs from what was written")
			}
			if res.GetExitCode() != 0 || res.GetStdoutTruncated() {
				t.Errorf("result = %v, want exit 0, not truncated", res)
			}
		})
	}
}

// TestRunOutput checks what Run returns: every byte within the caps, the
// head when the output is longer, defaults that fit a default client,
// caps beyond the server's maximum refused before anything runs, and the
// server's Run buffer budget.
func TestRunOutput(t *testing.T) {
	need(t)
	sb := newSandbox(t, nil).GetId()
	block := randomBlock(t, sb, "/tmp/block")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	t.Run("16 MiB within caps", func(t *testing.T) {
		spec := sh("cat /tmp/block; echo done >&2")
		spec.StdoutLimitBytes, spec.StderrLimitBytes = 16<<20, 16<<20
		resp, err := env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: sb, Process: spec}, grpc.MaxCallRecvMsgSize(40<<20))
		if err != nil {
			t.Fatal(err)
		}
		r := resp.GetResult()
		if !bytes.Equal(resp.GetStdout(), block) || r.GetStdoutBytes() != 16<<20 || r.GetStdoutTruncated() {
			t.Errorf("stdout %d bytes (equal %v), stdout_bytes %d, truncated %v; want the 16 MiB block, not truncated",
				len(resp.GetStdout()), bytes.Equal(resp.GetStdout(), block), r.GetStdoutBytes(), r.GetStdoutTruncated())
		}
		if string(resp.GetStderr()) != "done\n" || r.GetExitCode() != 0 {
			t.Errorf("stderr %q exit %d, want %q and 0", resp.GetStderr(), r.GetExitCode(), "done\n")
		}
	})
	t.Run("1 MiB cap keeps the head", func(t *testing.T) {
		spec := sh("cat /tmp/block")
		spec.StdoutLimitBytes = 1 << 20
		resp, err := env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: sb, Process: spec})
		if err != nil {
			t.Fatal(err)
		}
		r := resp.GetResult()
		if !bytes.Equal(resp.GetStdout(), block[:1<<20]) || r.GetStdoutBytes() != 16<<20 || !r.GetStdoutTruncated() {
			t.Errorf("stdout %d bytes, stdout_bytes %d, truncated %v; want the block's first 1 MiB of 16 MiB, truncated",
				len(resp.GetStdout()), r.GetStdoutBytes(), r.GetStdoutTruncated())
		}
	})
	t.Run("defaults fit a default client", func(t *testing.T) {
		// 5 MiB of stdout and 2 MiB of stderr: more than gRPC's default
		// 4 MiB receive limit together; the defaults keep 2 + 1 MiB.
		resp, err := env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: sb, Process: sh("head -c 5242880 /tmp/block; head -c 2097152 /tmp/block >&2")})
		if err != nil {
			t.Fatal(err)
		}
		r := resp.GetResult()
		if !bytes.Equal(resp.GetStdout(), block[:2<<20]) || !bytes.Equal(resp.GetStderr(), block[:1<<20]) {
			t.Errorf("stdout %d bytes, stderr %d bytes; want the heads, 2 MiB and 1 MiB", len(resp.GetStdout()), len(resp.GetStderr()))
		}
		if r.GetStdoutBytes() != 5<<20 || !r.GetStdoutTruncated() || r.GetStderrBytes() != 2<<20 || !r.GetStderrTruncated() {
			t.Errorf("result = %v, want 5 MiB and 2 MiB, both truncated", r)
		}
	})
	t.Run("caps beyond the maximum", func(t *testing.T) {
		for _, tt := range []struct {
			name           string
			stdout, stderr uint64
			field          string
		}{
			{"stdout alone", 65 << 20, 0, "process.stdout_limit_bytes"},
			{"both together", 40 << 20, 40 << 20, "process.stderr_limit_bytes"},
		} {
			t.Run(tt.name, func(t *testing.T) {
				marker := "/tmp/" + xid(t)
				spec := sh("touch " + marker)
				spec.StdoutLimitBytes, spec.StderrLimitBytes = tt.stdout, tt.stderr
				_, err := env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: sb, Process: spec})
				wantStatus(t, err, codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, tt.field, "67108864")
				if ev := runExec(t, env.sandboxes, sb, "", sh("test -e "+marker)); ev.result.GetExitCode() == 0 {
					t.Errorf("the refused Run ran its command")
				}
			})
		}
	})
	t.Run("budget", func(t *testing.T) {
		// A 2 MiB budget: each Run holds its first slabs (64 KiB a
		// stream) from its start and more as its output grows (issue 23).
		const budget = 2 << 20
		addr := startServer(t, server.Config{TaskRestartLimit: -1, RunStdoutBytes: 1 << 20, RunStderrBytes: 1 << 20,
			RunMaxOutputBytes: 2 << 20, RunBufferBytes: budget})
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		svc := berthv1.NewSandboxServiceClient(conn)

		// Two Runs each writing 768 KiB (caps 768 + 64 KiB) do not fit
		// at once: each holds its first slabs (128 KiB), then the rest
		// of its stdout cap (704 KiB) and what its stream's window may
		// hold past the slabs (704 KiB), 1.5 MiB in all. The one that
		// cannot grow waits, its process held, until the other ends,
		// and both return all of their output.
		const out = 768 << 10
		var wg sync.WaitGroup
		errs := make(chan error, 2)
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				spec := sh(fmt.Sprintf("head -c %d /dev/zero", out))
				spec.StdoutLimitBytes, spec.StderrLimitBytes = out, 64<<10
				resp, err := svc.Run(ctx, &berthv1.RunRequest{SandboxId: sb, Process: spec})
				if err == nil && (len(resp.GetStdout()) != out || resp.GetResult().GetStdoutTruncated()) {
					err = fmt.Errorf("stdout %d bytes, truncated %v", len(resp.GetStdout()), resp.GetResult().GetStdoutTruncated())
				}
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("one of two 768 KiB Runs in a 2 MiB budget: %v, want all of its output", err)
			}
		}

		// 16 silent Runs hold the whole budget (16 × 128 KiB); the 17th
		// is FLEET_BUSY before it starts.
		runCtx, stop := context.WithCancel(ctx)
		defer stop()
		held := make(chan error, 16)
		ids := make([]string, 16)
		for i := range ids {
			ids[i] = xid(t)
			go func() {
				_, err := svc.Run(runCtx, &berthv1.RunRequest{SandboxId: sb, ExecId: ids[i], Process: sh("sleep 60")})
				held <- err
			}()
		}
		if !poll(30*time.Second, func() bool {
			execs := listExecs(t, svc, sb)
			for _, id := range ids {
				if execs[id] == nil {
					return false
				}
			}
			return true
		}) {
			t.Fatal("the 16 Runs did not all start")
		}
		_, err = svc.Run(ctx, &berthv1.RunRequest{SandboxId: sb, Process: sh("echo never")})
		wantStatus(t, err, codes.ResourceExhausted, rpcstatus.ReasonFleetBusy, "")
		var busy *berthv1.FleetBusy
		var retry *errdetails.RetryInfo
		for _, d := range status.Convert(err).Details() {
			switch d := d.(type) {
			case *berthv1.FleetBusy:
				busy = d
			case *errdetails.RetryInfo:
				retry = d
			}
		}
		if busy.GetResource() != berthv1.CapacityResource_CAPACITY_RESOURCE_RUN_OUTPUT || busy.GetLimit() != budget || busy.GetInUse() != budget ||
			busy.GetRequested() != 128<<10 || busy.GetAdmitted() != berthv1.Admitted_ADMITTED_NOT_STARTED || retry == nil {
			t.Errorf("FleetBusy %v, RetryInfo %v; want RUN_OUTPUT, limit and in use 2 MiB, requested 128 KiB, not started, with RetryInfo", busy, retry)
		}
		// Once they end, a Run goes through. The callers' Runs return when
		// they cancel, a moment before berthd's handlers have ended and
		// given their slabs back: poll for that moment.
		stop()
		for range ids {
			<-held
		}
		var resp *berthv1.RunResponse
		if !poll(10*time.Second, func() bool {
			resp, err = svc.Run(ctx, &berthv1.RunRequest{SandboxId: sb, Process: sh("echo fits")})
			return rpcstatus.Reason(err) != rpcstatus.ReasonFleetBusy
		}) || err != nil || string(resp.GetStdout()) != "fits\n" {
			t.Errorf("Run after the budget was given back: %v, %v", resp, err)
		}
	})
}

// TestDetachedOutput checks both modes of a background exec nobody reads:
// the default keeps the newest output and reports what it shed; block
// makes the writer wait until an attach reads, and loses nothing.
func TestDetachedOutput(t *testing.T) {
	need(t)
	sb := newSandbox(t, nil).GetId()
	const size = 64 << 20 // eight 8 MiB rings
	cmd := &berthv1.ProcessSpec{Argv: []string{"head", "-c", fmt.Sprint(size), "/dev/zero"}}
	for _, tt := range []struct {
		mode     berthv1.DetachedOutput
		wantLoss bool
	}{
		{berthv1.DetachedOutput_DETACHED_OUTPUT_UNSPECIFIED, true},
		{berthv1.DetachedOutput_DETACHED_OUTPUT_BLOCK, false},
	} {
		t.Run(tt.mode.String(), func(t *testing.T) {
			id := xid(t)
			openExec(t, env.sandboxes, &berthv1.ExecRequest{Event: &berthv1.ExecRequest_Start{Start: &berthv1.ExecStart{
				SandboxId: sb, ExecId: id, Process: cmd, Background: true, DetachedOutput: tt.mode,
			}}}, 0).wait0()
			if tt.wantLoss {
				// It runs to its end on its own.
				if !poll(30*time.Second, func() bool {
					return listExecs(t, env.sandboxes, sb)[id].GetState() == berthv1.ExecState_EXEC_STATE_EXITED
				}) {
					t.Fatal("the detached exec did not end on its own")
				}
			} else {
				// It waits for a reader: still running with its ring full.
				if !poll(30*time.Second, func() bool { return listExecs(t, env.sandboxes, sb)[id].GetLastSeq() > 0 }) {
					t.Fatal("no output yet")
				}
				if st := listExecs(t, env.sandboxes, sb)[id].GetState(); st != berthv1.ExecState_EXEC_STATE_RUNNING {
					t.Fatalf("state %v, want RUNNING: its writes should wait for a reader", st)
				}
			}
			ev := openExec(t, env.sandboxes, attachReq(sb, id, 0), 0).wait()
			var lost uint64
			for _, d := range ev.dropped {
				lost += d.GetLostBytes()
			}
			if got := uint64(len(ev.stdout)) + lost; got != size || ev.result.GetStdoutBytes() != size {
				t.Errorf("received %d + lost %d bytes, stdout_bytes %d; want %d", len(ev.stdout), lost, ev.result.GetStdoutBytes(), size)
			}
			if (lost > 0) != tt.wantLoss {
				t.Errorf("lost %d bytes; want loss: %v", lost, tt.wantLoss)
			}
		})
	}
}

// TestStalledReaderHoldsWriter starts a command that writes 1 GiB on an
// Exec stream and then reads nothing more: with its caller attached, the
// command's writes wait, as on a FIFO, once what lies between them (the
// agent's 8 MiB ring, the HTTP/2 windows of berthd's two streams, socket
// and pipe buffers) is full — it never runs ahead into memory of the agent
// or of berthd. The writer must come to rest, blocked in write(2) on its
// pipe, having written at most maxInFlight.
func TestStalledReaderHoldsWriter(t *testing.T) {
	need(t)
	const (
		size        = 1 << 30
		maxInFlight = 64 << 20
	)
	id := newSandbox(t, nil).GetId()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := env.sandboxes.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	argv := []string{"head", "-c", fmt.Sprint(size), "/dev/zero"}
	if err := stream.Send(startReq(id, "", &berthv1.ProcessSpec{Argv: argv})); err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetStarted() != nil {
			break // the last read
		}
	}
	agent := agentPID(t, id)
	var writer int
	if !poll(10*time.Second, func() bool { writer = agentbin.ChildPID(agent, strings.Join(argv, "\x00")+"\x00"); return writer != 0 }) {
		t.Fatalf("no %q among the children of agent %d", argv, agent)
	}
	// At rest: blocked writing its pipe, and no byte more over three looks.
	var last []uint64
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		wchan, err1 := os.ReadFile(fmt.Sprintf("/proc/%d/wchan", writer))
		written, err2 := procWritten(writer)
		if err1 != nil || err2 != nil {
			t.Fatalf("the writer is gone (%v, %v): it wrote its %d bytes with nobody reading", err1, err2, size)
		}
		if written > maxInFlight {
			t.Fatalf("the writer wrote %d bytes with nobody reading, want at most %d in flight", written, maxInFlight)
		}
		if !bytes.HasSuffix(wchan, []byte("pipe_write")) {
			last = last[:0]
		} else if last = append(last, written); len(last) == 3 && last[0] == last[2] {
			t.Logf("the writer rests after %d bytes, blocked in %s", written, wchan)
			return
		} else if len(last) == 3 {
			last = last[1:]
		}
		if time.Now().After(deadline) {
			t.Fatalf("the writer did not come to rest within a minute: %d bytes written, in %s", written, wchan)
		}
	}
}

// procWritten returns the bytes host process pid has written (wchar of
// /proc/<pid>/io).
func procWritten(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "wchar: "); ok {
			return strconv.ParseUint(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/%d/io: no wchar", pid)
}
