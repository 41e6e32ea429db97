package integration

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
)

// peakRSS returns this process's peak resident memory (VmHWM), in bytes:
// the in-process berthd's high-water mark.
func peakRSS(t testing.TB) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("VmHWM %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatal("/proc/self/status has no VmHWM")
	return 0
}

// TestLimitsRunCapsDoNotWrap is the red team's Run (issue 21):
// stderr_limit_bytes 2^64-1 made the sum of the caps wrap under the 64 MiB
// maximum, and 400 MB on stderr took berthd from 37 MB to 1.41 GB. It is
// refused naming the field, nothing runs, and a cap within the maximum
// keeps berthd's peak memory near the cap while the same 400 MB flow.
func TestLimitsRunCapsDoNotWrap(t *testing.T) {
	need(t)
	e := newInProcessEnv(t, "runwrap", server.Config{})
	sb := newSandboxOn(t, e.sandboxes, nil)
	const flood = "head -c 400000000 /dev/zero >&2; echo done"
	before := peakRSS(t)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := e.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: sb, ExecId: "wrap", Process: &berthv1.ProcessSpec{
		ShellCommand: flood, StderrLimitBytes: math.MaxUint64}})
	wantStatus(t, err, codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "process.stderr_limit_bytes", "maximum of 67108864 bytes", "18446744073709551615")
	if x, ok := listExecs(t, e.sandboxes, sb)["wrap"]; ok {
		t.Errorf("the refused Run started exec %v", x)
	}

	const capBytes = 8 << 20
	resp, err := e.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: sb, ExecId: "capped", Process: &berthv1.ProcessSpec{
		ShellCommand: flood, StderrLimitBytes: capBytes}}, grpc.MaxCallRecvMsgSize(16<<20))
	if err != nil {
		t.Fatalf("Run with an 8 MiB stderr cap: %v", err)
	}
	res := resp.GetResult()
	if len(resp.GetStderr()) != capBytes || !res.GetStderrTruncated() || res.GetStderrBytes() != 400000000 || string(resp.GetStdout()) != "done\n" {
		t.Errorf("Run = stderr %d bytes (truncated %v, counted %d), stdout %q; want 8 MiB kept of 400000000, stdout \"done\\n\"",
			len(resp.GetStderr()), res.GetStderrTruncated(), res.GetStderrBytes(), resp.GetStdout())
	}
	grew := peakRSS(t) - before
	t.Logf("peak RSS grew by %d MiB while 400 MB went through an 8 MiB cap", grew>>20)
	if grew > 128<<20 {
		t.Errorf("peak RSS grew by %d MiB; want under 128 MiB for an 8 MiB cap", grew>>20)
	}
}

// TestLimitsRequestBounds: what the red team sent (issue 21) is refused
// with INVALID_ARGUMENT naming the field, before anything is made.
func TestLimitsRequestBounds(t *testing.T) {
	need(t)
	sb := newSandbox(t, nil).GetId()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tc := range []struct {
		res      *berthv1.Resources
		field    string
		contains string
	}{
		{&berthv1.Resources{CpuMillis: 1}, "resources.cpu_millis", "minimum of 10"},
		{&berthv1.Resources{PidsLimit: 1}, "resources.pids_limit", "minimum of 8"},
		{&berthv1.Resources{ShmBytes: 1}, "resources.shm_bytes", "minimum of 65536"},
		{&berthv1.Resources{DiskBytes: math.MaxUint64}, "resources.disk_bytes", "maximum of 9223372036854775807"},
	} {
		_, err := env.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, Resources: tc.res})
		t.Run(tc.field, func(t *testing.T) {
			wantStatus(t, err, codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, tc.field, tc.contains)
		})
	}
	_, err := env.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, SandboxId: "limits-rid", RequestId: strings.Repeat("r", 1<<20)})
	wantStatus(t, err, codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "request_id", "the limit is 128")

	for _, tc := range []struct {
		timeout  *durationpb.Duration
		contains string
	}{
		{durationpb.New(-time.Second), "negative"},
		{durationpb.New(25 * time.Hour), "maximum of 24h0m0s"},
		{durationpb.New(time.Millisecond), "minimum of 1s"},
	} {
		_, err := env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: sb, Process: &berthv1.ProcessSpec{Argv: []string{"true"}, Timeout: tc.timeout}})
		wantStatus(t, err, codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "process.timeout", tc.contains)
		c := openExec(t, env.sandboxes, startReq(sb, xid(t), &berthv1.ProcessSpec{Argv: []string{"true"}, Timeout: tc.timeout}), 0)
		wantStatus(t, c.failure(), codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "start.process.timeout", tc.contains)
	}
	if n := len(listExecs(t, env.sandboxes, sb)); n != 0 {
		t.Errorf("the refused starts left %d execs", n)
	}
}

// TestLimitsSandboxAtFloorsRuns: a sandbox at every floor (8 pids, 10
// millicpus, 64 KiB of /dev/shm) still runs a shell pipeline and writes
// /dev/shm, so the floors are not below what a sandbox needs.
func TestLimitsSandboxAtFloorsRuns(t *testing.T) {
	need(t)
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{Resources: &berthv1.Resources{PidsLimit: 8, CpuMillis: 10, ShmBytes: 64 << 10}}).GetId()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	resp, err := env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: sb, Process: &berthv1.ProcessSpec{
		ShellCommand: "ls / | grep -c . | wc -l && head -c 32768 /dev/zero > /dev/shm/x && wc -c < /dev/shm/x"}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(resp.GetStdout()), fmt.Sprintf("1\n%d\n", 32768); resp.GetResult().GetExitCode() != 0 || got != want {
		t.Errorf("pipeline at the floors = exit %d, stdout %q, stderr %q; want 0, %q", resp.GetResult().GetExitCode(), got, resp.GetStderr(), want)
	}
}

// rawCodec sends a request's bytes as they are, so that a test can put
// what proto.Marshal refuses (invalid UTF-8) on the wire.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) ([]byte, error) { return v.([]byte), nil }

func (rawCodec) Unmarshal(b []byte, v any) error { return proto.Unmarshal(b, v.(proto.Message)) }

// TestLimitsInvalidUTF8 sends string fields that are not UTF-8 (issue 21:
// grpc-go's decode turned them into INTERNAL before any handler ran): each
// is INVALID_ARGUMENT naming the field, and berthd serves on.
func TestLimitsInvalidUTF8(t *testing.T) {
	need(t)
	sb := newSandbox(t, nil).GetId()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const bad = "\xff\xfe"
	swap := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return bytes.Replace(b, []byte("@@"), []byte(bad), 1)
	}
	for _, tc := range []struct {
		method string
		req    []byte
		field  string
	}{
		{"CreateSandbox", swap(&berthv1.CreateSandboxRequest{Image: env.image, Labels: map[string]string{"k": "@@"}}), "labels"},
		{"CreateSandbox", swap(&berthv1.CreateSandboxRequest{Image: env.image, Env: map[string]string{"@@": "v"}}), "env"},
		{"CreateSandbox", swap(&berthv1.CreateSandboxRequest{Image: env.image, RequestId: "@@"}), "request_id"},
		{"CreateSandbox", swap(&berthv1.CreateSandboxRequest{Image: env.image, Workdir: "/@@"}), "workdir"},
		{"Run", swap(&berthv1.RunRequest{SandboxId: sb, Process: &berthv1.ProcessSpec{Argv: []string{"echo", "@@"}}}), "process.argv[1]"},
		{"Run", swap(&berthv1.RunRequest{SandboxId: sb, Process: &berthv1.ProcessSpec{Argv: []string{"env"}, Env: map[string]string{"K": "@@"}}}), "process.env"},
	} {
		var out berthv1.CreateSandboxResponse
		err := env.conn.Invoke(ctx, "/berth.v1.SandboxService/"+tc.method, tc.req, &out, grpc.ForceCodec(rawCodec{}))
		t.Run(tc.method+"/"+tc.field, func(t *testing.T) {
			wantStatus(t, err, codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, tc.field, "not valid UTF-8")
		})
	}
	// The stream's first message too, as start.process.*.
	stream, err := env.sandboxes.Exec(ctx, grpc.ForceCodec(rawCodec{}))
	if err != nil {
		t.Fatal(err)
	}
	raw := swap(&berthv1.ExecRequest{Event: &berthv1.ExecRequest_Start{Start: &berthv1.ExecStart{SandboxId: sb, Process: &berthv1.ProcessSpec{ShellCommand: "echo @@"}}}})
	if err := stream.SendMsg(raw); err != nil {
		t.Fatalf("send the start: %v", err)
	}
	_, err = stream.Recv()
	wantStatus(t, err, codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "start.process.shell_command", "not valid UTF-8")
	if n := len(listExecs(t, env.sandboxes, sb)); n != 0 {
		t.Errorf("the refused requests started %d execs", n)
	}
}
