package client_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/test/bufconn"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// chunkedFiles answers ReadFile with a header and then data in chunks of
// the sizes in sizes, in order.
type chunkedFiles struct {
	berthv1.UnimplementedFileServiceServer
	data  []byte
	sizes []int
}

func (f chunkedFiles) ReadFile(req *berthv1.ReadFileRequest, s berthv1.FileService_ReadFileServer) error {
	h := &berthv1.ReadFileHeader{Info: &berthv1.FileInfo{Path: []byte(req.GetPath())}, LengthBytes: uint64(len(f.data))}
	if err := s.Send(&berthv1.ReadFileResponse{Part: &berthv1.ReadFileResponse_Header{Header: h}}); err != nil {
		return err
	}
	off := 0
	for _, n := range f.sizes {
		if err := s.Send(&berthv1.ReadFileResponse{Part: &berthv1.ReadFileResponse_Chunk{Chunk: f.data[off : off+n]}}); err != nil {
			return err
		}
		off += n
	}
	return nil
}

func dialFiles(t *testing.T, files berthv1.FileServiceServer) *client.Client {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	berthv1.RegisterFileServiceServer(srv, files)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	c, err := client.Dial(t.Context(), "passthrough:///bufnet", client.WithInsecure(), client.WithDialOptions(
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
	))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestReadFileWriters: ReadFile writes every byte of every chunk, in
// order, to a regular file (at its offset), to a pipe from os.Pipe (a
// non-blocking descriptor that fills) and to a bytes.Buffer, for chunks of
// one byte, of one HTTP/2 frame (16 KiB), of frames and a part, of 1 MiB
// and of 3 MiB (each received in many of gRPC's buffers), and an empty
// one; a write that fails ends the read with the writer's error.
func TestReadFileWriters(t *testing.T) {
	sizes := []int{1, 16 << 10, 40<<10 + 7, 1 << 20, 0, 3 << 20, 5}
	total := 0
	for _, n := range sizes {
		total += n
	}
	data := make([]byte, total)
	rand.Read(data)
	c := dialFiles(t, chunkedFiles{data: data, sizes: sizes})
	dir := t.TempDir()

	t.Run("file", func(t *testing.T) {
		name := filepath.Join(dir, "out")
		f, err := os.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		// Something before: the chunks follow it.
		f.WriteString("x")
		h, err := c.ReadFile(t.Context(), "sb", "/f", f)
		if err != nil || h.GetLengthBytes() != uint64(total) {
			t.Fatalf("ReadFile = %v, %v; want %d bytes", h, err, total)
		}
		got, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, append([]byte("x"), data...)) {
			t.Errorf("the file holds %d bytes, not x and the %d sent", len(got), total)
		}
	})
	t.Run("pipe", func(t *testing.T) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan []byte)
		go func() {
			b, _ := io.ReadAll(r)
			got <- b
		}()
		_, err = c.ReadFile(t.Context(), "sb", "/f", w)
		w.Close()
		if err != nil {
			t.Fatal(err)
		}
		if b := <-got; !bytes.Equal(b, data) {
			t.Errorf("the pipe gave %d bytes, not the %d sent", len(b), total)
		}
	})
	t.Run("buffer", func(t *testing.T) {
		var buf bytes.Buffer
		if _, err := c.ReadFile(t.Context(), "sb", "/f", &buf); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.Bytes(), data) {
			t.Errorf("the buffer holds %d bytes, not the %d sent", buf.Len(), total)
		}
	})
	t.Run("read-only file", func(t *testing.T) {
		name := filepath.Join(dir, "ro")
		if err := os.WriteFile(name, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		_, err = c.ReadFile(t.Context(), "sb", "/f", f)
		var pathErr *os.PathError
		if !errors.As(err, &pathErr) || !strings.Contains(err.Error(), "read file /f: write") || pathErr.Path != name {
			t.Errorf("ReadFile into a read-only file: %v, want a write error naming %s", err, name)
		}
	})
}
