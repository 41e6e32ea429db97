package agentconn

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"testing"
)

// TestDialSocket connects to a real unix socket, and refuses a symlink to
// it and a regular file in its place without connecting anywhere.
func TestDialSocket(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "a.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan struct{}, 4)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- struct{}{}
			c.Close()
		}
	}()
	conn, err := dialSocket(context.Background(), sock)
	if err != nil {
		t.Fatalf("dialSocket(%s): %v", sock, err)
	}
	conn.Close()
	<-accepted

	link := filepath.Join(dir, "link.sock")
	if err := os.Symlink(sock, link); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "file.sock")
	os.WriteFile(file, nil, 0o600)
	for _, p := range []string{link, file} {
		if _, err := dialSocket(context.Background(), p); !errors.Is(err, ErrNotSocket) {
			t.Errorf("dialSocket(%s) = %v, want ErrNotSocket", p, err)
		}
		if err := CheckSocket(p); !errors.Is(err, ErrNotSocket) {
			t.Errorf("CheckSocket(%s) = %v, want ErrNotSocket", p, err)
		}
	}
	if err := CheckSocket(sock); err != nil {
		t.Errorf("CheckSocket(%s) = %v", sock, err)
	}
	if err := CheckSocket(filepath.Join(dir, "none")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("CheckSocket(missing) = %v, want fs.ErrNotExist", err)
	}
	select {
	case <-accepted:
		t.Errorf("a refused dial connected to the socket")
	default:
	}
}
