package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/credentials"
)

// clientTLS is the client side of TLS to the fleet's other nodes or to
// etcd, from files that Reload re-reads (berthd: at SIGHUP): gRPC
// transport credentials whose every handshake — new connections and
// reconnections — uses the files as last loaded, with grpc-go's own TLS
// verification. Connections made keep their session.
type clientTLS struct {
	caFile, certFile, keyFile, serverName string
	cfg                                   atomic.Pointer[tls.Config]
	creds                                 atomic.Pointer[credentials.TransportCredentials]
}

// newClientTLS loads a client TLS configuration (see tlsConfig); nil when
// all of caFile, certFile and serverName are empty.
func newClientTLS(caFile, certFile, keyFile, serverName string) (*clientTLS, error) {
	if caFile == "" && certFile == "" && serverName == "" {
		return nil, nil
	}
	c := &clientTLS{caFile: caFile, certFile: certFile, keyFile: keyFile, serverName: serverName}
	if err := c.Reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// Reload re-reads the CA bundle and the certificate and key; on an error
// it keeps what it had.
func (c *clientTLS) Reload() error {
	cfg, err := tlsConfig(c.caFile, c.certFile, c.keyFile, c.serverName)
	if err != nil {
		return err
	}
	creds := credentials.NewTLS(cfg)
	c.cfg.Store(cfg)
	c.creds.Store(&creds)
	return nil
}

// Config returns the TLS configuration as last loaded.
func (c *clientTLS) Config() *tls.Config { return c.cfg.Load() }

func (c *clientTLS) current() credentials.TransportCredentials { return *c.creds.Load() }

// ClientHandshake implements credentials.TransportCredentials with the
// credentials as last loaded.
func (c *clientTLS) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c.current().ClientHandshake(ctx, authority, conn)
}

// ServerHandshake implements credentials.TransportCredentials: clientTLS
// is for clients only.
func (c *clientTLS) ServerHandshake(net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("berthd's client TLS credentials are for dialing only")
}

// Info implements credentials.TransportCredentials.
func (c *clientTLS) Info() credentials.ProtocolInfo { return c.current().Info() }

// Clone returns c itself: its clones follow its reloads.
func (c *clientTLS) Clone() credentials.TransportCredentials { return c }

// OverrideServerName is deprecated in grpc-go; the server name is a flag.
func (c *clientTLS) OverrideServerName(string) error { return nil }

// fileToken is a bearer token read from a file (its content, surrounding
// white space trimmed), re-read by Reload.
type fileToken struct {
	path  string
	token atomic.Pointer[string]
}

func newFileToken(path string) (*fileToken, error) {
	t := &fileToken{path: path}
	if err := t.Reload(); err != nil {
		return nil, err
	}
	return t, nil
}

// Reload re-reads the file; on an error, or an empty file, it keeps the
// token it had.
func (t *fileToken) Reload() error {
	b, err := os.ReadFile(t.path)
	if err != nil {
		return fmt.Errorf("token file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return fmt.Errorf("token file %s is empty", t.path)
	}
	t.token.Store(&tok)
	return nil
}

// Token returns the token as last read.
func (t *fileToken) Token() string { return *t.token.Load() }

// reloader re-reads one set of files at SIGHUP.
type reloader struct {
	what   string // for the log: "tokens and TLS", "peer TLS", ...
	reload func() error
}

// reloads are what SIGHUP re-reads; safe for concurrent use.
type reloads struct {
	mu   sync.Mutex
	list []reloader
}

func (r *reloads) add(rs ...reloader) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.list = append(r.list, rs...)
}

// run re-reads each; one that fails keeps what it had loaded, and is
// logged.
func (r *reloads) run(log *slog.Logger) {
	r.mu.Lock()
	list := slices.Clone(r.list)
	r.mu.Unlock()
	for _, rl := range list {
		if err := rl.reload(); err != nil {
			log.Error("reload on SIGHUP failed; keeping what was loaded before", slog.String("what", rl.what), slog.Any("error", err))
			continue
		}
		log.Info("reloaded on SIGHUP", slog.String("what", rl.what))
	}
}
