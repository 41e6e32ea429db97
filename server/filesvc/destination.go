package filesvc

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"

	"github.com/berth-sandbox/berth/internal/fdpass"
	"github.com/berth-sandbox/berth/internal/rangeread"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/tartree"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// receivedDescriptors is the AuthInfo of a connection that carries
// descriptors beside its bytes (auth.PeerCred of a unix socket).
type receivedDescriptors interface {
	Descriptors() *fdpass.Queue
}

// destination takes the descriptor req.destination names (by st_dev and
// st_ino) from those the caller's own connection sent, and returns it
// when berthd may write the read into it (checkDestination); the caller
// closes it. It returns -1, and the read is streamed, when the request
// names none, the connection carried no such descriptor (TCP, net/http,
// a call a gateway forwarded: only the connection that sent a
// descriptor can name it) or it fails the checks.
func (f *Service) destination(ctx context.Context, sandboxID string, req *berthv1.ReadFileRequest) int {
	d := req.GetDestination()
	if d == nil {
		return -1
	}
	p, ok := peer.FromContext(ctx)
	if !ok {
		return -1
	}
	h, ok := p.AuthInfo.(receivedDescriptors)
	if !ok {
		f.debug("ReadFile is streamed: its connection carries no descriptors", "sandbox_id", sandboxID)
		return -1
	}
	fd, ok := h.Descriptors().Take(d.GetDev(), d.GetIno())
	if !ok {
		f.debug("ReadFile is streamed: its connection sent no descriptor of its destination", "sandbox_id", sandboxID, "dev", d.GetDev(), "ino", d.GetIno())
		return -1
	}
	if err := checkDestination(fd); err != nil {
		unix.Close(fd)
		f.debug("ReadFile is streamed: berthd refused its destination", "sandbox_id", sandboxID, "err", err)
		return -1
	}
	return fd
}

// checkDestination checks a descriptor a caller sent before berthd, as
// root, writes into it: a regular file (a FIFO, socket or device could
// block the write or do anything), of a local disk file system (diskFS: a
// FUSE file's write waits for a process the caller may run), open for
// writing without O_APPEND (a write at the file's offset, as the caller's
// own write(2) would make) and not O_PATH. berthd writes into nothing but
// this descriptor, and never opens a path for it.
func checkDestination(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("fstat: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("not a regular file (mode %#o)", st.Mode)
	}
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		return fmt.Errorf("fstatfs: %w", err)
	}
	if !diskFS(sfs.Type) {
		return fmt.Errorf("on a file system of type %#x, not a local disk's", sfs.Type)
	}
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return fmt.Errorf("fcntl F_GETFL: %w", err)
	}
	if acc := flags & unix.O_ACCMODE; acc != unix.O_WRONLY && acc != unix.O_RDWR {
		return fmt.Errorf("not open for writing (flags %#o)", flags)
	}
	if flags&(unix.O_APPEND|unix.O_PATH) != 0 {
		return fmt.Errorf("open with O_APPEND or O_PATH (flags %#o)", flags)
	}
	return nil
}

// copyRange writes r into the destination dest (rangeread.Copy), with
// the statuses sendRange gives, and for a failing write of dest
// RESOURCE_EXHAUSTED NO_SPACE (ENOSPC, EDQUOT) or FAILED_PRECONDITION
// FILE_OPERATION_REFUSED naming the errno.
func (f *Service) copyRange(ctx context.Context, sandboxID string, dest int, r rangeread.Range) error {
	mode, err := rangeread.Copy(ctx, dest, r, f.moved("out"))
	f.debug("ReadFile wrote into its destination", "sandbox_id", sandboxID, "with", mode, "err", err)
	var destErr *rangeread.DestinationError
	var errno unix.Errno
	if errors.As(err, &destErr) && errors.As(destErr.Err, &errno) {
		meta := map[string]string{"path": tartree.Display(r.Path), "errno": unix.ErrnoName(errno)}
		msg := fmt.Sprintf("read %s: %v", tartree.Display(r.Path), destErr)
		if errno == unix.ENOSPC || errno == unix.EDQUOT {
			return rpcstatus.Error(codes.ResourceExhausted, rpcstatus.ReasonNoSpace, msg, meta)
		}
		return rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonFileRefused, msg, meta)
	}
	return rangeError(err)
}

// debug logs msg at debug level, when the Service has a log
// (WithDirectReads).
func (f *Service) debug(msg string, args ...any) {
	if f.direct.log != nil {
		f.direct.log.Debug(msg, args...)
	}
}
