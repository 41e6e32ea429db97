package client_test

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// drainingFiles takes WriteFile and Upload streams until they end.
type drainingFiles struct {
	berthv1.UnimplementedFileServiceServer
}

func (drainingFiles) WriteFile(s berthv1.FileService_WriteFileServer) error {
	for {
		if _, err := s.Recv(); err != nil {
			return err
		}
	}
}

func (drainingFiles) Upload(s berthv1.FileService_UploadServer) error {
	for {
		if _, err := s.Recv(); err != nil {
			return err
		}
	}
}

// TestStreamingCallsEndWithTheirContext: WriteFile and Upload return when
// their context ends although the caller's reader blocks (a pipe nobody
// writes), with the context's code.
func TestStreamingCallsEndWithTheirContext(t *testing.T) {
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	berthv1.RegisterFileServiceServer(srv, drainingFiles{})
	go srv.Serve(lis)
	defer srv.Stop()
	c, err := client.Dial(t.Context(), "passthrough:///bufnet", client.WithInsecure(), client.WithDialOptions(
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
	))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for name, call := range map[string]func(context.Context, io.Reader) error{
		"WriteFile": func(ctx context.Context, r io.Reader) error {
			_, err := c.WriteFile(ctx, "sb", "/workspace/f", r)
			return err
		},
		"Upload": func(ctx context.Context, r io.Reader) error {
			_, err := c.Upload(ctx, "sb", "/workspace", r)
			return err
		},
	} {
		pr, pw := io.Pipe()
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		start := time.Now()
		err := call(ctx, pr)
		took := time.Since(start)
		cancel()
		pw.Close() // lets the background read return
		if status.Code(err) != codes.DeadlineExceeded || took > 5*time.Second {
			t.Errorf("%s with a reader that blocks: %v after %v, want DeadlineExceeded at the deadline", name, err, took)
		}
	}
}
