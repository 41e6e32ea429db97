package main

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/testcerts"
)

// TestClientTLSReload checks that the client TLS of the fleet (to other
// nodes, to etcd) follows its files at Reload (issue 22: peer and etcd
// certificates were read once): a new handshake presents the new client
// certificate and trusts the new CA; a file that does not load keeps what
// was loaded.
func TestClientTLSReload(t *testing.T) {
	dir := t.TempDir()
	caA, err := testcerts.NewCA("ca-a")
	if err != nil {
		t.Fatal(err)
	}
	caB, err := testcerts.NewCA("ca-b")
	if err != nil {
		t.Fatal(err)
	}
	serverCert := func(ca *testcerts.CA) *tls.Certificate {
		certPEM, keyPEM, err := ca.Server()
		if err != nil {
			t.Fatal(err)
		}
		c, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		return &c
	}
	write := func(ca *testcerts.CA, cn string) {
		certPEM, keyPEM, err := ca.Client(cn)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := testcerts.Write(dir, "client", certPEM, keyPEM); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "ca.crt"), ca.PEM, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// A TLS server presenting current's certificate and reporting the
	// common name of each client certificate it gets.
	var current atomic.Pointer[tls.Certificate]
	current.Store(serverCert(caA))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	seen := make(chan string, 10)
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			srv := tls.Server(conn, &tls.Config{ClientAuth: tls.RequireAnyClientCert, NextProtos: []string{"h2"},
				GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return current.Load(), nil }})
			if srv.Handshake() == nil {
				seen <- srv.ConnectionState().PeerCertificates[0].Subject.CommonName
			}
			conn.Close()
		}
	}()
	var creds *clientTLS
	handshake := func() (string, error) {
		conn, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, _, err := creds.ClientHandshake(ctx, l.Addr().String(), conn); err != nil {
			return "", err
		}
		select {
		case cn := <-seen:
			return cn, nil
		case <-ctx.Done():
			t.Fatal("the server saw no handshake")
			return "", nil
		}
	}

	write(caA, "node-old")
	creds, err = newClientTLS(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key"), "")
	if err != nil {
		t.Fatal(err)
	}
	if cn, err := handshake(); err != nil || cn != "node-old" {
		t.Fatalf("first handshake = %q, %v; want node-old's certificate", cn, err)
	}
	// New files, and a server certificate of the new CA: refused until
	// the files are reloaded, then the new certificate is sent.
	write(caB, "node-new")
	current.Store(serverCert(caB))
	if _, err := handshake(); err == nil {
		t.Fatal("handshake with a server of the new CA before Reload succeeded, want it refused (the old CA)")
	}
	if err := creds.Reload(); err != nil {
		t.Fatal(err)
	}
	if cn, err := handshake(); err != nil || cn != "node-new" {
		t.Errorf("handshake after Reload = %q, %v; want node-new's certificate, the new CA trusted", cn, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), []byte("not PEM"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := creds.Reload(); err == nil {
		t.Error("Reload of a CA file without PEM succeeded, want an error")
	}
	if cn, err := handshake(); err != nil || cn != "node-new" {
		t.Errorf("handshake after a failed Reload = %q, %v; want what was loaded before", cn, err)
	}
}

// TestPeerTokenReload checks that the peer token file is re-read at
// Reload, and that an unreadable or empty file keeps the token.
func TestPeerTokenReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte("old-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tok, err := newFileToken(path)
	if err != nil || tok.Token() != "old-token" {
		t.Fatalf("newFileToken = %v, %v; want old-token", tok, err)
	}
	if err := os.WriteFile(path, []byte(" new-token \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := tok.Reload(); err != nil || tok.Token() != "new-token" {
		t.Errorf("after Reload: %q, %v; want new-token", tok.Token(), err)
	}
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := tok.Reload(); err == nil || tok.Token() != "new-token" {
		t.Errorf("Reload of an empty file: %q, %v; want an error and new-token kept", tok.Token(), err)
	}
}

// TestSIGHUPRunsEveryReload checks that a SIGHUP to berthd runs every
// reload registered, those added after the signals were set up (the
// fleet's) included.
func TestSIGHUPRunsEveryReload(t *testing.T) {
	var auth, fleet atomic.Int32
	hup := &reloads{list: []reloader{{"tokens and TLS", func() error { auth.Add(1); return nil }}}}
	_, stop := signals(slog.New(slog.NewTextHandler(io.Discard, nil)), hup)
	defer stop()
	hup.add(reloader{"peer TLS", func() error { fleet.Add(1); return nil }})
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for auth.Load() < 1 || fleet.Load() < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("after SIGHUP: %d authentication and %d fleet reloads, want 1 each", auth.Load(), fleet.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
