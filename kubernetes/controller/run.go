package controller

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	extv1alpha1 "github.com/berth-sandbox/berth/kubernetes/api/extensions/v1alpha1"
	sandboxv1 "github.com/berth-sandbox/berth/kubernetes/api/v1beta1"
)

// Options configures Run.
type Options struct {
	// Config reaches the API server.
	Config *rest.Config
	// Berth is berth's API (a berthd node or gateway).
	Berth Berth
	// Log receives the controller's log.
	Log logr.Logger
	// MetricsAddr serves Prometheus metrics ("0": off).
	MetricsAddr string
	// HealthAddr serves /healthz and /readyz ("0" or empty: off).
	HealthAddr string
	// LeaderElection makes one of several replicas reconcile, holding the
	// Lease LeaderElectionID in LeaderElectionNamespace.
	LeaderElection          bool
	LeaderElectionNamespace string
	// Resync: Reconciler.Resync.
	Resync time.Duration
	// MirrorNamespace, when set, runs Mirror: every sandbox made through
	// berth's API gets a Sandbox object there. Berth must then also be a
	// SandboxLister.
	MirrorNamespace string
	// MirrorInterval: Mirror.Interval.
	MirrorInterval time.Duration
	// NodeLostGrace: Reconciler.NodeLostGrace.
	NodeLostGrace time.Duration
	// SeveralPerProcess lets Run be called again in one process while an
	// earlier Run's controllers are registered (tests): controller-runtime
	// refuses a second controller of the same name in a process, whose
	// metrics would be counted together, unless told to skip that check.
	SeveralPerProcess bool
}

// LeaderElectionID names the Lease replicas of berth-controller elect a
// leader by.
const LeaderElectionID = "berth-controller.berth.dev"

// Scheme is the scheme of the controller's client: Kubernetes' own types,
// Sandbox, SandboxTemplate and SandboxClaim.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := sandboxv1.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := extv1alpha1.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

// Run reconciles Sandbox and SandboxClaim objects, and mirrors berth's
// sandboxes when opts.MirrorNamespace is set, until ctx ends.
func Run(ctx context.Context, opts Options) error {
	scheme, err := Scheme()
	if err != nil {
		return err
	}
	health := opts.HealthAddr
	if health == "" {
		health = "0"
	}
	mgr, err := ctrl.NewManager(opts.Config, ctrl.Options{
		Scheme:                  scheme,
		Logger:                  opts.Log,
		Metrics:                 metricsserver.Options{BindAddress: opts.MetricsAddr},
		HealthProbeBindAddress:  health,
		LeaderElection:          opts.LeaderElection,
		LeaderElectionID:        LeaderElectionID,
		LeaderElectionNamespace: opts.LeaderElectionNamespace,
		Controller:              config.Controller{SkipNameValidation: &opts.SeveralPerProcess},
	})
	if err != nil {
		return fmt.Errorf("controller manager: %w", err)
	}
	if health != "0" {
		if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
			return err
		}
		if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
			return err
		}
	}
	r := &Reconciler{Client: mgr.GetClient(), Berth: opts.Berth, Resync: opts.Resync, NodeLostGrace: opts.NodeLostGrace}
	if err := r.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("sandbox controller: %w", err)
	}
	if err := setupClaims(mgr, opts.Log); err != nil {
		return err
	}
	if opts.MirrorNamespace != "" {
		lister, ok := opts.Berth.(SandboxLister)
		if !ok {
			return fmt.Errorf("mirror: berth's client %T cannot list sandboxes", opts.Berth)
		}
		if err := mgr.Add(&Mirror{
			Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Berth: lister,
			Namespace: opts.MirrorNamespace, Interval: opts.MirrorInterval, Log: opts.Log.WithName("mirror"),
		}); err != nil {
			return fmt.Errorf("mirror: %w", err)
		}
	}
	return mgr.Start(ctx)
}
