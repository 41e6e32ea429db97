package agent_test

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// BenchmarkExecTrue measures one `true` round trip through the real agent
// over its unix socket, on a kept connection: start, started, exited.
func BenchmarkExecTrue(b *testing.B) {
	a := startAgent(b, "--retention", "1s")
	for i := 0; b.Loop(); i++ {
		r := a.run(b, fmt.Sprintf("true-%d", i), argv("true"))
		if r.result.GetExitCode() != 0 {
			b.Fatalf("exit code %d", r.result.GetExitCode())
		}
	}
}

// BenchmarkExecOutput measures output throughput: 64 MiB from head(1)
// through the agent's pipe, ring and stream to a client that only counts
// the bytes, with the default ring: flow control delivers every byte; the
// short retention frees each exec soon after the next starts.
func BenchmarkExecOutput(b *testing.B) {
	const size = 64 << 20
	a := startAgent(b, "--retention", "10ms")
	b.SetBytes(size)
	var events uint64
	for i := 0; b.Loop(); i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		spec := argv("head", "-c", fmt.Sprint(size), "/dev/zero")
		stream := a.startExec(b, ctx, fmt.Sprintf("out-%d", i), spec)
		var received uint64
		for {
			resp, err := stream.Recv()
			if err != nil {
				b.Fatalf("Recv: %v", err)
			}
			if o := resp.GetOutput(); o != nil {
				received += uint64(len(o.GetData()))
				events++
			}
			if res := resp.GetExited().GetResult(); res != nil {
				if res.GetStdoutBytes() != size || received != size {
					b.Fatalf("stdout_bytes = %d, received %d bytes, want %d", res.GetStdoutBytes(), received, size)
				}
				break
			}
		}
		cancel()
	}
	b.ReportMetric(float64(events)/float64(b.N), "events/op")
}
