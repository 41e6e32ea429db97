package controller

import (
	"context"
	"fmt"
	"maps"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	extv1alpha1 "github.com/berth-sandbox/berth/kubernetes/api/extensions/v1alpha1"
	sandboxv1 "github.com/berth-sandbox/berth/kubernetes/api/v1beta1"
)

// ClaimReconciler makes each SandboxClaim a Sandbox object: named as the
// claim, in its namespace, its spec the SandboxTemplate's that the claim
// names (spec.berth.env with the claim's env added, the claim's value
// winning; spec.podTemplate.metadata with the claim's
// additionalPodMetadata added), owned by the claim (its controller
// reference: the cluster's garbage collector deletes it with the claim).
// The claim's status.sandbox.name names it and its Ready condition is the
// Sandbox's. The Sandbox is made once: a template changed later changes
// no sandbox made from it, as in agent-sandbox.
type ClaimReconciler struct {
	Client client.Client
}

// setupClaims registers the ClaimReconciler when the API server serves
// SandboxClaim and SandboxTemplate (sandboxclaim-crd.yaml and
// sandboxtemplate-crd.yaml applied); without them it logs that claims are
// not served, and Sandbox objects are reconciled as before.
func setupClaims(mgr ctrl.Manager, logger logr.Logger) error {
	for _, kind := range []string{"SandboxClaim", "SandboxTemplate"} {
		gk := schema.GroupKind{Group: extv1alpha1.GroupVersion.Group, Kind: kind}
		_, err := mgr.GetRESTMapper().RESTMapping(gk, extv1alpha1.GroupVersion.Version)
		if meta.IsNoMatchError(err) {
			logger.Info("the API server does not serve "+gk.String()+" (apply deploy/kubernetes/sandboxclaim-crd.yaml and sandboxtemplate-crd.yaml, then restart): claims are not served", "version", extv1alpha1.GroupVersion.Version)
			return nil
		}
		if err != nil {
			return fmt.Errorf("sandboxclaim controller: look up %s: %w", gk, err)
		}
	}
	if err := (&ClaimReconciler{Client: mgr.GetClient()}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("sandboxclaim controller: %w", err)
	}
	return nil
}

// SetupWithManager registers the reconciler for claims, the Sandbox
// objects they own, and the templates they name.
func (r *ClaimReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&extv1alpha1.SandboxClaim{}).
		Owns(&sandboxv1.Sandbox{}).
		// A claim made before its template waits for it.
		Watches(&extv1alpha1.SandboxTemplate{}, handler.EnqueueRequestsFromMapFunc(r.claimsOf)).
		Named("sandboxclaim").
		Complete(r)
}

// claimsOf is every claim in tmpl's namespace that has no Sandbox yet.
func (r *ClaimReconciler) claimsOf(ctx context.Context, tmpl client.Object) []reconcile.Request {
	var claims extv1alpha1.SandboxClaimList
	if err := r.Client.List(ctx, &claims, client.InNamespace(tmpl.GetNamespace())); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for _, c := range claims.Items {
		if c.Spec.TemplateRef.Name == tmpl.GetName() && c.Status.Sandbox.Name == "" {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}})
		}
	}
	return reqs
}

// Reconcile makes the claim's Sandbox when it has none and reflects the
// Sandbox's Ready into the claim.
func (r *ClaimReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var claim extv1alpha1.SandboxClaim
	if err := r.Client.Get(ctx, req.NamespacedName, &claim); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !claim.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	before := claim.DeepCopy()
	err := r.sync(ctx, &claim)
	if !equality.Semantic.DeepEqual(before.Status, claim.Status) {
		if uerr := r.Client.Status().Patch(ctx, &claim, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); uerr != nil && err == nil {
			err = fmt.Errorf("update claim status: %w", uerr)
		}
	}
	return ctrl.Result{}, err
}

func (r *ClaimReconciler) sync(ctx context.Context, claim *extv1alpha1.SandboxClaim) error {
	var sb sandboxv1.Sandbox
	key := types.NamespacedName{Namespace: claim.Namespace, Name: claim.Name}
	err := r.Client.Get(ctx, key, &sb)
	if apierrors.IsNotFound(err) {
		var tmpl extv1alpha1.SandboxTemplate
		tkey := types.NamespacedName{Namespace: claim.Namespace, Name: claim.Spec.TemplateRef.Name}
		if err := r.Client.Get(ctx, tkey, &tmpl); apierrors.IsNotFound(err) {
			setClaimReady(claim, metav1.ConditionFalse, extv1alpha1.ReasonTemplateNotFound,
				fmt.Sprintf("spec.sandboxTemplateRef.name: no SandboxTemplate %s in namespace %s", tkey.Name, tkey.Namespace))
			return nil // the template's watch brings the claim back
		} else if err != nil {
			return fmt.Errorf("get SandboxTemplate %s: %w", tkey, err)
		}
		sb = *ClaimSandbox(claim, &tmpl)
		if err := controllerutil.SetControllerReference(claim, &sb, r.Client.Scheme()); err != nil {
			return err
		}
		if err := r.Client.Create(ctx, &sb); err != nil {
			return fmt.Errorf("create Sandbox %s of the claim: %w", key, err)
		}
	} else if err != nil {
		return fmt.Errorf("get Sandbox %s: %w", key, err)
	}
	if !metav1.IsControlledBy(&sb, claim) {
		setClaimReady(claim, metav1.ConditionFalse, extv1alpha1.ReasonSandboxNameTaken,
			fmt.Sprintf("Sandbox %s exists and is not this claim's", key))
		return nil
	}
	claim.Status.Sandbox.Name = sb.Name
	if c := meta.FindStatusCondition(sb.Status.Conditions, sandboxv1.ConditionReady); c != nil {
		setClaimReady(claim, c.Status, c.Reason, c.Message)
	} else {
		setClaimReady(claim, metav1.ConditionFalse, sandboxv1.ReasonStarting, "the Sandbox has no status yet")
	}
	return nil
}

// ClaimSandbox is the Sandbox object of claim made from tmpl (without
// its owner reference).
func ClaimSandbox(claim *extv1alpha1.SandboxClaim, tmpl *extv1alpha1.SandboxTemplate) *sandboxv1.Sandbox {
	spec := tmpl.Spec.DeepCopy()
	if len(claim.Spec.Env) > 0 {
		if spec.Berth.Env == nil {
			spec.Berth.Env = map[string]string{}
		}
		for _, e := range claim.Spec.Env {
			spec.Berth.Env[e.Name] = e.Value
		}
	}
	if add := claim.Spec.AdditionalPodMetadata; len(add.Labels)+len(add.Annotations) > 0 {
		if spec.PodTemplate == nil {
			spec.PodTemplate = &sandboxv1.PodTemplate{}
		}
		md := &spec.PodTemplate.Metadata
		md.Labels = mergeMaps(md.Labels, add.Labels)
		md.Annotations = mergeMaps(md.Annotations, add.Annotations)
	}
	return &sandboxv1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Name: claim.Name, Namespace: claim.Namespace},
		Spec: sandboxv1.SandboxSpec{
			PodTemplate:   spec.PodTemplate,
			OperatingMode: sandboxv1.OperatingModeRunning,
			Berth:         spec.Berth,
		},
	}
}

func mergeMaps(base, add map[string]string) map[string]string {
	if len(add) == 0 {
		return base
	}
	out := maps.Clone(base)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, add)
	return out
}

func setClaimReady(claim *extv1alpha1.SandboxClaim, status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&claim.Status.Conditions, metav1.Condition{
		Type: sandboxv1.ConditionReady, Status: status, Reason: reason, Message: message, ObservedGeneration: claim.Generation,
	})
}
