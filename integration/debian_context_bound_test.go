//go:build debian

package integration

import (
	"context"
	"runtime"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestDebianCodeContextFrameBound: a cell reaches the driver's protocol
// descriptor (the driver is its own Python process); a line it writes
// there without an end fails the cell, RESOURCE_EXHAUSTED
// CELL_FRAME_TOO_LARGE, at a bound, rather than grow berthd's memory
// (before the bound the cell ended OK after 13 s, its done frame lost in
// the line, and berthd's heap grew 112 MiB for 512 MiB written).
func TestDebianCodeContextFrameBound(t *testing.T) {
	need(t)
	ref := debianContextImage(t, env.berthdAddr)
	t.Cleanup(func() { berthCLI(t, nil, "image", "rm", ref) })
	id := newSandbox(t, &berthv1.CreateSandboxRequest{Image: ref}).GetId()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, env.berthdAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	newContext := func() string {
		cx, err := c.CreateCodeContext(ctx, &berthv1.CreateCodeContextRequest{SandboxId: id})
		if err != nil {
			t.Fatal(err)
		}
		return cx.GetContextId()
	}
	run := func(cx, code string, timeout time.Duration) (*client.CellExecution, time.Duration, error) {
		cctx, ccancel := context.WithTimeout(ctx, 90*time.Second)
		defer ccancel()
		start := time.Now()
		ex, err := c.RunCode(cctx, id, cx, code, client.WithCodeTimeout(timeout))
		return ex, time.Since(start), err
	}
	const proto = "import sys as _s\n_m = _s.modules['__main__']\n"

	cx := newContext()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	ex, took, err := run(cx, proto+"import os\nfd = _m._proto.fileno()\nb = b'a' * (1 << 20)\nfor _ in range(1024):\n    os.write(fd, b)", time.Minute)
	runtime.ReadMemStats(&after)
	grew := (int64(after.HeapInuse) - int64(before.HeapInuse)) >> 20
	t.Logf("1 GiB without a newline: %v after %v, %v; berthd's heap in use grew %d MiB (sys %d -> %d MiB)", ex, took, err, grew, before.Sys>>20, after.Sys>>20)
	if rpcstatus.Reason(err) != rpcstatus.ReasonCellFrameTooLarge || status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a cell writing 1 GiB without a newline on the driver's descriptor: %v; want RESOURCE_EXHAUSTED %s", err, rpcstatus.ReasonCellFrameTooLarge)
	}
	// The context is restarted and runs cells again.
	if _, err := c.RestartCodeContext(ctx, id, cx); err != nil {
		t.Fatal(err)
	}
	if ex, _, err := run(cx, "6*7", 30*time.Second); err != nil || ex.Text() != "42" {
		t.Errorf("after the restart: %v, %v; want 42", ex, err)
	}
}
