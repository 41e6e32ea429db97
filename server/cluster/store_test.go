package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"
)

// countingCreds are transport credentials that count their handshakes
// and refuse them.
type countingCreds struct {
	credentials.TransportCredentials
	handshakes atomic.Int32
}

func (c *countingCreds) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	c.handshakes.Add(1)
	return nil, nil, errors.New("refused by the test")
}

func (c *countingCreds) Clone() credentials.TransportCredentials { return c }

// TestConnectUsesCredentials checks that the etcd client dials with
// StoreConfig.Credentials — berthd's credentials that re-read the etcd TLS
// files at SIGHUP (issue 22: they were read once) — rather than with
// credentials of its own made from StoreConfig.TLS once.
func TestConnectUsesCredentials(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			defer conn.Close()
		}
	}()
	creds := &countingCreds{TransportCredentials: credentials.NewTLS(&tls.Config{})}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Connect returns a client that waits for etcd when none answers
	// within DialTimeout (a node starts without etcd); a call through it
	// must fail, and only after a handshake with those credentials.
	cli, err := Connect(ctx, StoreConfig{Endpoints: []string{"https://" + l.Addr().String()}, TLS: &tls.Config{}, Credentials: creds, DialTimeout: time.Second}, testLog())
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	defer cli.Close()
	sctx, scancel := context.WithTimeout(ctx, time.Second)
	defer scancel()
	if _, err := cli.Get(sctx, "k"); err == nil {
		t.Fatal("a Get through a listener that is not etcd succeeded")
	}
	if creds.handshakes.Load() == 0 {
		t.Errorf("the etcd client dialed without a handshake of StoreConfig.Credentials: it used other credentials")
	}
}
