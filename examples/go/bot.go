// The bot loop on berth's Go SDK (docs/clients.md): BERTH_ADDR=unix:///... go run ./examples/go PROJECT_DIR
package main

import (
	"context"
	"fmt"
	"github.com/berth-sandbox/berth/client"
	"log"
	"os"
	"strings"
	"time"
)

func main() {
	ctx := context.Background()
	sb := must(client.CreateSandbox(ctx, client.SandboxOptions{User: "1000:1000", Image: os.Getenv("BERTH_IMAGE")}))
	defer sb.Kill(ctx) // deleted at the end
	must(0, sb.Files.UploadDir(ctx, os.Args[1], "/workspace/project"))
	out := func(b []byte) { os.Stdout.Write(b) }
	test := func() *client.CommandResult {
		return must(sb.Commands.Run(ctx, "./test.sh", client.RunOptions{Cwd: "/workspace/project", Timeout: 2 * time.Minute, OnStdout: out, OnStderr: out}))
	}
	if r := test(); r.ExitCode != 0 {
		fmt.Printf("tests: exit %d\n", r.ExitCode)
		code := string(must(sb.Files.Read(ctx, "/workspace/project/calc.sh"))) // the bot's model would write the fix
		must(sb.Files.Write(ctx, "/workspace/project/calc.sh", []byte(strings.Replace(code, "2 + 3", "2 + 2", 1))))
		fmt.Printf("after the fix: exit %d\n", test().ExitCode)
	}
	if _, err := sb.Files.Read(ctx, "/workspace/project/notes.txt"); client.IsReason(err, client.ReasonFileNotFound) {
		fmt.Printf("typed error: %s\n", err)
	}
	slow := must(sb.Commands.Run(ctx, "sleep 60", client.RunOptions{Timeout: time.Second}))
	fmt.Printf("timeout: timed_out=%v signal=%s\n", slow.TimedOut, slow.Signal)
}
func must[T any](v T, err error) T { // log.Fatal skips the deferred Kill: the idle timeout reaps the sandbox
	if err != nil {
		log.Fatal(err)
	}
	return v
}
