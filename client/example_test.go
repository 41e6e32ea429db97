package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

func ExampleDial() {
	ctx := context.Background()
	c, err := client.Dial(ctx, berthdAddr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	sb, err := c.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{
		Image:  "berth.dev/base:latest",
		Labels: map[string]string{"owner": "ci"},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSandbox(context.WithoutCancel(ctx), sb.GetId())
	fmt.Println("created", sb.GetId())
	// Output:
	// created sb-1
}

func ExampleClient_Exec() {
	ctx := context.Background()
	c, err := client.Dial(ctx, berthdAddr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// Output bytes reach os.Stdout and os.Stderr exactly as the process
	// wrote them.
	e, err := c.Exec(ctx, "my-sandbox", &berthv1.ProcessSpec{
		Argv:    []string{"ls", "-l", "/workspace"},
		Timeout: durationpb.New(time.Minute),
	}, client.WithStdout(os.Stdout), client.WithStderr(os.Stderr))
	if err != nil {
		log.Fatal(err)
	}
	res, err := e.Wait()
	if err != nil {
		log.Fatal(err)
	}
	for _, d := range e.Dropped() {
		log.Printf("lost output events %d..%d (%d bytes)", d.GetFirstSeq(), d.GetLastSeq(), d.GetLostBytes())
	}
	fmt.Println("exit code", res.GetExitCode(), "timed out", res.GetTimedOut())
	// Output:
	// total 4
	// -rw-r--r-- 1 root root 6 Nov 29 13:00 notes.txt
	// exit code 0 timed out false
}

func ExampleExecution_Stdin() {
	ctx := context.Background()
	c, err := client.Dial(ctx, berthdAddr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	var out strings.Builder
	e, err := c.Exec(ctx, "my-sandbox", &berthv1.ProcessSpec{
		ShellCommand: "tr a-z A-Z",
		Stdin:        true,
	}, client.WithStdout(&out))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := io.Copy(e.Stdin(), strings.NewReader("hello\n")); err != nil {
		log.Fatal(err)
	}
	if err := e.Stdin().Close(); err != nil { // EOF for tr
		log.Fatal(err)
	}
	if _, err := e.Wait(); err != nil {
		log.Fatal(err)
	}
	fmt.Print(out.String())
	// Output:
	// HELLO
}

func ExampleExecution_Signal() {
	ctx := context.Background()
	c, err := client.Dial(ctx, berthdAddr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	e, err := c.Exec(ctx, "my-sandbox", &berthv1.ProcessSpec{Argv: []string{"sleep", "600"}})
	if err != nil {
		log.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := e.Signal(sctx, "TERM"); err != nil {
		log.Fatal(err)
	}
	res, err := e.Wait()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.GetExitCode(), res.GetSignal()) // 143 SIGTERM
	// Output:
	// 143 SIGTERM
}

func ExampleClient_Attach() {
	ctx := context.Background()
	c, err := client.Dial(ctx, berthdAddr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// Name the exec, so that a broken stream can be resumed.
	e, err := c.Exec(ctx, "my-sandbox", &berthv1.ProcessSpec{ShellCommand: "make test"},
		client.WithExecID("build-42"), client.WithStdout(os.Stdout), client.WithStderr(os.Stderr))
	if err != nil {
		log.Fatal(err)
	}
	res, err := e.Wait()
	var ce *client.Error
	if errors.As(err, &ce) && ce.Code == codes.Unavailable {
		// Resume after the last event written: nothing is written twice.
		e, err = c.Attach(ctx, "my-sandbox", "build-42", e.LastSeq(),
			client.WithStdout(os.Stdout), client.WithStderr(os.Stderr))
		if err != nil {
			log.Fatal(err)
		}
		res, err = e.Wait()
	}
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit code", res.GetExitCode())
	// Output:
	// ok  	all tests passed
	// exit code 0
}

func ExampleClient_ExecBackground() {
	ctx := context.Background()
	c, err := client.Dial(ctx, berthdAddr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// Start a server and return at once; it runs on in the sandbox.
	started, err := c.ExecBackground(ctx, "my-sandbox", &berthv1.ProcessSpec{ShellCommand: "python3 -m http.server 8000"},
		client.WithExecID("web"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("started pid", started.GetPid())

	execs, err := c.ListExecs(ctx, "my-sandbox")
	if err != nil {
		log.Fatal(err)
	}
	for _, x := range execs.GetExecs() {
		fmt.Println(x.GetExecId(), x.GetState(), x.GetArgv())
	}

	// Later: stop it, then read everything it wrote and how it ended.
	if _, err := c.SignalExec(ctx, "my-sandbox", "web", "TERM"); err != nil {
		log.Fatal(err)
	}
	e, err := c.Attach(ctx, "my-sandbox", "web", 0, client.WithStdout(os.Stdout), client.WithStderr(os.Stderr))
	if err != nil {
		log.Fatal(err)
	}
	res, err := e.Wait()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit code", res.GetExitCode())
	// Output:
	// started pid 42
	// web EXEC_STATE_RUNNING [sh -c python3 -m http.server 8000]
	// Serving HTTP on 0.0.0.0 port 8000 ...
	// exit code 143
}

func ExampleWithTTY() {
	ctx := context.Background()
	c, err := client.Dial(ctx, berthdAddr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// A terminal of 24 rows and 80 columns: one output stream, "\r\n" line
	// ends, typed input echoed, and programs that check isatty(3) behave as
	// at a terminal. The window grows before the command asks its size.
	var out strings.Builder
	e, err := c.Exec(ctx, "my-sandbox", &berthv1.ProcessSpec{ShellCommand: "read line; stty size", Stdin: true},
		client.WithTTY(24, 80), client.WithStdout(&out))
	if err != nil {
		log.Fatal(err)
	}
	if err := e.Resize(ctx, 50, 132); err != nil {
		log.Fatal(err)
	}
	if _, err := io.WriteString(e.Stdin(), "\n"); err != nil {
		log.Fatal(err)
	}
	if _, err := e.Wait(); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%q\n", out.String())
	// Output: "\r\n50 132\r\n"
}

func ExampleClient_Run() {
	ctx := context.Background()
	c, err := client.Dial(ctx, berthdAddr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	resp, err := c.Run(ctx, "my-sandbox", &berthv1.ProcessSpec{Argv: []string{"uname", "-a"}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d %s", resp.GetResult().GetExitCode(), resp.GetStdout())
	// Output:
	// 0 Linux my-sandbox 6.1.0 #1 SMP x86_64 GNU/Linux
}

func ExampleClient_ListSandboxes() {
	ctx := context.Background()
	c, err := client.Dial(ctx, berthdAddr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	for sb, err := range c.ListSandboxes(ctx, map[string]string{"owner": "ci"}) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(sb.GetId(), sb.GetState())
	}
	// Output:
	// ci-7 SANDBOX_STATE_RUNNING
}

func ExampleClient_ImportImage() {
	ctx := context.Background()
	c, err := client.Dial(ctx, berthdAddr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	f, err := os.Open(archivePath) // e.g. build/base.oci.tar from scripts/base-image.sh
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	images, err := c.ImportImage(ctx, f, "berth.dev/base:latest",
		client.WithProgress(func(sent uint64) { log.Printf("%d bytes sent", sent) }))
	if err != nil {
		log.Fatal(err)
	}
	for _, img := range images {
		fmt.Println(img.GetName(), img.GetDigest())
	}
	// Output:
	// berth.dev/base:latest sha256:6b8c473e445d91a4632ddb39d2bd7649dbe52c62bee2928cd6e3b974a9c4d827
}

func ExampleError() {
	ctx := context.Background()
	c, err := client.Dial(ctx, berthdAddr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	_, err = c.GetSandbox(ctx, "no-such-sandbox")
	var ce *client.Error
	if errors.As(err, &ce) {
		switch ce.Reason {
		case client.ReasonSandboxNotFound:
			fmt.Println("gone")
		case client.ReasonInvalidArgument:
			for _, v := range ce.FieldViolations {
				fmt.Println(v.Field, v.Description)
			}
		default:
			fmt.Println(ce.Code, ce.Reason, ce.Message)
		}
	}
	// Output:
	// gone
}

// ExampleWithToken needs berthd's TLS material at the paths it names, so it
// is compiled, not run.
func ExampleWithToken() {
	ctx := context.Background()
	// berthd on TCP speaks TLS: trust its CA, and send a bearer token from
	// berthd's token file (here from the environment, as the CLI does).
	tlsCfg, err := client.TLSConfigFromFiles("/etc/berth/ca.crt", "", "")
	if err != nil {
		log.Fatal(err)
	}
	c, err := client.Dial(ctx, "berth.example:7443", client.WithTLS(tlsCfg), client.WithToken(os.Getenv("BERTH_TOKEN")))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// Only the token's principal's sandboxes are listed.
	for sb, err := range c.ListSandboxes(ctx, nil) {
		if err != nil {
			var ce *client.Error
			if errors.As(err, &ce) && ce.Reason == client.ReasonUnauthenticated {
				log.Fatal("berthd does not know the token: ", ce.Message)
			}
			log.Fatal(err)
		}
		fmt.Println(sb.GetId(), sb.GetOwner())
	}
}

// ExampleWithTLS needs berthd's TLS material at the paths it names, so it is
// compiled, not run.
func ExampleWithTLS() {
	ctx := context.Background()
	// mTLS: the client certificate's common name is the principal.
	tlsCfg, err := client.TLSConfigFromFiles("/etc/berth/ca.crt", "alice.crt", "alice.key")
	if err != nil {
		log.Fatal(err)
	}
	c, err := client.Dial(ctx, "berth.example:7443", client.WithTLS(tlsCfg))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	sb, err := c.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: "berth.dev/base:latest"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(sb.GetId(), "owned by", sb.GetOwner()) // owned by alice
}
