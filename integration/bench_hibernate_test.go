package integration

import (
	"context"
	"io"
	"strconv"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// hibernateMiB is how much memory the hibernate-gvisor group's sandboxes
// hold touched (testdata/holdmem).
const hibernateMiB = 100

// benchHibernateGVisor is BenchmarkSideBySide's hibernate-gvisor group:
// two gVisor sandboxes each run testdata/holdmem holding hibernateMiB MiB
// of pseudo-random bytes; HibernateSandbox of the first checkpoints its
// memory (until its answer: the task saved and removed) and an Exec of
// `true` restores it (until its exit status). The second also runs
// testdata/unixlisten, whose socket bound on the host gVisor cannot save:
// its hibernation ends the processes after the failed checkpoint, and its
// wake starts a new task — the anchors. (A processes-ended hibernation
// without a failed checkpoint is the pause group's, under runc.)
func benchHibernateGVisor(b *testing.B, c *client.Client) {
	ctx := context.Background()
	// run starts holdmem (and, when held, unixlisten) in sandbox id and
	// waits until the memory is touched and the socket bound.
	run := func(id string, held bool) {
		argvs := [][]string{{"/workspace/holdmem", strconv.Itoa(hibernateMiB)}}
		check := "test -e /workspace/holdmem.ready"
		if held {
			argvs = append(argvs, []string{"/workspace/unixlisten", "/workspace/held.sock"})
			check += " && test -S /workspace/held.sock"
		}
		if _, err := c.Run(ctx, id, &berthv1.ProcessSpec{ShellCommand: "rm -f /workspace/holdmem.ready /workspace/held.sock"}); err != nil {
			b.Fatal(err)
		}
		for _, argv := range argvs {
			if _, err := c.ExecBackground(ctx, id, &berthv1.ProcessSpec{Argv: argv}); err != nil {
				b.Fatal(err)
			}
		}
		if !poll(2*time.Minute, func() bool {
			res, err := c.Run(ctx, id, &berthv1.ProcessSpec{ShellCommand: check})
			return err == nil && res.GetResult().ExitCode != nil && res.GetResult().GetExitCode() == 0
		}) {
			b.Fatalf("holdmem in %s never became ready", id)
		}
	}
	holding := func(held bool) string {
		id := benchSandboxOf(b, &berthv1.CreateSandboxRequest{Image: env.image, Runtime: "gvisor",
			Resources: &berthv1.Resources{MemoryBytes: 4 * hibernateMiB << 20}}).GetId()
		installProgram(b, c, id, "holdmem", "/workspace/holdmem")
		installProgram(b, c, id, "unixlisten", "/workspace/unixlisten")
		run(id, held)
		return id
	}
	kept, ended := holding(false), holding(true)
	hibernate := func(id string, want berthv1.Hibernation) time.Duration {
		start := time.Now()
		resp, err := env.sandboxes.HibernateSandbox(ctx, &berthv1.HibernateSandboxRequest{SandboxId: id})
		if err != nil {
			b.Fatal(err)
		}
		d := time.Since(start)
		if resp.GetHibernation() != want {
			b.Fatalf("HibernateSandbox of %s: %v (%s), want %v", id, resp.GetHibernation(), resp.GetDescription(), want)
		}
		return d
	}
	wake := func(id string) time.Duration {
		start := time.Now()
		berthExec(b, c, id, &berthv1.ProcessSpec{Argv: []string{"true"}}, io.Discard)
		return time.Since(start)
	}
	measure(b, "hibernate-gvisor/berth-Hibernate-memory", 0, func(b *testing.B) sample {
		d := hibernate(kept, berthv1.Hibernation_HIBERNATION_MEMORY_KEPT)
		wake(kept)
		return sample{d: d}
	})
	measure(b, "hibernate-gvisor/berth-Exec-restoring", 0, func(b *testing.B) sample {
		hibernate(kept, berthv1.Hibernation_HIBERNATION_MEMORY_KEPT)
		return sample{d: wake(kept)}
	})
	measure(b, "hibernate-gvisor/berth-Hibernate-ended", 0, func(b *testing.B) sample {
		d := hibernate(ended, berthv1.Hibernation_HIBERNATION_PROCESSES_ENDED)
		wake(ended)
		run(ended, true) // the new task runs neither program: off the clock
		return sample{d: d}
	})
	measure(b, "hibernate-gvisor/berth-Exec-waking-ended", 0, func(b *testing.B) sample {
		hibernate(ended, berthv1.Hibernation_HIBERNATION_PROCESSES_ENDED)
		d := wake(ended)
		run(ended, true)
		return sample{d: d}
	})
}
