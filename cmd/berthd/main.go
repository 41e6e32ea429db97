// Command berthd is the berth control service: it serves the berth.v1 gRPC
// API and runs sandboxes in containerd. See README.md for its flags.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/berth-sandbox/berth/server"
	"github.com/berth-sandbox/berth/server/runtime"
)

func main() {
	var (
		rtCfg      runtime.Config
		svcCfg     server.Config
		listen     string
		logLevel   slog.Level
		version    bool
		readyLimit time.Duration
	)
	flag.StringVar(&rtCfg.Address, "containerd-address", "/run/containerd/containerd.sock", "containerd socket path")
	flag.StringVar(&rtCfg.Namespace, "namespace", "berth", "containerd namespace for berth's containers and images")
	flag.StringVar(&rtCfg.StateDir, "state-dir", "/run/berth", "host directory for per-sandbox agent sockets and logs (keep it short: socket paths max 107 bytes)")
	flag.StringVar(&rtCfg.AgentBinary, "agent-binary", "/usr/local/lib/berth/berth-agent", "host path of the static berth-agent binary")
	flag.StringVar(&listen, "listen", "unix:///run/berth/berthd.sock", "gRPC listen address: unix:///path or host:port")
	flag.Uint64Var(&svcCfg.DefaultPidsLimit, "default-pids-limit", 1024, "pids limit of a sandbox whose request sets none")
	flag.Uint64Var(&svcCfg.MaxPidsLimit, "max-pids-limit", 32768, "largest pids limit a request may set")
	flag.DurationVar(&readyLimit, "agent-ready-timeout", 30*time.Second, "how long CreateSandbox waits for the agent to answer")
	flag.DurationVar(&rtCfg.ExecHeartbeat, "exec-heartbeat-interval", 15*time.Second, "silence on an exec stream before the agent sends a heartbeat (given to new sandboxes' agents)")
	flag.DurationVar(&rtCfg.ExecRetention, "exec-retention", 10*time.Minute, "how long a finished exec stays attachable and listed (given to new sandboxes' agents)")
	flag.Uint64Var(&rtCfg.ExecRingBytes, "exec-ring-bytes", 8<<20, "output events retained per exec for re-attaching, in `bytes` (given to new sandboxes' agents)")
	flag.TextVar(&logLevel, "log-level", slog.LevelInfo, "log level: DEBUG, INFO, WARN or ERROR")
	flag.BoolVar(&version, "version", false, "print the version and exit")
	flag.Parse()
	if version {
		fmt.Println(server.Version)
		return
	}
	svcCfg.AgentReadyTimeout = readyLimit
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel}))
	if err := run(log, rtCfg, svcCfg, listen); err != nil {
		log.Error("berthd failed", slog.Any("error", err))
		os.Exit(1)
	}
}

// run serves until SIGTERM or SIGINT, then stops gracefully. Sandboxes keep
// running.
func run(log *slog.Logger, rtCfg runtime.Config, svcCfg server.Config, listen string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	connectCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	rt, err := runtime.New(connectCtx, rtCfg)
	cancel()
	if err != nil {
		return err
	}
	defer rt.Close()
	svc := server.New(svcCfg, rt, log)
	defer svc.Close()
	lis, err := server.Listen(listen)
	if err != nil {
		return err
	}
	srv := server.NewGRPCServer(svc, log)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	log.Info("berthd serving", slog.String("listen", listen), slog.String("containerd", rtCfg.Address), slog.String("namespace", rt.Namespace()), slog.String("version", server.Version))
	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("berthd stopping")
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		srv.Stop() // exec streams can be long; sandboxes and execs live on
	}
	// Serve returns nil once stopped.
	return <-served
}
