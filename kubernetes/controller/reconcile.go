// Package controller reconciles agents.x-k8s.io/v1beta1 Sandbox objects onto
// berth: each object becomes one berth sandbox, created through berth's
// public gRPC API (a berthd node or gateway), its state reflected into the
// object's status, paused or hibernated while spec.operatingMode is
// Suspended, and deleted with the object (a finalizer).
package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	berth "github.com/berth-sandbox/berth/client"
	sandboxv1 "github.com/berth-sandbox/berth/kubernetes/api/v1beta1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// Berth is what the controller asks of berth's API; *client.Client of
// github.com/berth-sandbox/berth/client has these methods. Errors are the
// client's typed *client.Error.
type Berth interface {
	CreateSandbox(ctx context.Context, req *berthv1.CreateSandboxRequest) (*berthv1.Sandbox, error)
	GetSandbox(ctx context.Context, id string) (*berthv1.Sandbox, error)
	DeleteSandbox(ctx context.Context, id string) error
	PauseSandbox(ctx context.Context, id string) (*berthv1.Sandbox, error)
	ResumeSandbox(ctx context.Context, id string) (*berthv1.Sandbox, error)
	HibernateSandbox(ctx context.Context, id string) (*berthv1.Sandbox, error)
}

// DefaultResync is how often a settled Sandbox is looked at again, so that
// what berth changed on its own (an idle pause, a lost node, an ended
// lifetime) reaches the object's status.
const DefaultResync = 30 * time.Second

// startingPoll is how soon a Sandbox whose berth sandbox starts or stops is
// looked at again.
const startingPoll = time.Second

// lostPoll is how soon a Sandbox whose node is lost or does not answer is
// looked at again (at most; Resync when shorter), so that its Ready
// condition turns True soon after the node is back.
const lostPoll = 5 * time.Second

// DefaultNodeLostGrace is how long the deletion of a Sandbox object whose
// node is lost waits for the node to come back and delete the sandbox
// before the object goes without it.
const DefaultNodeLostGrace = 5 * time.Minute

// Reconciler makes Sandbox objects berth sandboxes.
type Reconciler struct {
	// Client reads and writes the objects.
	Client client.Client
	// Berth is berth's API.
	Berth Berth
	// Resync is how often a settled object is reconciled again; 0 means
	// DefaultResync.
	Resync time.Duration
	// NodeLostGrace is how long a deleted object whose sandbox's node is
	// lost (berth answers SANDBOX_UNREACHABLE, cause NODE_LOST or
	// NODE_UNREACHABLE) keeps its finalizer, counted from its
	// deletionTimestamp; after it the object goes and the sandbox stays on
	// that node (it keeps its labels k8s.berth.dev/namespace and name, and
	// berth deletes it at its idle timeout or lifetime, or through its API).
	// 0 means DefaultNodeLostGrace.
	NodeLostGrace time.Duration
}

// SetupWithManager registers the reconciler for Sandbox objects.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).For(&sandboxv1.Sandbox{}).Named("sandbox").Complete(r)
}

// Reconcile brings one Sandbox object and its berth sandbox in step.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var obj sandboxv1.Sandbox
	if err := r.Client.Get(ctx, req.NamespacedName, &obj); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	id := objectSandboxID(&obj)
	logger := log.FromContext(ctx).WithValues("sandbox_id", id)
	if !obj.DeletionTimestamp.IsZero() {
		return r.finalize(ctx, &obj, id)
	}
	// Patches, not updates: a round trip through the Go types would
	// rewrite fields of spec.podTemplate they do not hold.
	base := obj.DeepCopy()
	if controllerutil.AddFinalizer(&obj, sandboxv1.Finalizer) {
		if err := r.Client.Patch(ctx, &obj, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			return ctrl.Result{}, fmt.Errorf("add finalizer %s: %w", sandboxv1.Finalizer, err)
		}
	}
	before := obj.DeepCopy()
	var sb *berthv1.Sandbox
	var result ctrl.Result
	var err error
	expired := obj.Spec.ShutdownTime != nil && !time.Now().Before(obj.Spec.ShutdownTime.Time)
	if expired {
		var gone bool
		if gone, result, err = r.expire(ctx, &obj, id); gone {
			return ctrl.Result{}, nil
		}
	} else {
		sb, result, err = r.sync(ctx, &obj, id)
		if sb != nil {
			r.reflect(&obj, id, sb)
		}
	}
	if !equality.Semantic.DeepEqual(before.Status, obj.Status) {
		if uerr := r.Client.Status().Patch(ctx, &obj, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); uerr != nil {
			return ctrl.Result{}, errors.Join(err, fmt.Errorf("update status: %w", uerr))
		}
	}
	if err != nil {
		logger.Error(err, "reconcile")
		return ctrl.Result{}, err
	}
	if expired {
		return result, nil
	}
	if result.RequeueAfter == 0 {
		result.RequeueAfter = r.resync()
		switch obj.Status.Berth.Phase {
		case sandboxv1.PhaseStarting, sandboxv1.PhaseStopping, sandboxv1.PhasePending:
			result.RequeueAfter = startingPoll
		}
	}
	if t := obj.Spec.ShutdownTime; t != nil {
		// Back at shutdownTime, whatever the resync.
		result.RequeueAfter = min(result.RequeueAfter, max(time.Until(t.Time), 0)+10*time.Millisecond)
	}
	return result, nil
}

// expire acts on an object whose spec.shutdownTime has come, as
// agent-sandbox's Lifecycle says: the sandbox is deleted, then with
// shutdownPolicy Delete the object is too (gone is true), and with Retain
// (the default) the object stays with its live status cleared and Ready
// False, reason SandboxExpired. A sandbox whose node is lost is deleted when
// the node is back: the object waits (Ready False, NodeLost) until then.
func (r *Reconciler) expire(ctx context.Context, obj *sandboxv1.Sandbox, id string) (gone bool, _ ctrl.Result, _ error) {
	if obj.Status.Berth.Phase != sandboxv1.PhaseExpired {
		err := r.Berth.DeleteSandbox(ctx, id)
		switch {
		case err == nil, berth.IsReason(err, berth.ReasonSandboxNotFound):
		case nodeLost(err) != "":
			setCondition(obj, sandboxv1.ConditionReady, metav1.ConditionFalse, nodeLost(err),
				fmt.Sprintf("shutdownTime %s has come; the sandbox is deleted once its node is back: %v", obj.Spec.ShutdownTime.UTC().Format(time.RFC3339), err))
			return false, ctrl.Result{RequeueAfter: min(r.resync(), lostPoll)}, nil
		default:
			return false, ctrl.Result{}, fmt.Errorf("shutdownTime: delete sandbox %s: %w", id, err)
		}
	}
	if obj.Spec.ShutdownPolicy == sandboxv1.ShutdownPolicyDelete {
		if err := r.Client.Delete(ctx, obj, client.Preconditions{UID: &obj.UID}); client.IgnoreNotFound(err) != nil {
			return false, ctrl.Result{}, fmt.Errorf("shutdownPolicy Delete: delete the object: %w", err)
		}
		return true, ctrl.Result{}, nil
	}
	st := &obj.Status
	st.NodeName = ""
	st.Berth.Phase = sandboxv1.PhaseExpired
	st.Berth.AgentBootID = ""
	st.Berth.ObservedGeneration = obj.Generation
	setCondition(obj, sandboxv1.ConditionReady, metav1.ConditionFalse, sandboxv1.ReasonExpired,
		fmt.Sprintf("shutdownTime %s has come: sandbox %s is deleted (shutdownPolicy Retain keeps this object)", obj.Spec.ShutdownTime.UTC().Format(time.RFC3339), id))
	meta.RemoveStatusCondition(&st.Conditions, sandboxv1.ConditionSuspended)
	return false, ctrl.Result{}, nil
}

// nodeLost is the condition reason of berth's answer that the sandbox's
// node is out of the fleet (NodeLost: its lease ended) or does not answer
// (NodeUnreachable: its lease runs); empty for any other error.
func nodeLost(err error) string {
	var e *berth.UnreachableError
	if !errors.As(err, &e) {
		return ""
	}
	switch e.Detail.GetCause() {
	case berthv1.UnreachableCause_UNREACHABLE_CAUSE_NODE_LOST:
		return sandboxv1.ReasonNodeLost
	case berthv1.UnreachableCause_UNREACHABLE_CAUSE_NODE_UNREACHABLE:
		return sandboxv1.ReasonNodeUnreachable
	}
	return ""
}

func (r *Reconciler) resync() time.Duration {
	if r.Resync > 0 {
		return r.Resync
	}
	return DefaultResync
}

// finalize deletes the berth sandbox of an object being deleted, then lets
// the object go. While the sandbox's node is lost it waits for the node, up
// to NodeLostGrace from the deletion.
func (r *Reconciler) finalize(ctx context.Context, obj *sandboxv1.Sandbox, id string) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(obj, sandboxv1.Finalizer) {
		return ctrl.Result{}, nil
	}
	if err := r.Berth.DeleteSandbox(ctx, id); err != nil && !berth.IsReason(err, berth.ReasonSandboxNotFound) {
		lost := nodeLost(err)
		if lost == "" {
			return ctrl.Result{}, fmt.Errorf("delete sandbox %s: %w", id, err)
		}
		grace := r.NodeLostGrace
		if grace <= 0 {
			grace = DefaultNodeLostGrace
		}
		if wait := time.Until(obj.DeletionTimestamp.Add(grace)); wait > 0 {
			// The node may come back and re-adopt the sandbox: wait for it.
			return ctrl.Result{RequeueAfter: min(wait, lostPoll)}, nil
		}
		log.FromContext(ctx).Info("the sandbox's node is still lost after the grace; the object goes, the sandbox stays on the node",
			"sandbox_id", id, "node", obj.Status.NodeName, "grace", grace.String(), "error", err.Error())
	}
	base := obj.DeepCopy()
	controllerutil.RemoveFinalizer(obj, sandboxv1.Finalizer)
	if err := r.Client.Patch(ctx, obj, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		return ctrl.Result{}, fmt.Errorf("remove finalizer %s: %w", sandboxv1.Finalizer, err)
	}
	return ctrl.Result{}, nil
}

// sync creates the berth sandbox when it was never created, and pauses,
// hibernates or resumes it as spec.operatingMode says. It returns berth's
// sandbox when there is one; the conditions of a failure are set on obj.
func (r *Reconciler) sync(ctx context.Context, obj *sandboxv1.Sandbox, id string) (*berthv1.Sandbox, ctrl.Result, error) {
	sb, err := r.Berth.GetSandbox(ctx, id)
	switch {
	case berth.IsReason(err, berth.ReasonSandboxNotFound) && Mirrored(obj):
		// Deleted through berth's API: the object goes too.
		return nil, ctrl.Result{}, r.mirrorGone(ctx, obj)
	case berth.IsReason(err, berth.ReasonSandboxNotFound) && obj.Status.Berth.SandboxID == "":
		creq, rerr := CreateRequest(obj, id)
		if rerr != nil {
			// The object must change before anything can be done.
			setFailed(obj, sandboxv1.ReasonInvalidSpec, rerr.Error())
			return nil, ctrl.Result{}, nil
		}
		if obj.Status.Berth.Phase == "" {
			obj.Status.Berth.Phase = sandboxv1.PhasePending
		}
		sb, err = r.Berth.CreateSandbox(ctx, creq)
		if err != nil {
			setFailed(obj, reasonOf(err), fmt.Sprintf("create sandbox %s: %v", id, err))
			if berth.IsRetryable(err) {
				return nil, ctrl.Result{}, err
			}
			// INVALID_ARGUMENT, IMAGE_NOT_FOUND, SANDBOX_EXISTS...: the
			// object or the fleet must change first; look again later.
			return nil, ctrl.Result{RequeueAfter: r.resync()}, nil
		}
	case berth.IsReason(err, berth.ReasonSandboxNotFound):
		// It was created, and berth no longer holds it.
		obj.Status.Berth.Phase = sandboxv1.PhaseGone
		obj.Status.Berth.AgentBootID = ""
		setCondition(obj, sandboxv1.ConditionReady, metav1.ConditionFalse, sandboxv1.ReasonGone,
			fmt.Sprintf("berth no longer holds sandbox %s (its idle timeout or lifetime ended it, or it was deleted through berth's API); delete this object", id))
		return nil, ctrl.Result{}, nil
	case nodeLost(err) != "":
		// Its node is out of the fleet or does not answer: the sandbox
		// may run on, and is back when the node is (same node id).
		var e *berth.UnreachableError
		errors.As(err, &e)
		if n := e.Detail.GetNodeId(); n != "" {
			obj.Status.NodeName = n
		}
		setCondition(obj, sandboxv1.ConditionReady, metav1.ConditionFalse, nodeLost(err),
			fmt.Sprintf("node %s holding sandbox %s: %v", obj.Status.NodeName, id, err))
		return nil, ctrl.Result{RequeueAfter: min(r.resync(), lostPoll)}, nil
	case err != nil:
		setCondition(obj, sandboxv1.ConditionReady, metav1.ConditionUnknown, reasonOf(err), fmt.Sprintf("get sandbox %s: %v", id, err))
		return nil, ctrl.Result{}, err
	}
	if mirrorFollows(obj) {
		return sb, ctrl.Result{}, nil
	}
	next, err := r.operate(ctx, obj, id, sb)
	if err != nil {
		setCondition(obj, sandboxv1.ConditionReady, readyStatus(sb.GetState()), reasonOf(err), fmt.Sprintf("%s: %v", obj.Spec.OperatingMode, err))
		return sb, ctrl.Result{}, err
	}
	return next, ctrl.Result{}, nil
}

// operate pauses or hibernates a running sandbox of a Suspended object and
// resumes a suspended sandbox of a Running one.
func (r *Reconciler) operate(ctx context.Context, obj *sandboxv1.Sandbox, id string, sb *berthv1.Sandbox) (*berthv1.Sandbox, error) {
	state := sb.GetState()
	switch obj.Spec.OperatingMode {
	case sandboxv1.OperatingModeSuspended:
		hibernate := obj.Spec.Berth.SuspendAction == "Hibernate"
		switch {
		case hibernate && (state == berthv1.SandboxState_SANDBOX_STATE_RUNNING || state == berthv1.SandboxState_SANDBOX_STATE_PAUSED):
			return r.Berth.HibernateSandbox(ctx, id)
		case !hibernate && state == berthv1.SandboxState_SANDBOX_STATE_RUNNING:
			return r.Berth.PauseSandbox(ctx, id)
		}
	default: // Running, or empty from a client that bypassed the default
		if state == berthv1.SandboxState_SANDBOX_STATE_PAUSED || state == berthv1.SandboxState_SANDBOX_STATE_HIBERNATED {
			return r.Berth.ResumeSandbox(ctx, id)
		}
	}
	return sb, nil
}

// reflect writes berth's view of sb into obj's status.
func (r *Reconciler) reflect(obj *sandboxv1.Sandbox, id string, sb *berthv1.Sandbox) {
	st := &obj.Status
	st.NodeName = sb.GetNodeId()
	st.Berth.SandboxID = id
	st.Berth.Phase = phase(sb.GetState())
	st.Berth.AgentBootID = sb.GetRuntime().GetAgentBootId()
	st.Berth.Image = sb.GetImage()
	st.Berth.ObservedGeneration = obj.Generation
	state := sb.GetState()
	switch state {
	case berthv1.SandboxState_SANDBOX_STATE_RUNNING:
		setCondition(obj, sandboxv1.ConditionReady, metav1.ConditionTrue, sandboxv1.ReasonRunning, "the sandbox's agent answers")
	case berthv1.SandboxState_SANDBOX_STATE_PAUSED, berthv1.SandboxState_SANDBOX_STATE_HIBERNATED:
		setCondition(obj, sandboxv1.ConditionReady, metav1.ConditionFalse, sandboxv1.ReasonSuspended, "the sandbox is "+st.Berth.Phase)
	case berthv1.SandboxState_SANDBOX_STATE_STARTING:
		setCondition(obj, sandboxv1.ConditionReady, metav1.ConditionFalse, sandboxv1.ReasonStarting, "the sandbox's agent has not answered yet")
	default:
		setCondition(obj, sandboxv1.ConditionReady, metav1.ConditionFalse, st.Berth.Phase, "the sandbox is "+st.Berth.Phase)
	}
	switch state {
	case berthv1.SandboxState_SANDBOX_STATE_PAUSED:
		setCondition(obj, sandboxv1.ConditionSuspended, metav1.ConditionTrue, sandboxv1.ReasonPaused, "processes frozen, memory kept")
	case berthv1.SandboxState_SANDBOX_STATE_HIBERNATED:
		setCondition(obj, sandboxv1.ConditionSuspended, metav1.ConditionTrue, sandboxv1.ReasonHibernated, "memory released, files kept")
	default:
		setCondition(obj, sandboxv1.ConditionSuspended, metav1.ConditionFalse, sandboxv1.ReasonNotSuspended, "the sandbox is "+st.Berth.Phase)
	}
}

func readyStatus(s berthv1.SandboxState) metav1.ConditionStatus {
	if s == berthv1.SandboxState_SANDBOX_STATE_RUNNING {
		return metav1.ConditionTrue
	}
	return metav1.ConditionFalse
}

func setFailed(obj *sandboxv1.Sandbox, reason, message string) {
	obj.Status.Berth.Phase = sandboxv1.PhaseFailed
	setCondition(obj, sandboxv1.ConditionReady, metav1.ConditionFalse, reason, message)
}

func setCondition(obj *sandboxv1.Sandbox, typ string, status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&obj.Status.Conditions, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: message, ObservedGeneration: obj.Generation,
	})
}

// reasonOf is the condition reason of berth's error: its typed reason
// (IMAGE_NOT_FOUND, FLEET_BUSY...), else its gRPC code's name.
func reasonOf(err error) string {
	var e *berth.Error
	if errors.As(err, &e) {
		if e.Reason != "" {
			return e.Reason
		}
		return e.Code.String()
	}
	return "BerthUnreachable"
}
