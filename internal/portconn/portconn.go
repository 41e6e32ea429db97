// Package portconn carries one forwarded TCP connection over a PortForward
// stream: the agent's side (it dials 127.0.0.1:port in its sandbox) and,
// for runc sandboxes, berthd's own (it dials in the sandbox's network
// namespace itself, one hop less). Both answer alike: the same copies, the
// same half-closes, the same errors.
//
// Flow control is the stream's and the socket's: a read waits for the
// previous chunk to be handed to gRPC, which waits for the stream's window,
// so a slow reader on either side slows the other and nothing here buffers
// more than one chunk.
package portconn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/wire"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

const (
	// MaxChunkBytes is the most one data message carries: large reads
	// make few messages, each a wake-up of every hop (256 KiB gave 3.5
	// times the throughput of 32 KiB in make bench, 1 MiB more again).
	MaxChunkBytes = 1 << 20
	// MinChunkBytes is the least buffer a read takes.
	MinChunkBytes = 4 << 10
	// DialTimeout bounds connect(2) to a port whose listen backlog is full
	// (loopback connections are otherwise accepted or refused at once).
	DialTimeout = 10 * time.Second
)

// DataField is the number of the data field of the port-forward messages:
// the same in berth.v1 and berth.agent.v1, requests and responses
// (execsvc's TestPortDataFields), so a data message is relayed as it is.
var DataField = wire.BytesField(&berthv1.PortForwardResponse{}, "data")

// Meta is the ErrorInfo metadata of a forwarded connection's errors.
func Meta(port uint32) map[string]string {
	return map[string]string{"port": strconv.FormatUint(uint64(port), 10)}
}

// Dial connects to 127.0.0.1:port in the network namespace of the calling
// thread, within DialTimeout. Its error is DialError's input.
func Dial(ctx context.Context, port uint32) (*net.TCPConn, error) {
	d := net.Dialer{Timeout: DialTimeout}
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.FormatUint(uint64(port), 10)))
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// Refused reports whether err, a Dial's error, means the port is closed:
// the connection was refused or did not open within DialTimeout (a full
// listen backlog), rather than failing for want of a resource of the
// dialer's own.
func Refused(err error) bool {
	var ne net.Error
	return errors.Is(err, syscall.ECONNREFUSED) || (errors.As(err, &ne) && ne.Timeout())
}

// ClosedError is the status of a Dial to port that Refused: FAILED_PRECONDITION
// PORT_CLOSED naming the port.
func ClosedError(port uint32, err error, meta map[string]string) error {
	why := "nothing listens on it"
	if !errors.Is(err, syscall.ECONNREFUSED) {
		why = fmt.Sprintf("the connection did not open within %v: %v", DialTimeout, err)
	}
	return rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonPortClosed,
		fmt.Sprintf("port %d in the sandbox is closed: %s", port, why), meta)
}

// resetError is the status of a connection that failed after it opened:
// ABORTED CONNECTION_RESET.
func resetError(what string, err error, meta map[string]string) error {
	return rpcstatus.Error(codes.Aborted, rpcstatus.ReasonConnectionReset,
		fmt.Sprintf("the connection to port %s in the sandbox failed: %s: %v", meta["port"], what, err), meta)
}

// Stream is the PortForward stream a connection is carried on, after the
// connected message was sent.
type Stream struct {
	// RecvMsg receives the caller's next message into a *wire.Frame:
	// io.EOF when the caller closed its side.
	RecvMsg func(any) error
	// Data returns the data of a message that is not a plain data chunk
	// (protobuf allows other encodings), or the error that ends the
	// stream: a message other than data.
	Data func(*wire.Frame) ([]byte, error)
	// SendMsg sends a message, a *wire.Frame of a data chunk among them.
	SendMsg func(any) error
	// EOF is the message that says the server closed its writing side.
	EOF any
}

// Relay copies bytes both ways between conn and s until both sides closed
// their writing sides (nil), or one direction fails: the caller's stream
// (its error), the connection (ABORTED CONNECTION_RESET). A half-close of
// the caller shuts down conn's writing side; end of file on conn sends
// s.EOF. The caller closes conn, which ends the other copy; the end of the
// stream's handler ends s.Recv.
func Relay(conn *net.TCPConn, s Stream, meta map[string]string) error {
	in := make(chan error, 1)
	out := make(chan error, 1)
	go func() { in <- toConn(s, conn, meta) }()
	go func() { out <- fromConn(conn, s, meta) }()
	for pending := 2; pending > 0; pending-- {
		select {
		case err := <-in:
			if err != nil {
				return err
			}
		case err := <-out:
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// toConn writes the caller's data to conn until the caller closes its
// side, then shuts down conn's writing side. A plain data message is
// written from gRPC's own buffers, without decoding or copying it: one
// writev(2) of its buffers (one per HTTP/2 data frame).
func toConn(s Stream, conn *net.TCPConn, meta map[string]string) error {
	var fr wire.Frame
	defer fr.Free()
	var views [][]byte
	for {
		err := s.RecvMsg(&fr)
		var data net.Buffers
		if err == nil {
			if _, ok := fr.Chunk(DataField); ok {
				views = fr.Buffers(views[:0])
				data = views
			} else {
				var b []byte
				b, err = s.Data(&fr)
				data = append(views[:0], b)
			}
		}
		if errors.Is(err, io.EOF) {
			if err := conn.CloseWrite(); err != nil {
				return resetError("shut down writing", err, meta)
			}
			return nil
		}
		if err != nil {
			return err
		}
		if _, err := data.WriteTo(conn); err != nil {
			return resetError("write", err, meta)
		}
	}
}

// fromConn sends what conn reads, then s.EOF when the server closed its
// writing side (readChunk).
func fromConn(conn *net.TCPConn, s Stream, meta map[string]string) error {
	rc, err := conn.SyscallConn()
	if err != nil {
		return resetError("read", err, meta)
	}
	var fr wire.Frame
	defer fr.Free()
	for {
		n, err := readChunk(&fr, rc)
		if n > 0 {
			if err := s.SendMsg(&fr); err != nil {
				return err
			}
		}
		if errors.Is(err, io.EOF) {
			return s.SendMsg(s.EOF)
		}
		if err != nil {
			return resetError("read", err, meta)
		}
	}
}

// readChunk reads what the socket of rc holds, up to MaxChunkBytes, into
// fr: it waits until the socket is readable holding no buffer, then takes
// one as large as the bytes queued (ioctl FIONREAD, at least
// MinChunkBytes) and reads straight into it, the pooled buffer gRPC sends
// the message from. An idle connection holds no buffer; a fast one makes
// few large messages. It returns io.EOF at end of file.
func readChunk(fr *wire.Frame, rc syscall.RawConn) (int, error) {
	var (
		n   int
		err error
	)
	rerr := rc.Read(func(fd uintptr) bool {
		size := MinChunkBytes
		if queued, ierr := unix.IoctlGetInt(int(fd), unix.SIOCINQ); ierr == nil {
			if queued == 0 {
				// Nothing queued: a peek tells waiting (EAGAIN) from
				// end of file or an error, which the read below
				// returns. Waiting only after EAGAIN, as Go's own
				// reads do, misses no edge of the netpoller.
				var b [1]byte
				if _, _, perr := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT); errors.Is(perr, unix.EAGAIN) {
					return false
				}
			}
			size = min(max(queued, MinChunkBytes), MaxChunkBytes)
		}
		n, err = fr.Fill(DataField, size, func(p []byte) (int, error) {
			k, err := unix.Read(int(fd), p)
			switch {
			case err != nil:
				return 0, err
			case k == 0:
				return 0, io.EOF
			}
			return k, nil
		})
		// EAGAIN: another reader took the bytes; wait again.
		return !errors.Is(err, unix.EAGAIN)
	})
	if rerr != nil {
		return 0, rerr
	}
	if err != nil && !errors.Is(err, io.EOF) {
		err = os.NewSyscallError("read", err)
	}
	return n, err
}
