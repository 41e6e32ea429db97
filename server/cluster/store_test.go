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
	cli, err := Connect(ctx, StoreConfig{Endpoints: []string{"https://" + l.Addr().String()}, TLS: &tls.Config{}, Credentials: creds, DialTimeout: time.Second}, testLog())
	if err == nil {
		cli.Close()
		t.Fatal("Connect to a listener that is not etcd succeeded")
	}
	if creds.handshakes.Load() == 0 {
		t.Errorf("Connect failed (%v) without a handshake of StoreConfig.Credentials: the client dialed with other credentials", err)
	}
}
