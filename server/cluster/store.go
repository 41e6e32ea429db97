package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
)

// StoreConfig says how to reach the fleet's etcd.
type StoreConfig struct {
	// Endpoints are etcd's client URLs, e.g. "https://etcd-0:2379".
	Endpoints []string
	// TLS, when set, is used for https endpoints: the CA that signed
	// etcd's certificate and this node's client certificate.
	TLS *tls.Config
	// Credentials, when set with TLS, are the transport credentials the
	// client dials with instead of TLS's own: ones that change what later
	// handshakes use (berthd re-reads its etcd TLS files at SIGHUP), for
	// reconnections too.
	Credentials credentials.TransportCredentials
	// Username and Password authenticate to an etcd with auth enabled.
	Username, Password string
	// DialTimeout bounds how long Connect waits for etcd to answer before
	// it returns a client that waits for it. Default 10 s.
	DialTimeout time.Duration
}

// Connect returns an etcd client for cfg. When etcd does not answer a
// status call within DialTimeout it logs so and returns the client all the
// same: a berthd starts without its fleet's etcd (a node serves the
// sandboxes it holds, routed calls fail CLUSTER_UNAVAILABLE), and the
// client connects when etcd answers.
func Connect(ctx context.Context, cfg StoreConfig, log *slog.Logger) (*clientv3.Client, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("cluster: no etcd endpoint")
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	// Reconnect within a second of etcd answering again, not after
	// gRPC's backoff of up to 2 minutes: the node's lease, its
	// registration and routing depend on it.
	dialOpts := []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
		MinConnectTimeout: 5 * time.Second,
	})}
	if cfg.TLS != nil && cfg.Credentials != nil {
		// clientv3 appends Config.DialOptions after its own transport
		// credentials (from Config.TLS): these take their place.
		dialOpts = append(dialOpts, grpc.WithTransportCredentials(cfg.Credentials))
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: cfg.Endpoints, TLS: cfg.TLS, Username: cfg.Username, Password: cfg.Password,
		DialTimeout: cfg.DialTimeout, Context: context.Background(),
		DialKeepAliveTime: 10 * time.Second, DialKeepAliveTimeout: 5 * time.Second,
		DialOptions: dialOpts,
		Logger:      zap.New(slogCore{log: log, level: zapcore.WarnLevel}),
	})
	if err != nil {
		return nil, fmt.Errorf("cluster: etcd client for %v: %w", cfg.Endpoints, err)
	}
	sctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	if _, err := cli.Status(sctx, cfg.Endpoints[0]); err != nil {
		log.Warn("cluster: etcd does not answer; waiting for it", slog.Any("endpoints", cfg.Endpoints), slog.Duration("waited", cfg.DialTimeout), slog.Any("error", err))
	}
	return cli, nil
}

// Embedded is a single-member etcd running inside berthd: the fleet's
// store when it has one host, or for trying a fleet out. Its data lives in
// a directory, so it survives restarts; it has no authentication, so its
// client URL should stay on loopback unless the network is trusted (an
// external etcd with TLS client certificates is the production setup).
type Embedded struct {
	etcd    *embed.Etcd
	closing atomic.Bool
}

// EmbedConfig configures an Embedded etcd.
type EmbedConfig struct {
	// Dir holds its data.
	Dir string
	// ClientURL is where clients reach it. Default http://127.0.0.1:2379.
	ClientURL string
	// PeerURL is where members would reach it (a single member uses it for
	// itself only). Default http://127.0.0.1:2380.
	PeerURL string
	// Name names the member. Default "berth".
	Name string
}

// StartEmbedded starts an embedded etcd and returns once it serves.
func StartEmbedded(ctx context.Context, cfg EmbedConfig, log *slog.Logger) (*Embedded, error) {
	if cfg.ClientURL == "" {
		cfg.ClientURL = "http://127.0.0.1:2379"
	}
	if cfg.PeerURL == "" {
		cfg.PeerURL = "http://127.0.0.1:2380"
	}
	if cfg.Name == "" {
		cfg.Name = "berth"
	}
	cu, err := url.Parse(cfg.ClientURL)
	if err != nil {
		return nil, fmt.Errorf("cluster: embedded etcd client URL %q: %w", cfg.ClientURL, err)
	}
	pu, err := url.Parse(cfg.PeerURL)
	if err != nil {
		return nil, fmt.Errorf("cluster: embedded etcd peer URL %q: %w", cfg.PeerURL, err)
	}
	e := &Embedded{}
	ec := embed.NewConfig()
	ec.Name, ec.Dir = cfg.Name, cfg.Dir
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	ec.InitialCluster = ec.InitialClusterFromName(cfg.Name)
	// etcd logs through berthd's logger: its info lines at debug, and the
	// errors its listeners log while Close shuts them at debug too.
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.New(slogCore{log: log, level: zapcore.WarnLevel, closing: &e.closing}))
	etcd, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("cluster: start embedded etcd in %s: %w", cfg.Dir, err)
	}
	select {
	case <-etcd.Server.ReadyNotify():
	case err := <-etcd.Err():
		etcd.Close()
		return nil, fmt.Errorf("cluster: embedded etcd: %w", err)
	case <-ctx.Done():
		etcd.Close()
		return nil, fmt.Errorf("cluster: embedded etcd not ready: %w", ctx.Err())
	}
	e.etcd = etcd
	return e, nil
}

// Endpoints returns the client URLs at which it serves.
func (e *Embedded) Endpoints() []string {
	var out []string
	for _, u := range e.etcd.Config().AdvertiseClientUrls {
		out = append(out, u.String())
	}
	return out
}

// Close stops it.
func (e *Embedded) Close() {
	e.closing.Store(true)
	e.etcd.Close()
}

// slogCore is a zapcore.Core that writes to a slog.Logger: entries at level
// or above at their own level, the rest at debug; while closing is set,
// errors too (a clean shutdown logs them).
type slogCore struct {
	log     *slog.Logger
	level   zapcore.Level
	closing *atomic.Bool
	fields  []zapcore.Field
}

func (c slogCore) Enabled(zapcore.Level) bool { return true }

func (c slogCore) With(fields []zapcore.Field) zapcore.Core {
	c.fields = append(append([]zapcore.Field(nil), c.fields...), fields...)
	return c
}

func (c slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	return ce.AddCore(e, c)
}

func (c slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	lvl := slog.LevelDebug
	if e.Level >= c.level && (c.closing == nil || !c.closing.Load()) {
		switch {
		case e.Level >= zapcore.ErrorLevel:
			lvl = slog.LevelError
		case e.Level >= zapcore.WarnLevel:
			lvl = slog.LevelWarn
		default:
			lvl = slog.LevelInfo
		}
	}
	if !c.log.Enabled(context.Background(), lvl) {
		return nil
	}
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range append(c.fields, fields...) {
		f.AddTo(enc)
	}
	attrs := []any{slog.String("component", "etcd")}
	for k, v := range enc.Fields {
		attrs = append(attrs, slog.Any(k, v))
	}
	c.log.Log(context.Background(), lvl, e.Message, attrs...)
	return nil
}

func (c slogCore) Sync() error { return nil }
