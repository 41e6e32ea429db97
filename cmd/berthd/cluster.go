package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/internal/sandboxid"
	"github.com/berth-sandbox/berth/server"
	"github.com/berth-sandbox/berth/server/cluster"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/credentials"
)

// clusterFlags are the flags of a fleet of berthd nodes (see docs/fleet.md).
type clusterFlags struct {
	endpoints      string
	embed          bool
	embedDir       string
	embedClientURL string
	embedPeerURL   string
	etcdCA         string
	etcdCert       string
	etcdKey        string
	prefix         string
	nodeID         string
	advertise      string
	labels         map[string]string
	leaseTTL       time.Duration
	etcdBudget     time.Duration
	listBudget     time.Duration
	gateway        bool
	peerTokenFile  string
	peerCA         string
	peerCert       string
	peerKey        string
	peerServerName string
	peerInsecure   bool
}

func (f *clusterFlags) register() {
	host, _ := os.Hostname()
	flag.StringVar(&f.endpoints, "etcd-endpoints", "", "comma-separated etcd client URLs of the fleet's store: this berthd joins the fleet as a node (or routes for it, with --gateway)")
	flag.BoolVar(&f.embed, "etcd-embed", false, "run a single-member etcd inside this berthd as the fleet's store (data in --etcd-embed-dir) and join it; other nodes point --etcd-endpoints at --etcd-embed-client-url")
	flag.StringVar(&f.embedDir, "etcd-embed-dir", "", "data directory of the embedded etcd (default <state-dir>/etcd)")
	flag.StringVar(&f.embedClientURL, "etcd-embed-client-url", "http://127.0.0.1:2379", "client URL the embedded etcd serves (no authentication: keep it on loopback or a trusted network)")
	flag.StringVar(&f.embedPeerURL, "etcd-embed-peer-url", "http://127.0.0.1:2380", "peer URL of the embedded etcd")
	flag.StringVar(&f.etcdCA, "etcd-ca", "", "PEM CA bundle that signed the etcd servers' certificates (https endpoints); re-read on SIGHUP")
	flag.StringVar(&f.etcdCert, "etcd-cert", "", "PEM client certificate for etcd (with --etcd-key); re-read on SIGHUP")
	flag.StringVar(&f.etcdKey, "etcd-key", "", "PEM key of --etcd-cert")
	flag.StringVar(&f.prefix, "cluster-prefix", cluster.DefaultPrefix, "prefix of the fleet's keys in etcd (several fleets may share one etcd)")
	flag.StringVar(&f.nodeID, "node-id", strings.ToLower(host), "this node's id in the fleet, [a-z0-9-] (default: the host name); the first start records it in <state-dir>/node-id and a start with another id there is refused")
	flag.StringVar(&f.advertise, "advertise-address", "", "host:port at which the fleet's other berthds reach this one (default: the TCP --listen address, when it names a host)")
	flag.Func("node-label", "`KEY=VALUE` label of this node; sandboxes labelled node.berth.dev/KEY=VALUE are placed only on nodes with it (repeatable)", func(v string) error {
		k, val, ok := strings.Cut(v, "=")
		if !ok || k == "" {
			return fmt.Errorf("%q is not KEY=VALUE", v)
		}
		if f.labels == nil {
			f.labels = map[string]string{}
		}
		f.labels[k] = val
		return nil
	})
	flag.DurationVar(&f.leaseTTL, "lease-ttl", 10*time.Second, "lease time of this node in the fleet: after it stops refreshing, other nodes report its sandboxes as lost (NODE_LOST) within this long")
	flag.DurationVar(&f.etcdBudget, "etcd-budget", cluster.DefaultEtcdBudget, "how long a routed call, a create, a claim or a node command waits for etcd; past it the call fails CLUSTER_UNAVAILABLE (retryable) instead of waiting for the caller's deadline; also how long berthd waits for etcd at start before it serves without it")
	flag.DurationVar(&f.listBudget, "list-budget", 3*time.Second, "how long ListSandboxes waits for the fleet's nodes; it answers with what came in time and names the nodes that did not in unreachable_nodes (keep it below your clients' deadlines)")
	flag.BoolVar(&f.gateway, "gateway", false, "route the fleet's calls without running sandboxes: no containerd, no images (needs --etcd-endpoints)")
	flag.StringVar(&f.peerTokenFile, "peer-token-file", "", "file holding the bearer token this berthd sends to the fleet's other nodes (a token of a --node-principal there); re-read on SIGHUP")
	flag.StringVar(&f.peerCA, "peer-tls-ca", "", "PEM CA bundle that signed the other nodes' server certificates (default: the system's roots); re-read on SIGHUP")
	flag.StringVar(&f.peerCert, "peer-tls-cert", "", "PEM client certificate this berthd presents to the other nodes (its common name a --node-principal there); re-read on SIGHUP")
	flag.StringVar(&f.peerKey, "peer-tls-key", "", "PEM key of --peer-tls-cert")
	flag.StringVar(&f.peerServerName, "peer-tls-server-name", "", "name to verify the other nodes' certificates against instead of their address's host")
	flag.BoolVar(&f.peerInsecure, "peer-insecure", false, "reach the other nodes in plaintext (nodes serving --insecure-tcp only)")
}

func (f *clusterFlags) enabled() bool { return f.endpoints != "" || f.embed }

// check refuses flags that do not go together.
func (f *clusterFlags) check(listens []string) error {
	if !f.enabled() {
		if f.gateway {
			return errors.New("--gateway routes for a fleet: give --etcd-endpoints")
		}
		return nil
	}
	if f.embed && f.endpoints != "" {
		return errors.New("--etcd-embed runs the fleet's store here: give it or --etcd-endpoints, not both")
	}
	if f.gateway && f.embed {
		return errors.New("--gateway with --etcd-embed: a gateway holds no data; run the embedded etcd on a node")
	}
	if !sandboxid.Valid(f.nodeID) {
		return fmt.Errorf("--node-id %q must be 1 to 63 characters from [a-z0-9-] (the host name is the default)", f.nodeID)
	}
	if f.advertise == "" && !f.gateway {
		for _, l := range listens {
			if _, unix := server.UnixPath(l); unix {
				continue
			}
			if host, _, err := net.SplitHostPort(l); err == nil && host != "" && !net.ParseIP(host).IsUnspecified() {
				f.advertise = l
				break
			}
		}
		if f.advertise == "" {
			return errors.New("a node of a fleet needs a TCP --listen address that names a host, or --advertise-address: the other nodes reach it there")
		}
	}
	if f.leaseTTL < 2*time.Second {
		return fmt.Errorf("--lease-ttl %v: must be at least 2s", f.leaseTTL)
	}
	if f.etcdBudget <= 0 {
		return fmt.Errorf("--etcd-budget %v: must be positive", f.etcdBudget)
	}
	if f.listBudget <= 0 {
		return fmt.Errorf("--list-budget %v: must be positive", f.listBudget)
	}
	if f.peerInsecure && (f.peerCA != "" || f.peerCert != "") {
		return errors.New("--peer-insecure dials in plaintext: it takes no --peer-tls-* files")
	}
	if (f.peerCert == "") != (f.peerKey == "") {
		return errors.New("--peer-tls-cert and --peer-tls-key go together")
	}
	return nil
}

// fleet is what a berthd in a fleet runs besides its Service.
type fleet struct {
	embedded  *cluster.Embedded
	cli       *clientv3.Client
	store     *cluster.EtcdStore // the fleet's records, in cli's etcd
	directory *cluster.Directory
	peers     *cluster.Peers
	nodes     *cluster.NodeService
	// reloads re-read the files of the fleet's TLS and token at SIGHUP.
	reloads []reloader
}

// open starts the embedded etcd when asked, connects to the store and
// reads the fleet's nodes; an etcd that does not answer within the etcd
// budget is waited for in the background (logged), not an error. Close
// undoes it.
func (f *clusterFlags) open(ctx context.Context, log *slog.Logger, stateDir string, connectBudget time.Duration) (*fleet, error) {
	fl := &fleet{}
	endpoints := splitList(f.endpoints)
	if f.embed {
		dir := f.embedDir
		if dir == "" {
			dir = filepath.Join(stateDir, "etcd")
		}
		e, err := cluster.StartEmbedded(ctx, cluster.EmbedConfig{Dir: dir, ClientURL: f.embedClientURL, PeerURL: f.embedPeerURL, Name: f.nodeID}, log)
		if err != nil {
			return nil, err
		}
		fl.embedded = e
		endpoints = e.Endpoints()
		log.Info("embedded etcd serving", slog.Any("endpoints", endpoints), slog.String("dir", dir))
	}
	etcdTLS, err := newClientTLS(f.etcdCA, f.etcdCert, f.etcdKey, "")
	if err != nil {
		fl.Close()
		return nil, fmt.Errorf("etcd TLS: %w", err)
	}
	store := cluster.StoreConfig{Endpoints: endpoints, DialTimeout: f.etcdBudget}
	if etcdTLS != nil {
		store.TLS, store.Credentials = etcdTLS.Config(), etcdTLS
		fl.reloads = append(fl.reloads, reloader{"etcd TLS", etcdTLS.Reload})
	}
	if fl.cli, err = cluster.Connect(ctx, store, log); err != nil {
		fl.Close()
		return nil, err
	}
	fl.store = cluster.NewEtcdStore(fl.cli)
	if fl.directory, err = cluster.NewDirectory(fl.store, f.prefix, log); err == nil {
		err = fl.directory.Start(ctx, f.etcdBudget)
	}
	if err != nil {
		fl.Close()
		return nil, err
	}
	creds := cluster.PeerCredentials{}
	if !f.peerInsecure {
		peerTLS, err := newClientTLS(f.peerCA, f.peerCert, f.peerKey, f.peerServerName)
		if err != nil {
			fl.Close()
			return nil, fmt.Errorf("peer TLS: %w", err)
		}
		if peerTLS != nil {
			creds.TLS = peerTLS
			fl.reloads = append(fl.reloads, reloader{"peer TLS", peerTLS.Reload})
		} else {
			creds.TLS = credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12}) // the system's roots
		}
	}
	if f.peerTokenFile != "" {
		tok, err := newFileToken(f.peerTokenFile)
		if err != nil {
			fl.Close()
			return nil, fmt.Errorf("--peer-token-file: %w", err)
		}
		creds.Token = tok.Token
		fl.reloads = append(fl.reloads, reloader{"peer token", tok.Reload})
	}
	fl.peers = cluster.NewPeers(creds, connectBudget)
	fl.nodes = cluster.NewNodeService(fl.store, f.prefix).WithEtcdBudget(f.etcdBudget)
	return fl, nil
}

// Close stops what open started, in reverse.
func (fl *fleet) Close() {
	if fl.peers != nil {
		fl.peers.Close()
	}
	if fl.directory != nil {
		fl.directory.Close()
	}
	if fl.cli != nil {
		fl.cli.Close()
	}
	if fl.embedded != nil {
		fl.embedded.Close()
	}
}

// member returns the membership of this node.
func (f *clusterFlags) member(fl *fleet, stateDir string, log *slog.Logger) (*cluster.Member, error) {
	return cluster.NewMember(cluster.Config{NodeID: f.nodeID, Address: f.advertise, Labels: f.labels, Prefix: f.prefix, LeaseTTL: f.leaseTTL, Version: server.Version, StateDir: stateDir, EtcdBudget: f.etcdBudget}, fl.store, log)
}

// tlsConfig loads a client TLS configuration: the CA bundle to verify
// servers with (the system's roots when empty), a client certificate, a
// server name. It returns nil when all are empty.
func tlsConfig(caFile, certFile, keyFile, serverName string) (*tls.Config, error) {
	if caFile == "" && certFile == "" && serverName == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s holds no PEM certificate", caFile)
		}
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}
