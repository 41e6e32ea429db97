package contextsvc

import (
	"bufio"
	"encoding/json"
	"maps"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

func TestParseExecID(t *testing.T) {
	for _, tt := range []struct {
		in     string
		id     string
		gen    int
		wantOK bool
	}{
		{"ctx.cx-abc.1", "cx-abc", 1, true},
		{"ctx.a_b.12", "a_b", 12, true},
		{"ctx.a.b.3", "", 0, false}, // a context id has no dot
		{"ctx.abc", "", 0, false},
		{"ctx.abc.0", "", 0, false},
		{"ctx..1", "", 0, false},
		{"exec-1", "", 0, false},
	} {
		id, gen, ok := parseExecID(tt.in)
		if id != tt.id || gen != tt.gen || ok != tt.wantOK {
			t.Errorf("parseExecID(%q) = %q, %d, %v; want %q, %d, %v", tt.in, id, gen, ok, tt.id, tt.gen, tt.wantOK)
		}
	}
}

// TestSpecRoundTrip checks that a spec comes back from an argv as
// ListExecs lists it (elements of at most 256 bytes), and that one too
// large for it is refused naming env.
func TestSpecRoundTrip(t *testing.T) {
	sp := spec{Cwd: "/workspace", User: "1000:1000", Env: map[string]string{"A": strings.Repeat("x", 600), "B": "é"}}
	argv, err := sp.argv()
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range argv[3:] {
		if len(a) > specChunk {
			t.Errorf("argv[%d] is %d bytes; ListExecs cuts at %d", i+3, len(a), specChunk)
		}
	}
	got, err := specOf(argv)
	if err != nil || got.Cwd != sp.Cwd || got.User != sp.User || !maps.Equal(got.Env, sp.Env) {
		t.Errorf("specOf(argv) = %+v, %v; want %+v", got, err, sp)
	}
	if _, err := (spec{Env: map[string]string{"BIG": strings.Repeat("y", 4000)}}).argv(); err == nil || !strings.Contains(err.Error(), "env") {
		t.Errorf("argv of a 4000-byte env = %v, want an error naming env", err)
	}
}

func TestFrameEvent(t *testing.T) {
	f := frame{Type: "result", Main: true, Data: map[string]string{"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"}}
	ev, done := f.event()
	r := ev.GetResult()
	if done || string(r.GetData()["image/png"]) != "\x89PNG\r\n\x1a\n" || string(r.GetData()["text/plain"]) != "<Figure>" || !r.GetIsMainResult() {
		t.Errorf("event(%+v) = %v, %v; want the PNG signature as bytes", f, ev, done)
	}
	if _, done := (&frame{Type: "done"}).event(); !done {
		t.Error("a done frame is not done")
	}
}

// TestDriver runs the driver in the host's python3 and checks the frames
// of a few cells: output that imitates a frame stays output, a cell that
// closes fd 1 does not break the next, the last expression is the main
// result, a traceback names the cell's line, SIGINT between cells is
// harmless.
func TestDriver(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is needed to test the driver: %v", err)
	}
	cmd := exec.Command(py, "-c", driver)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(stdout)
	sc.Buffer(nil, 1<<20)
	cell := func(id, code string) []*berthv1.ExecuteCodeResponse {
		line, _ := json.Marshal(map[string]string{"cell": id, "code": code})
		stdin.Write(append(line, '\n'))
		var evs []*berthv1.ExecuteCodeResponse
		deadline := time.AfterFunc(time.Minute, func() { cmd.Process.Kill() })
		defer deadline.Stop()
		for sc.Scan() {
			var f frame
			if err := json.Unmarshal(sc.Bytes(), &f); err != nil {
				t.Fatalf("driver wrote %q: %v", sc.Text(), err)
			}
			if f.Cell == nil || *f.Cell != id {
				continue
			}
			ev, done := f.event()
			if done {
				return evs
			}
			evs = append(evs, ev)
		}
		t.Fatalf("driver ended: %v", sc.Err())
		return nil
	}
	fake := `{"cell": "b", "type": "done"}`
	evs := cell("a", "x = 41\nprint('"+fake+"')\nimport os\nos.close(1)")
	if len(evs) != 1 || evs[0].GetStdout() != fake+"\n" {
		t.Errorf("cell a: %v, want the fake frame as stdout", evs)
	}
	cmd.Process.Signal(syscall.SIGINT)
	evs = cell("b", "print('after')\nx + 1")
	if len(evs) != 2 || evs[0].GetStdout() != "after\n" || string(evs[1].GetResult().GetData()["text/plain"]) != "42" || !evs[1].GetResult().GetIsMainResult() {
		t.Errorf("cell b: %v, want stdout after, then 42 as the main result", evs)
	}
	evs = cell("c", "def f():\n    return 1/0\nf()")
	if len(evs) != 1 || evs[0].GetError().GetName() != "ZeroDivisionError" || !strings.Contains(strings.Join(evs[0].GetError().GetTraceback(), ""), "return 1/0") {
		t.Errorf("cell c: %v, want ZeroDivisionError with the line", evs)
	}
}
