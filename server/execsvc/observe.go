package execsvc

import (
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/metrics"
)

// streamName is a Stream as the observer's label.
func streamName(s berthv1.Stream) string {
	if s == berthv1.Stream_STREAM_STDERR {
		return "stderr"
	}
	return "stdout"
}

// outcome classifies an exec's result for ExecEnded.
func outcome(res *berthv1.ExecResult) string {
	switch {
	case res.GetOomKilled():
		return metrics.OutcomeOOMKilled
	case res.GetTimedOut():
		return metrics.OutcomeTimedOut
	case res.GetSignal() != "":
		return metrics.OutcomeSignaled
	case res.GetExitCode() == 0:
		return metrics.OutcomeSuccess
	}
	return metrics.OutcomeFailure
}
