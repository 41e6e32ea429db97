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
