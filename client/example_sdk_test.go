package client_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/berth-sandbox/berth/client"
)

// The SDK surface: a sandbox deleted at the end, a command with a timeout
// of its own streaming its output, a file written and read, a typed error.
// The connection comes from $BERTH_ADDR (else berthd's default socket).
func ExampleCreateSandbox() {
	ctx := context.Background()
	sb, err := client.CreateSandbox(ctx, client.SandboxOptions{User: "1000:1000"})
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Kill(ctx)

	r, err := sb.Commands.Run(ctx, "echo hi; sleep 60", client.RunOptions{
		Timeout:  time.Second, // the command's own: berthd stops it
		OnStdout: func(b []byte) { os.Stdout.Write(b) },
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(r.TimedOut, r.Signal)

	if _, err := sb.Files.Write(ctx, "/workspace/note.txt", []byte("hello\n")); err != nil {
		log.Fatal(err)
	}
	b, err := sb.Files.Read(ctx, "/workspace/note.txt")
	fmt.Printf("%q %v\n", b, err)

	if _, err := sb.Files.Read(ctx, "/workspace/missing"); client.IsReason(err, client.ReasonFileNotFound) {
		fmt.Println("no such file")
	}
}

// The state calls: a sandbox paused and resumed, snapshotted with labels,
// forked into two children that go their own ways (the same request id
// would return the same two), and hibernated until the next command wakes
// it (docs/state.md).
func ExampleSandbox_Fork() {
	ctx := context.Background()
	sb, err := client.CreateSandbox(ctx, client.SandboxOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Kill(ctx)
	if _, err := sb.Files.Write(ctx, "/workspace/state", []byte("warm\n")); err != nil {
		log.Fatal(err)
	}

	if err := sb.Pause(ctx); err != nil { // no CPU, memory kept
		log.Fatal(err)
	}
	if _, err := sb.Commands.Run(client.NoResume(ctx), "true", client.RunOptions{}); client.IsReason(err, client.ReasonSandboxPaused) {
		fmt.Println("paused")
	}
	if err := sb.Resume(ctx); err != nil {
		log.Fatal(err)
	}

	snap, err := sb.Snapshot(ctx, map[string]string{"step": "warm"})
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Client.DeleteSnapshot(ctx, snap.GetId())

	kids, err := sb.Fork(ctx, client.ForkOptions{Count: 2, RequestID: "warm-1"})
	if err != nil {
		log.Fatal(err)
	}
	for i, k := range kids {
		defer k.Kill(ctx)
		k.Files.Write(ctx, "/workspace/state", fmt.Appendf(nil, "kid %d\n", i))
	}

	kept, err := sb.Hibernate(ctx) // HIBERNATION_PROCESSES_ENDED under runc
	if err != nil {
		log.Fatal(err)
	}
	r, err := sb.Commands.Run(ctx, "cat /workspace/state", client.RunOptions{}) // wakes it
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%v %s", kept, r.Stdout)
}
