package controller

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berth "github.com/berth-sandbox/berth/client"
	sandboxv1 "github.com/berth-sandbox/berth/kubernetes/api/v1beta1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// The label and annotations of a Sandbox object the mirror made for a
// sandbox created through berth's API (not from an object).
const (
	// LabelOrigin is on every mirrored object, with the value OriginAPI:
	// `kubectl get sandboxes -l k8s.berth.dev/origin=berth-api` lists them.
	LabelOrigin = "k8s.berth.dev/origin"
	OriginAPI   = "berth-api"
	// AnnotationOwner is the principal that created the sandbox
	// (Sandbox.owner: "unix:uid:N", a token's or a certificate's name); an
	// annotation, since a principal need not be a valid label value.
	AnnotationOwner = "k8s.berth.dev/owner"
)

// DefaultMirrorInterval is how often the mirror lists berth's sandboxes:
// berth's API has no stream of sandbox events, so a sandbox made or
// deleted through it reaches Kubernetes within this time.
const DefaultMirrorInterval = 10 * time.Second

// SandboxLister lists berth's sandboxes; *client.Client of
// github.com/berth-sandbox/berth/client has this method.
type SandboxLister interface {
	ListSandboxes(ctx context.Context, labelSelector map[string]string, opts ...berth.ListOption) iter.Seq2[*berthv1.Sandbox, error]
}

// Mirror makes every sandbox berth holds that no object made visible in
// Kubernetes: each sandbox created through berth's API (it lacks
// LabelNamespace) gets a Sandbox object in Namespace named by its sandbox
// id (berth's ids, [a-z0-9][a-z0-9-]{0,62}, are valid object names),
// labelled LabelOrigin=OriginAPI, its owner in AnnotationOwner, its spec
// what berth reports of it; the Reconciler then keeps its status and
// deletes the sandbox with the object. A mirrored object whose sandbox
// berth no longer lists (deleted through berth's API, or its lifetime
// ended) is deleted. Mirror runs on the elected leader only.
type Mirror struct {
	// Client writes the objects; Reader lists them (the manager's cache).
	Client client.Client
	Reader client.Reader
	// Berth lists berth's sandboxes; its token must be an admin's to see
	// every principal's.
	Berth SandboxLister
	// Namespace holds the mirrored objects.
	Namespace string
	// Interval between listings; 0 means DefaultMirrorInterval.
	Interval time.Duration
	// Log receives what a pass could not do.
	Log logr.Logger
}

// Start runs a pass every Interval until ctx ends (manager.Runnable).
func (m *Mirror) Start(ctx context.Context) error {
	interval := m.Interval
	if interval <= 0 {
		interval = DefaultMirrorInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := m.Pass(ctx); err != nil && ctx.Err() == nil {
			m.Log.Error(err, "mirror berth's sandboxes", "namespace", m.Namespace)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// NeedLeaderElection: one replica mirrors.
func (m *Mirror) NeedLeaderElection() bool { return true }

// Pass lists berth's sandboxes once, creates the objects missing and
// deletes those of sandboxes berth no longer holds. When berth's listing
// names unreachable nodes, nothing is deleted: their sandboxes exist.
func (m *Mirror) Pass(ctx context.Context) error {
	var objs sandboxv1.SandboxList
	if err := m.Reader.List(ctx, &objs, client.InNamespace(m.Namespace), client.MatchingLabels{LabelOrigin: OriginAPI}); err != nil {
		return fmt.Errorf("list mirrored Sandbox objects in %s: %w", m.Namespace, err)
	}
	mirrored := make(map[string]*sandboxv1.Sandbox, len(objs.Items))
	for i := range objs.Items {
		mirrored[objs.Items[i].Name] = &objs.Items[i]
	}
	var unreachable []string
	held := map[string]bool{}
	var errs []error
	for sb, err := range m.Berth.ListSandboxes(ctx, nil, berth.UnreachableNodes(&unreachable)) {
		if err != nil {
			return fmt.Errorf("list berth's sandboxes: %w", err)
		}
		if _, fromObject := sb.GetLabels()[LabelNamespace]; fromObject {
			continue // an object made it (kubectl, a claim): not mirrored
		}
		held[sb.GetId()] = true
		if mirrored[sb.GetId()] != nil {
			continue
		}
		err := m.Client.Create(ctx, MirrorObject(sb, m.Namespace))
		switch {
		case apierrors.IsAlreadyExists(err):
			// An object of that name that is not a mirror (the cache
			// holds every mirror): it stays as it is.
			m.Log.Info("a Sandbox object of the sandbox's name exists and is not its mirror", "namespace", m.Namespace, "sandbox_id", sb.GetId())
		case err != nil:
			errs = append(errs, fmt.Errorf("create the Sandbox object of %s: %w", sb.GetId(), err))
		}
	}
	if len(unreachable) > 0 {
		return errors.Join(errs...)
	}
	for name, obj := range mirrored {
		if held[name] || !obj.DeletionTimestamp.IsZero() {
			continue
		}
		// Deleting runs the finalizer: berth answers SANDBOX_NOT_FOUND,
		// and the object goes.
		if err := m.Client.Delete(ctx, obj, client.Preconditions{UID: &obj.UID}); client.IgnoreNotFound(err) != nil {
			errs = append(errs, fmt.Errorf("delete the Sandbox object of %s, which berth no longer holds: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// MirrorObject is the Sandbox object of sb, a sandbox made through berth's
// API, in namespace: named by its id, spec.berth what berth reports of its
// creation (env values are not reported: spec.berth.env is empty), and
// spec.operatingMode Suspended when it is paused or hibernated.
func MirrorObject(sb *berthv1.Sandbox, namespace string) *sandboxv1.Sandbox {
	obj := &sandboxv1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{
			Name: sb.GetId(), Namespace: namespace,
			Labels:      map[string]string{LabelOrigin: OriginAPI},
			Annotations: map[string]string{AnnotationOwner: sb.GetOwner()},
			Finalizers:  []string{sandboxv1.Finalizer},
		},
		Spec: sandboxv1.SandboxSpec{
			OperatingMode: sandboxv1.OperatingModeRunning,
			Berth: sandboxv1.BerthSpec{
				Image:   sb.GetImage(),
				Runtime: sb.GetRuntimeName(),
				User:    sb.GetUser(),
				Workdir: sb.GetWorkdir(),
				Labels:  sb.GetLabels(),
			},
		},
	}
	b := &obj.Spec.Berth
	switch sb.GetState() {
	case berthv1.SandboxState_SANDBOX_STATE_PAUSED:
		obj.Spec.OperatingMode = sandboxv1.OperatingModeSuspended
	case berthv1.SandboxState_SANDBOX_STATE_HIBERNATED:
		obj.Spec.OperatingMode = sandboxv1.OperatingModeSuspended
		b.SuspendAction = "Hibernate"
	}
	if r := sb.GetResources(); r != nil {
		b.Resources = &sandboxv1.Resources{
			CPUMillis: int64(r.GetCpuMillis()), MemoryBytes: int64(r.GetMemoryBytes()),
			DiskBytes: int64(r.GetDiskBytes()), PidsLimit: int64(r.GetPidsLimit()),
		}
	}
	if d := sb.GetIdleTimeout(); d != nil {
		b.IdleTimeout = &metav1.Duration{Duration: d.AsDuration()}
	}
	if d := sb.GetMaxLifetime(); d != nil {
		b.MaxLifetime = &metav1.Duration{Duration: d.AsDuration()}
	}
	if n := sb.GetNetwork(); n != nil {
		b.Network = &sandboxv1.Network{Mode: "None", Allow: n.GetAllow()}
		if n.GetMode() == berthv1.NetworkMode_NETWORK_MODE_EGRESS {
			b.Network.Mode = "Egress"
		}
	}
	return obj
}

// Mirrored says whether obj is the mirror of a sandbox made through
// berth's API.
func Mirrored(obj *sandboxv1.Sandbox) bool { return obj.Labels[LabelOrigin] == OriginAPI }

// objectSandboxID is the berth sandbox id of obj: a mirror's name, else
// SandboxID of its namespace, name and uid.
func objectSandboxID(obj *sandboxv1.Sandbox) string {
	if Mirrored(obj) {
		return obj.Name
	}
	return SandboxID(obj.Namespace, obj.Name, string(obj.UID))
}

// mirrorGone deletes a mirrored object whose sandbox berth no longer
// holds: the object goes with it (through the finalizer).
func (r *Reconciler) mirrorGone(ctx context.Context, obj *sandboxv1.Sandbox) error {
	if err := r.Client.Delete(ctx, obj, client.Preconditions{UID: &obj.UID}); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("delete Sandbox object %s/%s, whose sandbox berth no longer holds: %w", obj.Namespace, obj.Name, err)
	}
	return nil
}

// mirrorFollows says whether the reconciler leaves a mirrored sandbox's
// state to berth's API: it pauses or resumes one only when its object's
// spec changed since the last reconcile (kubectl patched operatingMode),
// so a pause through berth's API is not undone.
func mirrorFollows(obj *sandboxv1.Sandbox) bool {
	return Mirrored(obj) && obj.Status.Berth.ObservedGeneration == obj.Generation
}
