package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/memrelease"
	"github.com/berth-sandbox/berth/server"
	"github.com/berth-sandbox/berth/server/auth"
	"github.com/berth-sandbox/berth/server/connlimit"
	"github.com/berth-sandbox/berth/server/wsgate"
)

// transportFlags are the bounds of what a caller can make berthd hold
// before it is authenticated (issue 21): header size, streams, handshake
// and idle time, connections in all and per peer.
type transportFlags struct {
	cfg         server.TransportConfig
	headerBytes uint
	streams     uint
	maxConns    int
	maxPerPeer  int
	memory      memrelease.Config
	// console serves the web console; origins are the WebSocket
	// endpoints' allowed browser origins beside the same origin.
	console bool
	origins []string
}

// Defaults of --max-connections and --max-connections-per-peer. A held
// connection costs berthd about 56 KiB (measured by TestHalfOpenConnections:
// 3,800 half-open connections, half of them TLS, took its RSS from 32 to
// 239 MiB) and a descriptor, so 2048 is some 110 MiB and 2048 descriptors
// of a soft RLIMIT_NOFILE that should be 8192 or more; 256 for one peer is
// far more than a gRPC client, which multiplexes its calls on one
// connection, opens, and takes 8 peers to reach the total.
const (
	defaultMaxConnections        = 2048
	defaultMaxConnectionsPerPeer = 256
)

func (f *transportFlags) register() {
	flag.UintVar(&f.headerBytes, "max-header-list-bytes", server.DefaultMaxHeaderListBytes, "largest header list (gRPC metadata, uncompressed) of a request, in `bytes`; larger requests are refused before they are read whole or authenticated")
	flag.UintVar(&f.streams, "max-concurrent-streams", server.DefaultMaxConcurrentStreams, "most calls one connection has open at once; a gRPC client queues calls past it")
	flag.DurationVar(&f.cfg.HandshakeTimeout, "handshake-timeout", server.DefaultHandshakeTimeout, "longest a new connection may take for its TLS handshake and HTTP/2 preface")
	flag.DurationVar(&f.cfg.MaxConnectionIdle, "max-connection-idle", server.DefaultMaxConnectionIdle, "a connection with no call open this long (one that sent half a request too) gets a GOAWAY and is closed 5 s later; clients reconnect when they next call")
	flag.IntVar(&f.cfg.MaxRawStreamsPerPrincipal, "max-raw-streams-per-principal", server.DefaultMaxRawStreams, "most raw HTTP file streams (GET and PUT of /v1/sandboxes/{id}/files/content and /files/archive) one principal has open at once; one more is refused with RESOURCE_EXHAUSTED FLEET_BUSY (PRINCIPAL_RAW_STREAMS)")
	flag.DurationVar(&f.cfg.StreamStall, "http-stream-stall", server.DefaultStreamStall, "longest an HTTP stream berthd serves itself (raw file bodies, JSON lines, WebSockets) waits on its client to take the next 32 KiB of its answer or to send the next bytes of its body; past it the call ends and the connection is closed")
	flag.IntVar(&f.maxConns, "max-connections", defaultMaxConnections, "most connections open at once over all --listen addresses; past it new connections wait in the kernel's backlog; 0: no cap")
	flag.Uint64Var(&f.memory.Above, "memory-release-above-bytes", memrelease.DefaultAbove, "resident memory (RSS) in `bytes` above which berthd returns its free memory to the kernel within seconds of a spike's end (connections and calls ending); 0: leave it to the Go runtime, which can keep a spike's memory for minutes")
	flag.BoolVar(&f.console, "console", false, "serve the web console at /console/ on every listener (docs/console.md); it logs in with a bearer token")
	flag.Func("ws-allowed-origin", "host `pattern` (path.Match, e.g. *.example.com) of a browser origin allowed to open the WebSocket terminal and port forward besides the same origin (repeatable; docs/http.md)", func(v string) error {
		f.origins = append(f.origins, v)
		return nil
	})
	flag.IntVar(&f.maxPerPeer, "max-connections-per-peer", defaultMaxConnectionsPerPeer, "most connections one peer (TCP: an IP address, an IPv6 /64; unix socket: a uid) has open at once; past it a new one is closed at once; 0: no cap")
}

// check rejects values with no meaning and fills cfg.
func (f *transportFlags) check() error {
	if f.headerBytes < 1024 || f.headerBytes > 16<<20 {
		return fmt.Errorf("--max-header-list-bytes %d: must be from 1024 to 16777216", f.headerBytes)
	}
	if f.streams == 0 || f.streams > 1<<20 {
		return fmt.Errorf("--max-concurrent-streams %d: must be from 1 to 1048576", f.streams)
	}
	for name, d := range map[string]time.Duration{"--handshake-timeout": f.cfg.HandshakeTimeout, "--max-connection-idle": f.cfg.MaxConnectionIdle, "--http-stream-stall": f.cfg.StreamStall} {
		if d <= 0 {
			return fmt.Errorf("%s %v: must be positive", name, d)
		}
	}
	for name, n := range map[string]int{"--max-connections": f.maxConns, "--max-connections-per-peer": f.maxPerPeer} {
		if n < 0 {
			return fmt.Errorf("%s %d: must be 0 (no cap) or more", name, n)
		}
	}
	if f.cfg.MaxRawStreamsPerPrincipal < 1 {
		return fmt.Errorf("--max-raw-streams-per-principal %d: must be 1 or more", f.cfg.MaxRawStreamsPerPrincipal)
	}
	f.cfg.MaxHeaderListBytes, f.cfg.MaxConcurrentStreams = uint32(f.headerBytes), uint32(f.streams)
	return nil
}

// releaseMemory returns the memory of spikes to the kernel
// (internal/memrelease) until ctx ends, unless
// --memory-release-above-bytes is 0; stop waits for it.
func (f *transportFlags) releaseMemory(ctx context.Context, log *slog.Logger) (stop func()) {
	if f.memory.Above == 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		memrelease.Run(ctx, f.memory, log)
	}()
	return func() { cancel(); <-done }
}

// filesHeadroom is the descriptors berthd keeps for other than callers'
// connections: containerd, sandboxes' agents and logs, files in transit.
const filesHeadroom = 1024

// checkFiles warns when RLIMIT_NOFILE (whose soft limit the Go runtime
// raised to the hard one at start) cannot hold --max-connections and
// filesHeadroom: past it accept fails with EMFILE, for callers and
// sandboxes alike.
func (f *transportFlags) checkFiles(log *slog.Logger, listens int) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		log.Warn("cannot read RLIMIT_NOFILE", slog.Any("error", err))
		return
	}
	switch {
	case f.maxConns == 0:
		log.Warn("--max-connections 0: callers' connections are not capped and can exhaust berthd's descriptors", slog.Uint64("rlimit_nofile", rl.Cur))
	case uint64(f.maxConns)+filesHeadroom > rl.Cur:
		log.Warn("RLIMIT_NOFILE is too low for --max-connections: callers can exhaust berthd's descriptors; raise LimitNOFILE or lower --max-connections",
			slog.Uint64("rlimit_nofile", rl.Cur), slog.Int("max_connections", f.maxConns), slog.Int("headroom", filesHeadroom))
	}
}

// listenOptions returns the options of every listener: the socket flags
// and one connection limiter shared by all, which logs refused
// connections at most every 10 s.
func (f *transportFlags) listenOptions(log *slog.Logger, socket socketFlags) []server.ListenOption {
	var (
		mu      sync.Mutex
		last    time.Time
		refused int
	)
	lim := connlimit.New(connlimit.Limits{Total: f.maxConns, PerPeer: f.maxPerPeer, OnRefuse: func(peer string) {
		mu.Lock()
		defer mu.Unlock()
		refused++
		if time.Since(last) < 10*time.Second {
			return
		}
		log.Warn("connections refused past --max-connections-per-peer", slog.String("peer", peer), slog.Int("refused", refused), slog.Int("max_connections_per_peer", f.maxPerPeer))
		last, refused = time.Now(), 0
	}})
	return append(socket.options(), server.WithConnectionLimits(lim))
}

// serveConfig says how each listener is served (server.Serve).
type serveConfig struct {
	cfg server.ServeConfig
	// tls: TCP listeners serve TLS; berthd makes the handshake before it
	// sorts their connections.
	tls *tls.Config
}

// serveConfig returns the listeners' serveConfig: the HTTP protocols
// (Connect, gRPC-Web, gRPC over HTTP/1.1) beside gRPC, with the
// transport's bounds, on every listener.
func (f *transportFlags) serveConfig(authn *auth.Authenticator, log *slog.Logger) serveConfig {
	return serveConfig{cfg: server.ServeConfig{HTTP: true, Transport: f.cfg, Log: log, Console: f.console,
		WebSocket: wsgate.Config{AllowedOrigins: f.origins, HelloTimeout: f.cfg.HandshakeTimeout, WriteStall: f.cfg.StreamStall, Log: log}}, tls: authn.HTTPTLSConfig()}
}

// forListen is the server.ServeConfig of the listener on addr.
func (c serveConfig) forListen(addr string) server.ServeConfig {
	cfg := c.cfg
	if _, unix := server.UnixPath(addr); !unix {
		cfg.TLS = c.tls
	}
	return cfg
}
