package runtime

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestPhases: each step takes the time since the one before, in the order
// recorded, and a log line shows them as a group; a nil *Phases records
// and shows nothing.
func TestPhases(t *testing.T) {
	began := time.Now()
	p := NewPhases()
	time.Sleep(2 * time.Millisecond)
	p.Done("first")
	p.Done("second")
	elapsed := time.Since(began)
	steps := p.LogValue().Group()
	if len(steps) != 2 || steps[0].Key != "first" || steps[1].Key != "second" {
		t.Fatalf("steps %v, want first then second", steps)
	}
	if d := steps[0].Value.Duration(); d < 2*time.Millisecond {
		t.Errorf("first took %v, want at least the 2ms slept before it", d)
	}
	// Counted from the start, second would hold first's time again.
	if sum := steps[0].Value.Duration() + steps[1].Value.Duration(); sum > elapsed {
		t.Errorf("steps add up to %v, more than the %v that passed", sum, elapsed)
	}
	var b bytes.Buffer
	slog.New(slog.NewTextHandler(&b, nil)).Info("done", slog.Any("took", p))
	if !strings.Contains(b.String(), "took.first=") || !strings.Contains(b.String(), "took.second=") {
		t.Errorf("log line %q lacks took.first and took.second", b.String())
	}

	var none *Phases
	none.Done("x")
	if g := none.LogValue().Group(); len(g) != 0 {
		t.Errorf("nil Phases shows %v, want nothing", g)
	}
}
