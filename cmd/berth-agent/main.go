// Command berth-agent is the PID 1 of every berth sandbox: it serves
// berth.agent.v1.AgentService on a unix socket and supervises the processes
// berthd asks it to run. See package agent.
//
// Usage:
//
//	berth-agent [--socket PATH] [flags]
//	berth-agent --version
//	berth-agent switch-root
//
// switch-root is not the agent: berthd runs it as host root in a standby
// sandbox's mount namespace (nsenter --mount), ahead of the fork; once
// berthd writes the go byte on its stdin it moves that namespace onto its
// real root (switchroot.Switch; the namespace's mount table on descriptor
// 3) and exits; when stdin ends without it, it exits switching nothing.
//
// It stops on SIGTERM or SIGINT: running execs get SIGTERM, SIGKILL after
// --kill-grace, and the agent exits 0.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/agent"
	"github.com/berth-sandbox/berth/agent/logbatch"
	"github.com/berth-sandbox/berth/internal/agentproof"
	"github.com/berth-sandbox/berth/internal/switchroot"
	"github.com/berth-sandbox/berth/internal/telemetry"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is main with its arguments and outputs; it returns the exit code: 0
// after a clean stop, 2 for bad flags, 1 for any other failure.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 1 && args[0] == "switch-root" {
		// Started ahead; it switches once berthd writes the go byte on
		// stdin, and leaves the namespace as it is when stdin ends.
		var b [1]byte
		if n, _ := os.Stdin.Read(b[:]); n != 1 || b[0] != switchroot.Go {
			fmt.Fprintln(stderr, "berth-agent switch-root: no go from berthd; nothing switched")
			return 1
		}
		if err := switchroot.Switch(os.NewFile(switchroot.MountInfoFD, "mountinfo")); err != nil {
			fmt.Fprintf(stderr, "berth-agent switch-root: %v\n", err)
			return 1
		}
		return 0
	}
	d := agent.DefaultConfig()
	cfg := d
	fs := flag.NewFlagSet("berth-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", "/.berth-run/agent.sock", "`path` of the unix socket to serve on (a stale socket there is replaced)")
	version := fs.Bool("version", false, "print the version and exit")
	trace := fs.Bool("trace", false, "trace the agent's calls (W3C traceparent from berthd) and hand the spans to berthd on the Telemetry stream")
	standby := fs.String("standby-wait", "", "`path` of a FIFO to wait on before anything else: a standby sandbox's agent starts on a placeholder root and goes on once berthd writes its go there, after moving the root (switchroot)")
	secretFile := fs.String("secret-file", "", "`path` of berthd's per-sandbox secret, which Info proves; read and removed at start")
	fs.StringVar(&cfg.WorkDir, "workdir", d.WorkDir, "working `directory` for execs without a cwd (created when missing; / when it cannot be)")
	fs.Func("user", "workload `uid:gid` (numeric) that processes run as and files are created as (default 0:0)", func(v string) error {
		uid, gid, err := parseUser(v)
		cfg.UID, cfg.GID = uid, gid
		return err
	})
	fs.DurationVar(&cfg.DefaultTimeout, "default-timeout", d.DefaultTimeout, "exec timeout when a start asks for none")
	fs.DurationVar(&cfg.MinTimeout, "min-timeout", d.MinTimeout, "smallest exec timeout; smaller requests are refused")
	fs.DurationVar(&cfg.MaxTimeout, "max-timeout", d.MaxTimeout, "largest exec timeout; larger requests are refused")
	fs.DurationVar(&cfg.KillGrace, "kill-grace", d.KillGrace, "time between SIGTERM and SIGKILL to an exec's process group on timeout or stop")
	fs.DurationVar(&cfg.DrainGrace, "drain-grace", d.DrainGrace, "how long output pipes may stay open after an exec's process exited")
	fs.Uint64Var(&cfg.RingBytes, "ring-bytes", d.RingBytes, fmt.Sprintf("retained event log per exec in `bytes` (each event costs its data + %d); an attached reader this far behind makes the exec's output wait", agent.EventOverhead))
	fs.Uint64Var(&cfg.RetainedBytes, "retained-bytes", 0, "output all execs retain together, in `bytes` (default: an eighth of the sandbox's memory limit, 4 MiB to 256 MiB)")
	fs.Uint64Var(&cfg.WorkloadNofile, "workload-nofile", d.WorkloadNofile, "soft RLIMIT_NOFILE of the processes the agent starts (at most the hard limit)")
	fs.BoolVar(&cfg.ReapingLauncher, "reaping-launcher", false, "launchers stay and reap the processes they start, reporting each exit to the agent (the default once the kernel ignores CLONE_PARENT, as gVisor's does)")
	fs.DurationVar(&cfg.Retention, "retention", d.Retention, "how long a finished exec stays attachable")
	fs.IntVar(&cfg.MaxRetained, "max-retained", d.MaxRetained, "most finished execs kept attachable; beyond it the oldest are forgotten at once")
	fs.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", d.HeartbeatInterval, "silence on an exec stream before a heartbeat is sent")
	fs.BoolVar(&cfg.LoginEnv, "login-env", false, "give processes the workload user's HOME, USER, LOGNAME and SHELL from /etc/passwd, and PATH when unset (berthd sets it)")
	fs.BoolVar(&cfg.KeepHome, "keep-home", false, "with --login-env: the environment's HOME was set by the image or the sandbox and is kept")
	fs.BoolVar(&cfg.NameHost, "name-host", false, "make /etc/hosts resolve the hostname at start (berthd sets it; never on a host)")
	registerFileFlags(fs, &cfg.Files)
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "berth-agent: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *version {
		fmt.Fprintln(stdout, agent.Version)
		return 0
	}

	if *standby != "" {
		// Nothing of the root is touched before: it is a placeholder
		// until berthd switched it.
		if err := switchroot.Wait(*standby); err != nil {
			fmt.Fprintf(stderr, "berth-agent: %v\n", err)
			return 1
		}
	}

	// The lines execs log wait in logs for up to logbatch.Delay; every
	// other line is written at once, with them.
	logs := logbatch.New(stderr)
	defer logs.Flush()
	text := slog.NewTextHandler(logs, nil)
	log := slog.New(logs.Handler(text, false))
	cfg.Logger, cfg.ExecLogger = log, slog.New(logs.Handler(text, true))
	if *secretFile != "" {
		// Read and removed before anything runs: no process of the
		// workload ever sees it.
		secret, err := agentproof.ReadSecretFile(*secretFile)
		if err != nil {
			log.Error("berthd's secret is unusable: berthd will refuse this agent", "err", err)
		}
		cfg.Secret = secret
	}
	// Before any process starts: children must never hold a capability.
	if err := agent.LockCapabilities(); err != nil {
		log.Warn("capabilities not locked; processes keep what the agent has", "err", err)
	}
	if lim, err := agent.RaiseNofile(); err != nil {
		log.Warn("descriptor limit not raised", "err", err)
	} else {
		log.Info("descriptor limit", "nofile", lim.Cur, "workload_nofile", min(cfg.WorkloadNofile, lim.Max))
	}
	// One P in a sandbox capped at one CPU (issue 23: fewer wake-ups an
	// exec); Go's default otherwise.
	log.Info("processors", "gomaxprocs", agent.FitProcs())
	// Threads made now survive a fork bomb that exhausts the pids limit.
	// They are made beside agent.New (each new thread waits to be
	// scheduled once) and all exist before the socket is served: no
	// process of the workload can run before then.
	reserved := make(chan struct{})
	go func() { agent.ReserveThreads(reservedThreads); close(reserved) }()
	if *trace {
		// At most 4 MiB of spans wait for berthd; older ones go first.
		at, err := telemetry.StartAgent(context.Background(), agent.Version, 4<<20)
		if err != nil {
			log.Error("tracing", "err", err)
			return 1
		}
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			at.Shutdown(ctx)
		}()
		cfg.Spans, cfg.ServerOptions = at.Queue, at.ServerOptions()
	}
	srv, err := agent.New(cfg)
	if err != nil {
		log.Error("start", "err", err)
		return 1
	}
	<-reserved
	// As PID 1 the agent gets no default action for these: stop explicitly.
	ctx, stop := signal.NotifyContext(context.Background(), unix.SIGTERM, unix.SIGINT)
	defer stop()
	if err := srv.ListenAndServe(ctx, *socket); err != nil {
		log.Error("serve", "err", err)
		return 1
	}
	log.Info("berth-agent stopped")
	return 0
}

// reservedThreads is how many OS threads the agent makes at start for
// later (agent.ReserveThreads); berthd's runtime.AgentPidsReserve covers
// them and the runtime's own.
const reservedThreads = 16

// parseUser parses "uid:gid" or "uid" (gid = uid), both numeric.
func parseUser(v string) (uid, gid uint32, err error) {
	u, g, hasGID := strings.Cut(v, ":")
	if !hasGID {
		g = u
	}
	uid64, err := strconv.ParseUint(u, 10, 32)
	if err != nil {
		return 0, 0, fmt.Errorf("uid %q is not a number from 0 to 4294967295", u)
	}
	gid64, err := strconv.ParseUint(g, 10, 32)
	if err != nil {
		return 0, 0, fmt.Errorf("gid %q is not a number from 0 to 4294967295", g)
	}
	return uint32(uid64), uint32(gid64), nil
}
