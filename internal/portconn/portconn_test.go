package portconn

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/wire"
)

// TestRelay carries one connection both ways: the caller's data and its
// half-close reach the server, which answers more than MaxChunkBytes and
// closes at once (its data and its FIN arrive together); every byte
// arrives in order in messages of at most MaxChunkBytes, then EOF, then
// Relay returns nil.
func TestRelay(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	answer := make([]byte, 3*MaxChunkBytes+12345)
	rand.Read(answer)
	gotReq := make(chan []byte, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		req, _ := io.ReadAll(c) // to the caller's half-close
		gotReq <- req
		c.Write(answer)
	}()
	c, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	conn := c.(*net.TCPConn)
	defer conn.Close()

	requests := [][]byte{[]byte("GET "), []byte("/big")}
	var mu sync.Mutex
	var got []byte
	var sizes []int
	eof := false
	var buf []byte
	s := Stream{
		RecvMsg: func(m any) error {
			if len(requests) == 0 {
				return io.EOF
			}
			fr := m.(*wire.Frame)
			r := requests[0]
			requests = requests[1:]
			_, err := fr.Fill(DataField, len(r), func(p []byte) (int, error) { return copy(p, r), nil })
			return err
		},
		Data: func(*wire.Frame) ([]byte, error) { return nil, errors.New("not data") },
		SendMsg: func(m any) error {
			mu.Lock()
			defer mu.Unlock()
			if m == "eof" {
				eof = true
				return nil
			}
			fr := m.(*wire.Frame)
			n, ok := fr.Chunk(DataField)
			if !ok || eof {
				t.Errorf("message after eof or not a chunk (%v)", ok)
			}
			sizes = append(sizes, n)
			got = append(got, fr.Data(&buf)...)
			return nil
		},
		EOF: "eof",
	}
	done := make(chan error, 1)
	go func() { done <- Relay(conn, s, Meta(80)) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Relay: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Relay did not return after the server's end of file")
	}
	if req := <-gotReq; string(req) != "GET /big" {
		t.Errorf("server read %q; want %q then end of file", req, "GET /big")
	}
	if !bytes.Equal(got, answer) || !eof {
		t.Errorf("caller got %d bytes (equal %v), eof %v; want the %d answered, then eof", len(got), bytes.Equal(got, answer), eof, len(answer))
	}
	for _, n := range sizes {
		if n > MaxChunkBytes || n == 0 {
			t.Errorf("a message of %d bytes; want 1 to %d", n, MaxChunkBytes)
		}
	}
}
