// Command berth-controller reconciles agents.x-k8s.io/v1beta1 Sandbox
// objects onto berth (package controller): each object becomes a berth
// sandbox created through berthd's API at --berth-addr; each
// extensions.agents.x-k8s.io SandboxClaim becomes a Sandbox object of its
// template; each sandbox created through berth's API gets a Sandbox object
// in --mirror-namespace. It reaches the API server in-cluster or through
// --kubeconfig / $KUBECONFIG.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	berth "github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/kubernetes/controller"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "berth-controller:", err)
		os.Exit(1)
	}
}

func run() error {
	addr := flag.String("berth-addr", "berthd.berth-system.svc:7443", "berth's API: a berthd node or gateway, host:port (TLS) or unix:///path")
	tokenFile := flag.String("token-file", "", "file holding the bearer token berth-controller sends to berthd (an admin's, so that it sees every sandbox it made)")
	caFile := flag.String("tls-ca", "", "PEM CA bundle that signed berthd's certificate (default: the system's roots)")
	insecure := flag.Bool("insecure", false, "plaintext TCP to berthd (tests and loopback only)")
	metrics := flag.String("metrics-listen", ":8080", "address of the Prometheus metrics endpoint (\"0\": off)")
	health := flag.String("health-listen", ":8081", "address of /healthz and /readyz (\"0\": off)")
	elect := flag.Bool("leader-elect", true, "elect one active replica through a Lease")
	electNS := flag.String("leader-election-namespace", "berth-system", "namespace of the leader election Lease")
	mirrorNS := flag.String("mirror-namespace", "berth-sandboxes", "namespace of the Sandbox objects of sandboxes created through berth's API (\"\": none are made)")
	mirrorInterval := flag.Duration("mirror-interval", controller.DefaultMirrorInterval, "how often berth's sandboxes are listed for the mirror")
	grace := flag.Duration("node-lost-grace", controller.DefaultNodeLostGrace, "how long deleting a Sandbox object whose berthd node is lost waits for the node to come back and delete the sandbox; after it the object goes and the sandbox stays on that node")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse() // also --kubeconfig, registered by controller-runtime's config package

	cfg, err := config.GetConfig()
	if err != nil {
		return err
	}
	var opts []berth.Option
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			return err
		}
		opts = append(opts, berth.WithToken(strings.TrimSpace(string(b))))
	}
	switch {
	case *insecure:
		opts = append(opts, berth.WithInsecure())
	case *caFile != "":
		tlsCfg, err := berth.TLSConfigFromFiles(*caFile, "", "")
		if err != nil {
			return err
		}
		opts = append(opts, berth.WithTLS(tlsCfg))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c, err := berth.Dial(ctx, *addr, opts...)
	if err != nil {
		return err
	}
	defer c.Close()
	return controller.Run(ctx, controller.Options{
		Config: cfg, Berth: c, Log: zap.New(zap.UseFlagOptions(&zapOpts)),
		MetricsAddr: *metrics, HealthAddr: *health,
		LeaderElection: *elect, LeaderElectionNamespace: *electNS, NodeLostGrace: *grace,
		MirrorNamespace: *mirrorNS, MirrorInterval: *mirrorInterval,
	})
}
