package files

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"unicode/utf8"

	"golang.org/x/sys/unix"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/tartree"
)

// changedError says that a file changed while it was read or archived.
type changedError = tartree.ChangedError

// tooLargeError says that a size cap of the agent was exceeded.
type tooLargeError struct {
	path   string
	what   string // e.g. "read of 5368709120 bytes"
	limit  uint64
	reason string // ReasonFileTooLarge or ReasonListTooLarge
	flag   string // the agent flag that sets the cap
}

func (e *tooLargeError) Error() string {
	return fmt.Sprintf("%s: %s exceeds the agent's cap of %d (berth-agent --%s)", display(e.path), e.what, e.limit, e.flag)
}

// quotaError says that a write would need more than the sandbox's disk
// quota.
type quotaError struct {
	path  string
	what  string // e.g. "a write of 5368709120 bytes"
	limit uint64
}

func (e *quotaError) Error() string {
	return fmt.Sprintf("%s: %s exceeds the sandbox's disk quota of %d bytes (resources.disk_bytes)", display(e.path), e.what, e.limit)
}

// userError says that the agent could not take on the workload user's
// identity for a file operation; nothing was done.
type userError struct {
	uid, gid uint32
	err      error
}

func (e *userError) Error() string {
	return fmt.Sprintf("act as workload user %d:%d: %v (berth-agent needs CAP_SETUID and CAP_SETGID)", e.uid, e.gid, e.err)
}

func (e *userError) Unwrap() error { return e.err }

// notRegularError says that a path is not a regular file where one is
// needed.
type notRegularError struct {
	path string
	typ  string
}

func (e *notRegularError) Error() string {
	return fmt.Sprintf("%s is a %s, not a regular file", display(e.path), e.typ)
}

// openError describes a failed open(2) of path. ENXIO and ENODEV mean a
// special file that cannot be opened (a unix socket, a FIFO without a
// reader, a device without a driver): a *notRegularError naming its type,
// like any other file that is not regular; anything else a *fs.PathError.
func openError(path string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, unix.ENXIO) || errors.Is(err, unix.ENODEV) {
		var st unix.Stat_t
		if unix.Stat(path, &st) == nil && st.Mode&unix.S_IFMT != unix.S_IFREG {
			return &notRegularError{path, typeName(st.Mode)}
		}
	}
	return pathError("open", path, err)
}

// invalid returns an INVALID_ARGUMENT status naming field.
func invalid(field, description string) error {
	return rpcstatus.InvalidArgument(field, description)
}

// toStatus converts an error of a file operation to the status returned to
// berthd. It is the one place where errno values become codes; statuses
// already built (invalid arguments) pass unchanged and anything
// unclassified becomes INTERNAL with its message (which names the path).
func (s *Service) toStatus(err error) error {
	if err == nil {
		return nil
	}
	if rpcstatus.Reason(err) != "" {
		return err
	}
	var (
		changed   *changedError
		tooLarge  *tooLargeError
		quota     *quotaError
		entry     *tartree.EntryError
		archive   *tartree.ArchiveError
		user      *userError
		notReg    *notRegularError
		pathErr   *fs.PathError
		errno     unix.Errno
		pathShown string
	)
	switch {
	case errors.As(err, &changed):
		return rpcstatus.Error(codes.Aborted, rpcstatus.ReasonFileChanged, err.Error(), meta(changed.Path))
	case errors.As(err, &tooLarge):
		m := meta(tooLarge.path)
		m["limit"] = strconv.FormatUint(tooLarge.limit, 10)
		return rpcstatus.Error(codes.FailedPrecondition, tooLarge.reason, err.Error(), m)
	case errors.As(err, &quota):
		m := meta(quota.path)
		m["limit"] = strconv.FormatUint(quota.limit, 10)
		return rpcstatus.Error(codes.ResourceExhausted, rpcstatus.ReasonNoSpace, err.Error(), m)
	case errors.As(err, &entry):
		reason := rpcstatus.ReasonTarEntryInvalid
		if entry.Unsafe {
			reason = rpcstatus.ReasonTarEntryUnsafe
		}
		return rpcstatus.Error(codes.InvalidArgument, reason, err.Error(), map[string]string{"entry": display(entry.Entry)})
	case errors.As(err, &archive):
		return archiveError(archive.Why)
	case errors.As(err, &user):
		return rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonAgentCannotActAsUser, err.Error(), nil)
	case errors.As(err, &notReg):
		return rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonNotRegularFile, err.Error(), meta(notReg.path))
	case errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled:
		return status.Error(codes.Canceled, "canceled: "+err.Error())
	case errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded:
		return status.Error(codes.DeadlineExceeded, "deadline exceeded: "+err.Error())
	}
	if errors.As(err, &pathErr) {
		pathShown = pathErr.Path
	}
	msg := err.Error()
	if !utf8.ValidString(msg) {
		msg = display(msg)
	}
	if !errors.As(err, &errno) {
		s.log.Error("file operation failed", "err", msg)
		return rpcstatus.Error(codes.Internal, rpcstatus.ReasonInternal, msg, meta(pathShown))
	}
	if limit := rpcstatus.SandboxLimit(msg, errno, meta(pathShown)); limit != nil && errno != unix.EAGAIN {
		return limit // out of memory or descriptors: the sandbox's limits
	}
	code, reason := errnoCode(errno)
	if errno == unix.ENAMETOOLONG {
		// Request paths are checked against NAME_MAX and PATH_MAX first;
		// this is a path that grew too long in resolution (symlinks).
		m := meta(pathShown)
		m["field"] = "path"
		return rpcstatus.Error(code, reason, msg, m, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "path", Description: msg}}})
	}
	if code == codes.Internal {
		s.log.Error("file operation failed", "err", msg)
	}
	m := meta(pathShown)
	if reason == rpcstatus.ReasonFileRefused {
		m["errno"] = unix.ErrnoName(errno)
	}
	return rpcstatus.Error(code, reason, msg, m)
}

// errnoCode maps an errno from a file system call to a code and reason.
func errnoCode(errno unix.Errno) (codes.Code, string) {
	switch errno {
	case unix.ENOENT:
		return codes.NotFound, rpcstatus.ReasonFileNotFound
	case unix.EEXIST:
		return codes.AlreadyExists, rpcstatus.ReasonFileExists
	case unix.ENOTDIR:
		return codes.FailedPrecondition, rpcstatus.ReasonNotADirectory
	case unix.EISDIR:
		return codes.FailedPrecondition, rpcstatus.ReasonIsADirectory
	case unix.ENOTEMPTY:
		return codes.FailedPrecondition, rpcstatus.ReasonDirectoryNotEmpty
	case unix.ELOOP:
		return codes.FailedPrecondition, rpcstatus.ReasonSymlinkLoop
	case unix.EXDEV:
		return codes.FailedPrecondition, rpcstatus.ReasonCrossDevice
	case unix.EROFS:
		return codes.FailedPrecondition, rpcstatus.ReasonReadOnlyFS
	case unix.EBUSY, unix.ETXTBSY:
		return codes.FailedPrecondition, rpcstatus.ReasonFileBusy
	case unix.EACCES, unix.EPERM:
		return codes.PermissionDenied, rpcstatus.ReasonPermissionDenied
	case unix.ENOSPC, unix.EDQUOT:
		return codes.ResourceExhausted, rpcstatus.ReasonNoSpace
	case unix.ENAMETOOLONG:
		return codes.InvalidArgument, rpcstatus.ReasonInvalidArgument
	case unix.EFBIG:
		return codes.FailedPrecondition, rpcstatus.ReasonFileTooLarge
	case unix.EINVAL, unix.EIO, unix.ENXIO, unix.ENODEV, unix.EOPNOTSUPP, unix.ESPIPE, unix.EOVERFLOW,
		unix.EAGAIN, unix.EMLINK, unix.ENOTTY, unix.ETIMEDOUT, unix.ESTALE, unix.ENODATA, unix.E2BIG:
		// What the file or its file system answered for this file: a
		// /proc file that takes only aligned reads (EINVAL), a device
		// without data (ENXIO, EIO), a file system without the feature.
		return codes.FailedPrecondition, rpcstatus.ReasonFileRefused
	}
	return codes.Internal, rpcstatus.ReasonInternal
}

// meta returns ErrorInfo metadata naming path, or an empty map.
func meta(path string) map[string]string {
	if path == "" {
		return map[string]string{}
	}
	return map[string]string{"path": display(path)}
}

// display returns s when it is valid UTF-8; otherwise each byte that is not
// part of valid UTF-8 is written as \xNN. It is what FileInfo.display_name
// and error messages show: proto3 strings must be valid UTF-8.
func display(s string) string { return tartree.Display(s) }

// pathError wraps errno as a *fs.PathError of op on path.
func pathError(op, path string, err error) error {
	if err == nil {
		return nil
	}
	return &fs.PathError{Op: op, Path: path, Err: err}
}

// errnoOf returns the errno err carries.
func errnoOf(err error) (unix.Errno, bool) {
	var errno unix.Errno
	ok := errors.As(err, &errno)
	return errno, ok
}
