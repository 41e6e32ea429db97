package runtime

import (
	"context"
	"log/slog"
	"time"
)

// Phases records how long the steps of one operation took, in order, for
// the operation's log line (slog.LogValuer: a group of step name =
// duration). Its methods do nothing on a nil *Phases; it is not safe for
// concurrent use.
type Phases struct {
	last  time.Time
	steps []slog.Attr
}

// NewPhases returns a Phases whose first step starts now.
func NewPhases() *Phases { return &Phases{last: time.Now()} }

// Done records that step name ended now: it took the time since the
// previous step ended (or since NewPhases).
func (p *Phases) Done(name string) {
	if p == nil {
		return
	}
	now := time.Now()
	p.steps = append(p.steps, slog.Duration(name, now.Sub(p.last)))
	p.last = now
}

// LogValue is the steps as a group, in order.
func (p *Phases) LogValue() slog.Value {
	if p == nil {
		return slog.GroupValue()
	}
	return slog.GroupValue(p.steps...)
}

// phasesKey is the context key of WithPhases.
type phasesKey struct{}

// WithPhases returns ctx carrying ph: Runtime.Create records its steps
// in it (image, root, container, task, start).
func WithPhases(ctx context.Context, ph *Phases) context.Context {
	return context.WithValue(ctx, phasesKey{}, ph)
}

// phasesOf returns the Phases of ctx (WithPhases), nil for none.
func phasesOf(ctx context.Context) *Phases {
	ph, _ := ctx.Value(phasesKey{}).(*Phases)
	return ph
}
