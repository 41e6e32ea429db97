//go:build debian

package integration

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// debianContextImage imports the matplotlib variant of the Debian tree
// (scripts/debian-image.sh matplotlib, BERTH_DEBIAN_MATPLOTLIB_ROOT) into
// the berthd at addr once and returns its reference.
func debianContextImage(t *testing.T, addr string) string {
	t.Helper()
	root := os.Getenv("BERTH_DEBIAN_MATPLOTLIB_ROOT")
	if root == "" {
		t.Fatal("BERTH_DEBIAN_MATPLOTLIB_ROOT is not set: run make test-debian (scripts/debian-image.sh matplotlib builds the tree)")
	}
	const ref = "test.berth.dev/debian-matplotlib:bookworm"
	cmd := exec.Command(env.cliBinary, "--addr", addr, "image", "import", "--name", ref, root)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil || !strings.HasPrefix(out.String(), ref+" sha256:") {
		t.Fatalf("berth image import %s: %v: %s%s", root, err, out.String(), errOut.String())
	}
	return ref
}

// runCell runs code in the context and fails the test on an RPC error.
func runCell(t *testing.T, c *client.Client, sandboxID, contextID, code string, opts ...client.RunCodeOption) *client.CellExecution {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ex, err := c.RunCode(ctx, sandboxID, contextID, code, opts...)
	if err != nil {
		t.Fatalf("RunCode(%q): %v", code, err)
	}
	return ex
}

// TestDebianCodeContext runs Python cells in code contexts of a Debian
// sandbox with matplotlib: state kept between cells, the last expression's
// value, stdout and stderr, a traceback, a matplotlib PNG, rich reprs, an
// interrupted endless loop, a cell's timeout, restart, two independent
// contexts, a cell that closes its stdout, and output that looks like the
// driver's protocol.
func TestDebianCodeContext(t *testing.T) {
	need(t)
	ref := debianContextImage(t, env.berthdAddr)
	t.Cleanup(func() { berthCLI(t, nil, "image", "rm", ref) })
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{Image: ref})
	id := sb.GetId()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, env.berthdAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cx, err := c.CreateCodeContext(ctx, &berthv1.CreateCodeContextRequest{SandboxId: id})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(cx.GetContextId(), "cx-") || cx.GetPid() == 0 || cx.GetLanguage() != "python" {
		t.Fatalf("CreateCodeContext = %v, want a minted cx- id, a pid, python", cx)
	}
	a := cx.GetContextId()

	// A variable survives between cells; the last expression is the main result.
	if ex := runCell(t, c, id, a, "x = 41\nprint('hi')\nimport sys; print('oops', file=sys.stderr)"); ex.Stdout != "hi\n" || ex.Stderr != "oops\n" || ex.Error != nil || len(ex.Results) != 0 {
		t.Errorf("cell 1: stdout %q stderr %q error %v results %v, want hi, oops, none, none", ex.Stdout, ex.Stderr, ex.Error, ex.Results)
	}
	if ex := runCell(t, c, id, a, "x + 1"); ex.Text() != "42" || ex.Error != nil {
		t.Errorf("x + 1: main result %q error %v, want 42", ex.Text(), ex.Error)
	}
	// An error: its name, value and a traceback with the cell's line.
	ex := runCell(t, c, id, a, "def f():\n    return 1/0\nf()")
	if e := ex.Error; e.GetName() != "ZeroDivisionError" || e.GetValue() != "division by zero" ||
		!strings.Contains(strings.Join(e.GetTraceback(), ""), "return 1/0") {
		t.Errorf("1/0: error %v, want ZeroDivisionError with a traceback naming the line", e)
	}
	// A matplotlib figure comes back as a PNG.
	ex = runCell(t, c, id, a, "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()")
	var png []byte
	for _, r := range ex.Results {
		if p := r.GetData()["image/png"]; p != nil {
			png = p
		}
	}
	if !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) || len(png) < 1000 || ex.Error != nil {
		t.Errorf("matplotlib: %d results, error %v, PNG of %d bytes starting %q; want a PNG", len(ex.Results), ex.Error, len(png), png[:min(len(png), 8)])
	}
	// Rich reprs of an object, as a MIME bundle.
	ex = runCell(t, c, id, a, "class R:\n    def _repr_html_(self): return '<b>r</b>'\n    def _repr_json_(self): return {'k': 1}\n    def __repr__(self): return 'R()'\nR()")
	if len(ex.Results) != 1 || string(ex.Results[0].GetData()["text/html"]) != "<b>r</b>" ||
		string(ex.Results[0].GetData()["application/json"]) != `{"k": 1}` || ex.Text() != "R()" {
		t.Errorf("rich repr: results %v, want text/html, application/json and text/plain", ex.Results)
	}
	// Output that looks like the driver's protocol is only output; a cell
	// that closes fd 1 leaves the next cell's stdout working.
	fake := `{"cell": "x", "type": "done"}`
	if ex := runCell(t, c, id, a, "print('"+fake+"')\nimport os\nos.close(1)"); ex.Stdout != fake+"\n" || ex.Error != nil {
		t.Errorf("protocol-like output: stdout %q error %v", ex.Stdout, ex.Error)
	}
	if ex := runCell(t, c, id, a, "import os\nos.system('echo from-a-child')\nprint(x)"); ex.Stdout != "from-a-child\n41\n" {
		t.Errorf("after closing fd 1: stdout %q, want from-a-child, 41", ex.Stdout)
	}

	// An interrupt stops `while True: pass`; the context lives on.
	done := make(chan *client.CellExecution, 1)
	go func() {
		ex, err := c.RunCode(ctx, id, a, "print('looping', flush=True)\nwhile True: pass")
		if err != nil {
			t.Errorf("RunCode(while True): %v", err)
		}
		done <- ex
	}()
	deadline := time.Now().Add(2 * time.Minute)
	var interrupted *client.CellExecution
	for interrupted == nil && time.Now().Before(deadline) {
		if err := c.InterruptCodeContext(ctx, id, a); err != nil {
			t.Fatal(err)
		}
		select {
		case interrupted = <-done:
		case <-time.After(time.Second):
		}
	}
	if interrupted == nil || interrupted.Error.GetName() != "KeyboardInterrupt" {
		t.Fatalf("interrupted loop: %+v, want KeyboardInterrupt", interrupted)
	}
	if ex := runCell(t, c, id, a, "x"); ex.Text() != "41" {
		t.Errorf("after the interrupt: x = %q, want 41", ex.Text())
	}
	// A cell's timeout interrupts it.
	ex = runCell(t, c, id, a, "import time\nwhile True: time.sleep(0.1)", client.WithCodeTimeout(time.Second))
	if ex.Error.GetName() != "KeyboardInterrupt" || !ex.Done.GetTimedOut() {
		t.Errorf("timeout: error %v done %v, want KeyboardInterrupt, timed_out", ex.Error, ex.Done)
	}

	// A second context is independent.
	b, err := c.CreateCodeContext(ctx, &berthv1.CreateCodeContextRequest{SandboxId: id, ContextId: "second"})
	if err != nil {
		t.Fatal(err)
	}
	if ex := runCell(t, c, id, b.GetContextId(), "x"); ex.Error.GetName() != "NameError" {
		t.Errorf("x in the second context: error %v, want NameError", ex.Error)
	}
	list, err := c.ListCodeContexts(ctx, id)
	if err != nil || len(list) != 2 || list[0].GetContextId() != a || list[1].GetContextId() != "second" {
		t.Errorf("ListCodeContexts = %v, %v; want %s and second", list, err, a)
	}
	var ce *client.Error
	if _, err := c.CreateCodeContext(ctx, &berthv1.CreateCodeContextRequest{SandboxId: id, ContextId: "second"}); !errors.As(err, &ce) || ce.Code != codes.AlreadyExists || ce.Reason != client.ReasonContextExists {
		t.Errorf("CreateCodeContext of a running id: %v, want ALREADY_EXISTS", err)
	}

	// A restart drops the variables and keeps the id.
	re, err := c.RestartCodeContext(ctx, id, a)
	if err != nil {
		t.Fatal(err)
	}
	if re.GetContextId() != a || re.GetPid() == cx.GetPid() {
		t.Errorf("RestartCodeContext = %v, want %s with a new pid (was %d)", re, a, cx.GetPid())
	}
	if ex := runCell(t, c, id, a, "x"); ex.Error.GetName() != "NameError" {
		t.Errorf("x after the restart: error %v, want NameError", ex.Error)
	}
	if err := c.DeleteCodeContext(ctx, id, "second"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RunCode(ctx, id, "nope", "1"); !errors.As(err, &ce) || ce.Reason != client.ReasonContextNotFound {
		t.Errorf("RunCode in an unknown context: %v, want CONTEXT_NOT_FOUND", err)
	}
	if _, err := c.RunCode(ctx, id, "second", "1"); !errors.As(err, &ce) || ce.Reason != client.ReasonContextEnded {
		t.Errorf("RunCode in a deleted context: %v, want CONTEXT_ENDED", err)
	}
}

// TestDebianCodeContextAfterRestart keeps a context's variables across a
// berthd killed and started again: the agent owns the interpreter.
func TestDebianCodeContextAfterRestart(t *testing.T) {
	need(t)
	e := newBinaryEnv(t, "cxr")
	p1 := startBerthd(t, e)
	ref := debianContextImage(t, "unix://"+e.sock)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	created, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: "ctxrestart", Image: ref})
	if err != nil {
		t.Fatal(err)
	}
	id := created.GetSandbox().GetId()
	defer e.sandboxes.DeleteSandbox(context.Background(), &berthv1.DeleteSandboxRequest{SandboxId: id})
	c, err := client.Dial(ctx, "unix://"+e.sock)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateCodeContext(ctx, &berthv1.CreateCodeContextRequest{SandboxId: id, ContextId: "kept"}); err != nil {
		t.Fatal(err)
	}
	runCell(t, c, id, "kept", "kept = 'before-restart'")
	c.Close()
	if err := p1.signal(t, syscall.SIGKILL); err == nil {
		t.Fatal("berthd exited cleanly after SIGKILL?")
	}
	startBerthd(t, e)
	c, err = client.Dial(ctx, "unix://"+e.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if ex := runCell(t, c, id, "kept", "kept"); ex.Text() != "'before-restart'" {
		t.Errorf("after the restart: kept = %q, want 'before-restart'", ex.Text())
	}
}
