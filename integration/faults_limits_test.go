package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/runtime"
)

// TestReadFileOddProcFiles reads /proc files that refuse plain reads and
// offsets beyond int64: each is a typed answer naming the path, never
// INTERNAL.
func TestReadFileOddProcFiles(t *testing.T) {
	need(t)
	c := dialClient(t, env.berthdAddr)
	id := newSandbox(t, nil).GetId()
	for _, tc := range []struct {
		path   string
		offset uint64
	}{
		{"/proc/self/pagemap", 0},
		{"/proc/self/status", 1 << 63},
		{"/proc/self/status", 1<<64 - 1},
		{"/etc/passwd", 1 << 63},
	} {
		_, err := c.ReadFile(fileCtx(t), id, tc.path, io.Discard, client.WithRange(tc.offset, 0))
		var ce *client.Error
		if err != nil && (!errors.As(err, &ce) || ce.Code == codes.Internal || ce.Code == codes.Unknown || ce.Reason == client.ReasonInternal) {
			t.Errorf("ReadFile %s at %d: %v, want a typed answer, not INTERNAL", tc.path, tc.offset, err)
		}
	}
	// A refused read is the file's fact, not an incident: nothing at ERROR.
	b, err := os.ReadFile(env.rt.LogPath(id))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "level=ERROR") {
			t.Errorf("the agent logged an error: %s", line)
		}
	}
}

// TestForkAtPidsLimit fills a sandbox's pids limit with sleeping processes:
// a start then fails at fork with RESOURCE_EXHAUSTED PIDS_LIMIT_REACHED, a
// capacity fact of the sandbox, not INTERNAL with an incident id; once the
// processes end, execs run again.
func TestForkAtPidsLimit(t *testing.T) {
	need(t)
	const limit = 8
	id := newSandbox(t, &berthv1.CreateSandboxRequest{Resources: &berthv1.Resources{PidsLimit: limit}}).GetId()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// One sleeping process per background exec, until a start finds the
	// cgroup full (the limit plus the agent's reserve, less its threads).
	startSleep := func(execID string) error {
		stream, err := env.sandboxes.Exec(ctx)
		if err != nil {
			return err
		}
		start := &berthv1.ExecStart{SandboxId: id, ExecId: execID, Background: true, Process: &berthv1.ProcessSpec{Argv: []string{"sleep", "600"}}}
		if err := stream.Send(&berthv1.ExecRequest{Event: &berthv1.ExecRequest_Start{Start: start}}); err != nil {
			return err
		}
		for {
			if _, err := stream.Recv(); err != nil {
				if errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
		}
	}
	var err error
	started := 0
	for ; started <= limit+runtime.AgentPidsReserve; started++ {
		if err = startSleep(fmt.Sprintf("s%d", started)); err != nil {
			break
		}
	}
	t.Logf("%d sleeps started under pids_limit %d, then: %v", started, limit, err)
	wantStatus(t, err, codes.ResourceExhausted, rpcstatus.ReasonPidsLimit, "", "pids limit")
	if started < limit {
		t.Errorf("only %d processes started under pids_limit %d", started, limit)
	}
	if _, err := env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{ShellCommand: "true"}}); rpcstatus.Reason(err) != rpcstatus.ReasonPidsLimit {
		t.Errorf("Run in the full sandbox: %v, want PIDS_LIMIT_REACHED", err)
	}
	for i := range started {
		if _, err := env.sandboxes.SignalExec(ctx, &berthv1.SignalExecRequest{SandboxId: id, ExecId: fmt.Sprintf("s%d", i), Signal: "KILL"}); err != nil {
			t.Fatal(err)
		}
	}
	if !poll(10*time.Second, func() bool {
		resp, err := env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{Argv: []string{"echo", "again"}}})
		return err == nil && string(resp.GetStdout()) == "again\n"
	}) {
		t.Error("after the sleeps were killed the sandbox does not run execs again")
	}
}
