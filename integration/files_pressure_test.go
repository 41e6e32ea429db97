package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/wire"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
	containerd "github.com/containerd/containerd/v2/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestReadFileSlowReader stops reading a 128 MiB ReadFile after its first
// chunk and checks that flow control stops the reads of the file: what the
// agent and berthd have read while the caller does not read stays within
// the windows and buffers of the two hops (berthd and the agent buffer no
// more than that), and every byte still arrives once the caller reads
// again. The reads are the agent's rchar in /proc/PID/io and the bytes
// berthd counts out (berth_file_bytes_total): for a runc sandbox berthd
// reads the file itself from the descriptor the agent hands it.
func TestReadFileSlowReader(t *testing.T) {
	need(t)
	const size = 128 << 20
	sb := newSandbox(t, nil)
	id := sb.GetId()
	if r := run(t, id, "dd", "if=/dev/zero", "of=/workspace/big", "bs=1048576", fmt.Sprintf("count=%d", size>>20)); r.GetResult().GetExitCode() != 0 {
		t.Fatalf("dd: exit %d: %s", r.GetResult().GetExitCode(), r.GetStderr())
	}
	pid := agentPID(t, id)

	// The caller's transport is the Go client's (wire.DialOptions): its
	// receive window is part of the bound.
	obs := &directReads{}
	conn, err := grpc.NewClient(startServer(t, server.Config{TaskRestartLimit: -1, Observer: obs}), append(wire.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	reads := func() uint64 { return agentRead(t, pid) + uint64(obs.out.Load()) }
	before := reads()
	stream, err := berthv1.NewFileServiceClient(conn).ReadFile(ctx, &berthv1.ReadFileRequest{SandboxId: id, Location: &berthv1.ReadFileRequest_Path{Path: "/workspace/big"}})
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	var got int
	recv := func() error {
		msg, err := stream.Recv()
		if err != nil {
			return err
		}
		got += len(msg.GetChunk())
		h.Write(msg.GetChunk())
		return nil
	}
	for range 2 { // the header and the first chunk
		if err := recv(); err != nil {
			t.Fatal(err)
		}
	}

	// Not reading now. The reads go on until the windows are full, then
	// stop: wait until the count stays put for half a second.
	stalled, last, still := before, before, 0
	for deadline := time.Now().Add(time.Minute); still < 25; {
		if time.Now().After(deadline) {
			t.Fatalf("berth kept reading for a minute while the caller did not: %d bytes so far", last-before)
		}
		time.Sleep(20 * time.Millisecond)
		now := reads()
		if now == last {
			still++
		} else {
			still, last = 0, now
		}
		stalled = now
	}
	// Read at most: the chunk taken, then in flight the caller's stream
	// window, berthd's (from the agent), a chunk each hop holds plus gRPC's
	// 64 KiB write quota, the agent's read buffer; twice that for socket
	// buffers and slack.
	bound := uint64(2 * (2*wire.StreamWindow + 4<<20))
	t.Logf("while the caller did not read, the agent and berthd read %d bytes (bound %d; direct reads %d)", stalled-before, bound, obs.n.Load())
	if read := stalled - before; read > bound {
		t.Errorf("while the caller did not read, the agent and berthd read %d bytes, want at most %d (the windows and buffers of two hops)", read, bound)
	}

	for {
		err := recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("ReadFile after the pause, at %d bytes: %v", got, err)
		}
	}
	want := sha256.Sum256(make([]byte, size))
	if got != size || hex.EncodeToString(h.Sum(nil)) != hex.EncodeToString(want[:]) {
		t.Errorf("ReadFile delivered %d bytes sha256 %x, want %d zero bytes", got, h.Sum(nil), size)
	}
}

// agentPID returns the host pid of the sandbox id's agent (its task's).
func agentPID(t *testing.T, id string) int {
	t.Helper()
	cc, err := containerd.New(env.containerd, containerd.WithDefaultNamespace(env.namespace))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx := context.Background()
	c, err := cc.LoadContainer(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	return int(task.Pid())
}

// agentRead returns the bytes process pid has read with read(2) and
// pread(2), sockets included (rchar of /proc/PID/io).
func agentRead(t *testing.T, pid int) uint64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "rchar: "); ok {
			var n uint64
			if _, err := fmt.Sscan(v, &n); err != nil {
				t.Fatalf("rchar %q: %v", v, err)
			}
			return n
		}
	}
	t.Fatalf("no rchar in /proc/%d/io: %q", pid, bytes.TrimSpace(b))
	return 0
}
