// Package files is the file half of berth-agent: the agent's FileService
// (berth.agent.v1), which reads, writes, lists and archives files in the
// sandbox's mount namespace as the sandbox's workload user.
//
// Every path-based system call runs on a locked OS thread whose file-system
// identity is the workload user (setfsuid(2), setfsgid(2), setgroups(2) on
// that thread only), so the kernel applies the user's permissions and new
// files are owned by the user; see asUser. Data moves through descriptors
// opened that way. Archive extraction resolves every entry beneath its
// target directory with openat2(2) RESOLVE_BENEATH (see beneath.go).
//
// Errors are domain errors (*fs.PathError carrying an errno, and the types
// in errors.go) until the RPC returns; toStatus turns them into gRPC
// statuses with ErrorInfo naming the path, once, at the handler boundary.
package files

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/berth-sandbox/berth/internal/wire"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
)

// chunkBytes is the size of the data chunks ReadFile and Download send:
// just under 1 MiB, so that a chunk's message (the bytes plus a 4-byte
// field tag and length) fits grpc-go's 1 MiB buffer-pool tier. Its tiers
// jump from 32 KiB to 1 MiB: a 64 KiB chunk took, and often zeroed, a
// 1 MiB buffer (30% of the client's and berthd's CPU in a ReadFile
// profile).
const chunkBytes = 1<<20 - 16

// The chunk fields of the data messages, which the agent reads and writes
// as wire.Frames: a chunk goes from the file into the buffer gRPC sends it
// from, and from the buffers gRPC received it in to the file.
var (
	readChunk   = wire.ChunkField(&agentv1.ReadFileResponse{})
	writeChunk  = wire.ChunkField(&agentv1.WriteFileRequest{})
	uploadChunk = wire.ChunkField(&agentv1.UploadRequest{})
)

// listBatch is the most entries one ListDirResponse carries.
const listBatch = 1000

// listBatchBytes is about the most bytes of entries one ListDirResponse
// carries, well below gRPC's default 4 MiB message limit.
const listBatchBytes = 1 << 20

// Config configures a Service. Zero fields take the defaults named.
type Config struct {
	// UID and GID are the workload user whose permissions file operations
	// run with and who owns what they create. Default 0 and 0.
	UID uint32
	GID uint32
	// AgentDir is the agent's own directory (its run directory, holding
	// its socket and berthd's secret): no call reads, writes, renames or
	// removes anything in it (PERMISSION_DENIED), whatever path or
	// symbolic link names it. Empty: none.
	AgentDir string
	// MaxReadBytes caps the bytes one ReadFile may send, in bytes; a larger
	// read is refused (FILE_TOO_LARGE) before any byte moves. Default 4 GiB.
	MaxReadBytes uint64
	// MaxWriteBytes caps the content of one WriteFile, in bytes; a declared
	// size over it is refused before any byte moves, an undeclared stream
	// when it crosses it (nothing is stored). Default 4 GiB.
	MaxWriteBytes uint64
	// MaxArchiveBytes caps the file contents, in bytes, that one Upload
	// extracts or one Download archives; a Download over it is refused
	// before any byte moves. Default 16 GiB.
	MaxArchiveBytes uint64
	// DiskBytes is the sandbox's disk quota, in bytes, which the kernel
	// enforces on its writable layer. One WriteFile, or the regular files
	// of one Upload, whose size exceeds it could never be stored: they are
	// refused (RESOURCE_EXHAUSTED NO_SPACE) when a declared size or a tar
	// header says so, before their bytes are written, or when the streamed
	// bytes cross it. Sizes are apparent sizes, holes of sparse files
	// included. Zero: no such check (the kernel's quota, if any, still
	// applies).
	DiskBytes uint64
	// MaxListEntries caps the entries of one ListDir or Download, refused
	// (LIST_TOO_LARGE) before any entry is sent (or at the entry past it
	// when the tree grows while it is sent), and of one Upload, refused at
	// the first entry past it. Default 200 000.
	MaxListEntries int
	// Logger receives operational errors; never file contents. Default
	// slog.Default().
	Logger *slog.Logger
}

// DefaultConfig returns a Config with every default filled in.
func DefaultConfig() Config {
	return Config{
		MaxReadBytes:    4 << 30,
		MaxWriteBytes:   4 << 30,
		MaxArchiveBytes: 16 << 30,
		MaxListEntries:  200_000,
	}
}

// Service is the agent's FileService. Its methods are safe for concurrent
// use.
type Service struct {
	agentv1.UnimplementedFileServiceServer

	cfg Config
	log *slog.Logger
	// switchUser is set when the workload user differs from the agent's
	// own effective uid or gid; dropCaps when the agent has effective
	// capabilities, which the workload's processes do not get. Either makes
	// path operations run on a thread of their own (see asUser).
	switchUser bool
	dropCaps   bool
}

var _ agentv1.FileServiceServer = (*Service)(nil)

// New returns a Service for cfg, with zero fields set to their defaults.
func New(cfg Config) *Service {
	d := DefaultConfig()
	if cfg.MaxReadBytes == 0 {
		cfg.MaxReadBytes = d.MaxReadBytes
	}
	if cfg.MaxWriteBytes == 0 {
		cfg.MaxWriteBytes = d.MaxWriteBytes
	}
	if cfg.MaxArchiveBytes == 0 {
		cfg.MaxArchiveBytes = d.MaxArchiveBytes
	}
	if cfg.MaxListEntries <= 0 {
		cfg.MaxListEntries = d.MaxListEntries
	}
	if cfg.AgentDir != "" {
		if dir, err := filepath.EvalSymlinks(cfg.AgentDir); err == nil {
			cfg.AgentDir = dir
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Service{
		cfg:        cfg,
		log:        cfg.Logger,
		switchUser: int(cfg.UID) != os.Geteuid() || int(cfg.GID) != os.Getegid(),
		dropCaps:   hasEffectiveCaps(),
	}
}

// String describes the service's identity for logs.
func (s *Service) String() string {
	return fmt.Sprintf("files as %d:%d", s.cfg.UID, s.cfg.GID)
}
