package execsvc

import (
	"math"
	"testing"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	berthstatus "github.com/berth-sandbox/berth/server/status"
)

// TestRunSpecCapsNoWrap: two caps whose sum wraps past 2^64 are refused
// naming the cap that made it too large, not waved through as a small sum
// (issue 21: stderr_limit_bytes 2^64-1 took berthd to 1.4 GB).
func TestRunSpecCapsNoWrap(t *testing.T) {
	s := &Service{cfg: Config{RunStdoutBytes: 2 << 20, RunStderrBytes: 1 << 20, RunMaxOutputBytes: 64 << 20}}
	for _, tc := range []struct {
		out, errOut uint64
		field       string
	}{
		{0, math.MaxUint64, "process.stderr_limit_bytes"},
		{1, math.MaxUint64, "process.stderr_limit_bytes"},
		{math.MaxUint64, 0, "process.stdout_limit_bytes"},
		{math.MaxUint64, math.MaxUint64, "process.stdout_limit_bytes"},
		{32 << 20, math.MaxUint64 - 32<<20 + 1, "process.stderr_limit_bytes"},
		{0, 0, ""},
		{32 << 20, 32 << 20, ""},
	} {
		spec, err := s.runSpec(&berthv1.ProcessSpec{Argv: []string{"true"}, StdoutLimitBytes: tc.out, StderrLimitBytes: tc.errOut})
		if got := berthstatus.InvalidField(err); got != tc.field {
			t.Errorf("runSpec(stdout %d, stderr %d) = %v, %v; want INVALID_ARGUMENT naming %q", tc.out, tc.errOut, spec, err, tc.field)
		}
		if err == nil && spec.GetStdoutLimitBytes()+spec.GetStderrLimitBytes() > s.cfg.RunMaxOutputBytes {
			t.Errorf("runSpec(stdout %d, stderr %d) caps %d + %d, above the maximum %d", tc.out, tc.errOut,
				spec.GetStdoutLimitBytes(), spec.GetStderrLimitBytes(), s.cfg.RunMaxOutputBytes)
		}
	}
}
