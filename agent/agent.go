// Package agent is berth-agent as a library: the gRPC AgentService that runs
// as PID 1 of every sandbox, starts and supervises processes (one process
// group per exec, reaped with wait4(2)), keeps each exec's numbered output
// events in a bounded ring for re-attaching clients, and reaps the orphans
// that the kernel re-parents to it.
//
// A Server is made with New and runs with Serve or ListenAndServe until its
// context ends; it then stops every running exec (SIGTERM to its process
// group, SIGKILL after Config.KillGrace) and returns.
package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/berth-sandbox/berth/agent/files"
	"github.com/berth-sandbox/berth/agent/launcher"
	"github.com/berth-sandbox/berth/agent/ring"
	"github.com/berth-sandbox/berth/internal/agentproof"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/version"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
)

// Version is the agent's release version, reported by Info and --version:
// internal/version's (set at build time, see there), unless set with
// -ldflags "-X github.com/berth-sandbox/berth/agent.Version=v0.1.0".
var Version = "dev"

func init() {
	if Version == "dev" {
		Version = version.Get()
	}
}

// Config configures a Server. A zero field takes the default named in its
// comment; DefaultConfig returns all defaults.
type Config struct {
	// WorkDir is the working directory of processes started with an empty
	// cwd. New creates it (mkdir -p, mode 0755) when missing and falls back
	// to "/" when it cannot. Default "/workspace".
	WorkDir string
	// Env is the environment every process starts from, as "KEY=value"
	// strings; a start's env is applied on top. Default: the agent's own
	// environment (os.Environ at New), which is the container's.
	Env []string
	// Spans, when set, are the agent's finished trace spans, handed to
	// berthd on the Telemetry stream (package internal/telemetry); nil:
	// the stream ends at once.
	Spans SpanSource
	// ServerOptions are added to the agent's gRPC server (tracing's stats
	// handler).
	ServerOptions []grpc.ServerOption

	// LoginEnv gives every process the workload user's login environment
	// on top of Env: HOME, USER, LOGNAME and SHELL from the image's
	// /etc/passwd, and PATH when Env has none (see loginEnv). berthd sets
	// it; an agent run by hand leaves Env as it is.
	LoginEnv bool
	// KeepHome says that Env's HOME was set on purpose (by the image's
	// config or the sandbox's env) and wins over /etc/passwd; otherwise it
	// is runc's default for the agent's own user and LoginEnv replaces it.
	KeepHome bool
	// NameHost makes /etc/hosts resolve the sandbox's hostname at start
	// (see nameHost). berthd sets it; never on a host.
	NameHost bool
	// UID and GID are the workload user: processes run as it (setuid and
	// setgid before execve, supplementary groups cleared) and files are
	// created as it. Default 0 and 0: root, without capabilities.
	UID uint32
	GID uint32

	// DefaultTimeout applies to a start with no timeout. Default 30m.
	DefaultTimeout time.Duration
	// MinTimeout and MaxTimeout bound a requested timeout; a request outside
	// them is INVALID_ARGUMENT naming process.timeout and the bound, never
	// clamped. Defaults 1s and 24h.
	MinTimeout time.Duration
	MaxTimeout time.Duration
	// KillGrace is how long a process group has between SIGTERM and
	// SIGKILL when its timeout expires or the agent stops. Default 2s.
	KillGrace time.Duration
	// DrainGrace is how long output pipes may stay open after the exec's
	// process exited (a background child can hold them); then the exec ends
	// without waiting further. Default 1s.
	DrainGrace time.Duration

	// RingBytes bounds each exec's retained event log, in bytes: every
	// output event is charged its data size plus EventOverhead. Beyond it
	// the oldest events that every attached reader has read are shed
	// (readers that attach later get ExecDropped); when an attached reader
	// has not read them, the exec's output waits for it (flow control).
	// An event holds at most RingBytes-EventOverhead bytes, so a ring no
	// one reads never holds more than RingBytes. More than EventOverhead;
	// default 8 MiB.
	RingBytes uint64
	// RetainedBytes bounds the output all execs retain together, in bytes
	// (see RingBytes): beyond it the output of ended execs is shed first,
	// then the oldest read output of running ones. Default: an eighth of
	// the sandbox's memory limit (cgroup memory.limit_in_bytes or
	// memory.max), at least 4 MiB and at most 256 MiB; 256 MiB without a
	// limit.
	RetainedBytes uint64
	// WorkloadNofile is the soft RLIMIT_NOFILE every process the agent
	// starts gets, capped by the hard limit (the agent itself raises its
	// own soft limit to the hard one). Default 1024, the traditional
	// value that select(2)-based programs need.
	WorkloadNofile uint64
	// ReapingLauncher has launchers stay and reap the processes they start
	// from the first exec (launcher.ReapingLauncher), as they do by
	// themselves once a kernel ignores CLONE_PARENT (gVisor). Default
	// false: on Linux a launcher's processes are the agent's children.
	ReapingLauncher bool
	// Retention is how long a finished exec stays attachable. Default 10m.
	Retention time.Duration
	// MaxRetained bounds how many finished execs are kept for Retention:
	// beyond it the oldest are forgotten at once (then NOT_FOUND), so
	// that a sandbox running many short execs keeps constant memory and
	// Info and ListExecs constant cost. Default 1000.
	MaxRetained int
	// SessionDir holds a directory per shell session, with the FIFOs of
	// its commands' output. Default /dev/shm/.berth-sessions (memory, never
	// in a snapshot; /.berth-run, the agent's own, is root's alone and has
	// 64 inodes), or berth-sessions-<pid> in os.TempDir without /dev/shm.
	SessionDir string
	// HeartbeatInterval is how long an Exec stream may stay silent before
	// the agent sends ExecHeartbeat. Default 15s.
	HeartbeatInterval time.Duration

	// Logger receives the agent's operational log; it never gets env
	// values. Default slog.Default().
	Logger *slog.Logger
	// ExecLogger receives the one line each exec logs when it finishes
	// (or could not run). Default Logger. berth-agent gives it a handler
	// that holds lines for a moment (package logbatch), so that a busy
	// agent does not wake its shim once per exec.
	ExecLogger *slog.Logger

	// Files caps the file service (package files); its UID, GID and
	// Logger are set from this Config.
	Files files.Config

	// Secret is the per-sandbox secret berthd gave the agent: Info answers
	// a challenge with agentproof.Prove under it. Empty: Info proves
	// nothing.
	Secret []byte
}

// cgroupRoot is where the cgroup filesystem is mounted; berthd mounts the
// sandbox's own cgroup there read-only.
const cgroupRoot = "/sys/fs/cgroup"

// EventOverhead is the bookkeeping charge, in bytes, of one output event
// against Config.RingBytes, on top of its data.
const EventOverhead = 160

// DefaultConfig returns a Config with every default filled in.
func DefaultConfig() Config {
	return Config{
		WorkDir:           "/workspace",
		DefaultTimeout:    30 * time.Minute,
		MinTimeout:        time.Second,
		MaxTimeout:        24 * time.Hour,
		KillGrace:         2 * time.Second,
		DrainGrace:        time.Second,
		RingBytes:         8 << 20,
		WorkloadNofile:    1024,
		Retention:         10 * time.Minute,
		MaxRetained:       1000,
		HeartbeatInterval: 15 * time.Second,
	}
}

// withDefaults returns c with zero fields set to their defaults, or an error
// naming the first inconsistent field.
func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig()
	setDefault(&c.WorkDir, d.WorkDir)
	setDefault(&c.DefaultTimeout, d.DefaultTimeout)
	setDefault(&c.MinTimeout, d.MinTimeout)
	setDefault(&c.MaxTimeout, d.MaxTimeout)
	setDefault(&c.KillGrace, d.KillGrace)
	setDefault(&c.DrainGrace, d.DrainGrace)
	setDefault(&c.RingBytes, d.RingBytes)
	setDefault(&c.WorkloadNofile, d.WorkloadNofile)
	setDefault(&c.Retention, d.Retention)
	setDefault(&c.MaxRetained, d.MaxRetained)
	setDefault(&c.HeartbeatInterval, d.HeartbeatInterval)
	if c.SessionDir == "" {
		c.SessionDir = filepath.Join(os.TempDir(), fmt.Sprintf("berth-sessions-%d", os.Getpid()))
		if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() && os.Getpid() == 1 {
			c.SessionDir = "/dev/shm/.berth-sessions"
		}
	}
	if c.Env == nil {
		c.Env = os.Environ()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.ExecLogger == nil {
		c.ExecLogger = c.Logger
	}
	switch {
	case c.MinTimeout < 0 || c.MinTimeout > c.MaxTimeout:
		return c, fmt.Errorf("config: MinTimeout %v must be within 0..MaxTimeout %v", c.MinTimeout, c.MaxTimeout)
	case c.DefaultTimeout < c.MinTimeout || c.DefaultTimeout > c.MaxTimeout:
		return c, fmt.Errorf("config: DefaultTimeout %v must be within MinTimeout %v..MaxTimeout %v", c.DefaultTimeout, c.MinTimeout, c.MaxTimeout)
	case c.KillGrace < 0 || c.DrainGrace < 0 || c.Retention < 0 || c.HeartbeatInterval < 0:
		return c, errors.New("config: KillGrace, DrainGrace, Retention and HeartbeatInterval must not be negative")
	case c.RingBytes <= EventOverhead:
		return c, fmt.Errorf("config: RingBytes %d must be more than EventOverhead %d: an output event costs its data plus the overhead", c.RingBytes, EventOverhead)
	}
	return c, nil
}

func setDefault[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}

// Server is the AgentService. Create it with New; it serves once.
type Server struct {
	agentv1.UnimplementedAgentServiceServer

	cfg     Config
	log     *slog.Logger
	workDir string // cfg.WorkDir, or "/" when it could not be created
	// ident is the agent's secret and boot id: cfg.Secret and a random
	// one at start, a fork child's from its fork wake on (quiesce.go).
	ident   atomic.Pointer[identity]
	devNull *os.File // stdin of processes started without stdin
	sup     *supervisor
	// activity feeds Info's last_activity (activity.go).
	activity activity
	// oom counts the OOM kills of the agent's memory cgroup; oomScore is
	// the agent's own OOM score, the lowest it may set.
	oom      *oomCounter
	ooms     oomLedger // which exec took which OOM kill
	oomScore string
	// launcher starts the processes of execs that run as the workload
	// user (package launcher); userLaunchers those of other users, by
	// uid and gid (launcherFor). userLaunchers is guarded by starting.
	launcher      *launcher.Launcher
	userLaunchers map[[2]uint32]*launcher.Launcher
	// reaping says that launchers stay and reap what they start
	// (Config.ReapingLauncher, or the kernel ignored CLONE_PARENT);
	// reapingLaunchers are those launchers by uid and gid. Both are
	// guarded by starting (launch_reaping.go).
	reaping          bool
	reapingLaunchers map[[2]uint32]*launcher.ReapingLauncher
	// output is the budget of the output all execs retain
	// (Config.RetainedBytes).
	output *ring.Pool

	mu    sync.Mutex
	execs map[string]*execution
	// sessions are the shell sessions (session.go); a session whose shell
	// is starting has pid 0.
	sessions map[string]*session
	// watches are the file watches (watch.go).
	watches map[string]*fileWatch
	retired []*execution // finished execs, oldest first (retention.go)
	serving bool         // Serve was called
	closing bool         // Serve is stopping: starts are refused
	// stopping is closed when Serve stops; running execs then terminate
	// their process groups.
	stopping chan struct{}
	// quiesces carries a Quiesce's proofs to the serving loop
	// (quiesce.go); relistens is set while the loop can make its listener
	// again (ListenAndServe, not Serve).
	quiesces  chan quiesceProofs
	relistens atomic.Bool

	starting  sync.Mutex     // held by a start (launch) from its pipes to its fork
	launching sync.WaitGroup // one per start in flight (see startExec)
	execWG    sync.WaitGroup // one per running exec's supervising goroutine
	streamWG  sync.WaitGroup // one per Exec stream's receiving goroutine
}

var _ agentv1.AgentServiceServer = (*Server)(nil)

// New returns a Server for cfg. It creates cfg.WorkDir when missing (falling
// back to "/" when that fails) and opens /dev/null. It fails when cfg is
// inconsistent or /dev/null cannot be opened.
func New(cfg Config) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	id := make([]byte, 16)
	if _, err := rand.Read(id); err != nil {
		return nil, fmt.Errorf("boot id: %w", err)
	}
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, fmt.Errorf("open stdin for processes without stdin: %w", err)
	}
	s := &Server{
		cfg:      cfg,
		log:      cfg.Logger,
		workDir:  cfg.WorkDir,
		devNull:  devNull,
		sup:      newSupervisor(),
		oomScore: lowerOOMScore(cfg.Logger),
		execs:    make(map[string]*execution),
		sessions: make(map[string]*session),
		watches:  make(map[string]*fileWatch),
		stopping: make(chan struct{}),
		quiesces: make(chan quiesceProofs, 1),
	}
	s.ident.Store(&identity{secret: cfg.Secret, bootID: hex.EncodeToString(id)})
	if err := os.MkdirAll(cfg.WorkDir, 0o755); err != nil {
		s.log.Warn("working directory unavailable, using /", "workdir", cfg.WorkDir, "err", err)
		s.workDir = "/"
	}
	ownWorkDir(s.workDir, cfg.UID, cfg.GID, s.log)
	if cfg.NameHost {
		host, _ := os.Hostname()
		nameHost(s.log, "/etc/hosts", host)
	}
	selfCgroup, _ := os.ReadFile("/proc/self/cgroup")
	s.oom = findOOMCounter(cgroupRoot, selfCgroup)
	if s.cfg.RetainedBytes == 0 {
		s.cfg.RetainedBytes = defaultRetainedBytes(memoryLimit(s.oom.path))
	}
	s.output = ring.NewPool(s.cfg.RetainedBytes)
	s.launcher = launcher.New(launcher.Config{Credential: credential(cfg.UID, cfg.GID), Nofile: cfg.WorkloadNofile, Stderr: os.Stderr})
	s.userLaunchers = make(map[[2]uint32]*launcher.Launcher)
	s.reaping, s.reapingLaunchers = cfg.ReapingLauncher, make(map[[2]uint32]*launcher.ReapingLauncher)
	return s, nil
}

// Info reports the agent's boot id, version, build and pid, and for
// berthd's idle timeout the number of running execs and the last exec
// activity.
func (s *Server) Info(_ context.Context, req *agentv1.InfoRequest) (*agentv1.InfoResponse, error) {
	running, last := s.execActivity()
	id := s.ident.Load()
	resp := &agentv1.InfoResponse{BootId: id.bootID, Version: Version, Build: Build(), Pid: int64(os.Getpid()), RunningExecs: running,
		Proof: agentproof.Prove(id.secret, req.GetChallenge())}
	if !last.IsZero() {
		resp.LastActivity = timestamppb.New(last)
	}
	return resp, nil
}

// ListenAndServe serves on a unix socket at path until ctx ends, like
// Serve. A stale socket file at path is removed first; any other kind of
// file there is an error. The socket is made mode 0600: only berthd (root)
// dials it.
func (s *Server) ListenAndServe(ctx context.Context, path string) error {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return fmt.Errorf("listen %s: exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("remove stale socket: %w", err)
		}
	}
	l, err := listenUnix(path)
	if err != nil {
		return err
	}
	return s.serve(ctx, l, func() (net.Listener, error) { return listenUnix(path) })
}

// listenUnix listens on a unix socket at path, mode 0600.
func listenUnix(path string) (net.Listener, error) {
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("chmod socket: %w", err)
	}
	return l, nil
}

// Serve serves AgentService on l until ctx ends or l fails, and closes l.
// Before serving it makes the agent a child subreaper (prctl(2)
// PR_SET_CHILD_SUBREAPER) unless it is PID 1, so that orphaned descendants
// are re-parented to it, and starts reaping. When ctx ends it refuses new
// starts, sends SIGTERM to every running exec's process group, SIGKILL after
// Config.KillGrace, waits for the execs to finish and their streams to end,
// and returns nil. It returns an error when l fails or when called twice.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	return s.serve(ctx, l, nil)
}

// serve is Serve; relisten, when set, makes the listener again after a
// quiesce (Quiesce, package internal/quiesce).
func (s *Server) serve(ctx context.Context, l net.Listener, relisten func() (net.Listener, error)) error {
	s.mu.Lock()
	if s.serving {
		s.mu.Unlock()
		l.Close()
		return errors.New("agent: Serve called twice")
	}
	s.serving = true
	s.mu.Unlock()
	defer s.devNull.Close()
	defer s.closeLaunchers()

	if os.Getpid() != 1 {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			l.Close()
			return fmt.Errorf("prctl PR_SET_CHILD_SUBREAPER: %w", err)
		}
	}
	// SIGCHLD must be caught before the first process starts, or an early
	// exit would go unreaped until the next one.
	s.sup.notify()
	bgCtx, stopBackground := context.WithCancel(context.Background())
	var bg sync.WaitGroup
	bg.Add(2)
	go func() { defer bg.Done(); s.sup.run(bgCtx) }()
	go func() { defer bg.Done(); s.janitor(bgCtx) }()

	fileSvc := s.fileService(l.Addr())
	// Before the first upload: what a crashed agent left is not in use.
	fileSvc.RemoveStaleStaging()
	s.relistens.Store(relisten != nil)
	s.log.Info("berth-agent serving", "addr", l.Addr().String(), "version", Version, "pid", os.Getpid(), "boot_id", s.ident.Load().bootID,
		"oom_counter", s.oom.describe(), "oom_score_adj", s.oomScore, "retained_bytes", s.cfg.RetainedBytes)

	var serveErr error
	for {
		gs := s.grpcServer(fileSvc)
		served := make(chan error, 1)
		go func() { served <- gs.Serve(l) }()
		var proofs quiesceProofs // a Quiesce's
		select {
		case <-ctx.Done():
		case serveErr = <-served:
		case proofs = <-s.quiesces:
		}
		quiet := proofs.wake != nil
		if quiet {
			// Stop closes the listener (removing its socket file) and
			// every connection, and cuts the streams on them; the execs
			// run on, their output kept for a re-attach.
			gs.Stop()
			<-served
			if l, serveErr = s.quiet(ctx, proofs, l.Addr().String(), relisten); serveErr == nil && l != nil {
				continue
			}
		}
		s.stop(gs)
		if serveErr == nil && !quiet {
			serveErr = <-served
		}
		break
	}
	stopBackground()
	bg.Wait()
	if serveErr != nil && !errors.Is(serveErr, grpc.ErrServerStopped) {
		return fmt.Errorf("serve: %w", serveErr)
	}
	return nil
}

// stop ends every running exec and every stream, within bounds so that a
// process stuck in uninterruptible sleep cannot hold the agent forever.
func (s *Server) stop(gs *grpc.Server) {
	s.mu.Lock()
	s.closing = true
	close(s.stopping)
	s.mu.Unlock()
	// No reader waits for what the stopping execs still write.
	s.output.Release()
	// Starts in flight finish first: each may add a supervising goroutine.
	s.launching.Wait()

	// Each exec needs at most KillGrace to be killed, DrainGrace twice
	// (group gone, pipes drained) to finish; allow a second of slack.
	if !waitTimeout(&s.execWG, s.cfg.KillGrace+2*s.cfg.DrainGrace+time.Second) {
		s.log.Error("execs still running at shutdown; giving up on them")
	}
	// Followers send ExecExited and return; give them a moment, then cut.
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(time.Second):
		gs.Stop()
		<-stopped
	}
	if !waitTimeout(&s.streamWG, time.Second) {
		s.log.Error("exec streams still receiving at shutdown")
	}
}

// waitTimeout waits for wg for at most d and reports whether it finished.
// On timeout the waiting goroutine outlives the call until wg finishes;
// this is only used at shutdown.
func waitTimeout(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// errUnavailable is returned for starts while the agent is not serving.
func errUnavailable() error {
	return rpcstatus.Error(codes.Unavailable, rpcstatus.ReasonUnreachable, "berth-agent is shutting down; no new exec starts", nil)
}
