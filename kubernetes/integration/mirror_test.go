package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berth "github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/e2e"
	extv1alpha1 "github.com/berth-sandbox/berth/kubernetes/api/extensions/v1alpha1"
	sandboxv1 "github.com/berth-sandbox/berth/kubernetes/api/v1beta1"
	"github.com/berth-sandbox/berth/kubernetes/controller"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// mirrorNamespace is the manifest's --mirror-namespace.
const mirrorNamespace = "berth-sandboxes"

// TestKubernetesMirror: berth-controller, as the manifest's ServiceAccount,
// against a real kube-apiserver and a real berthd node.
//   - A SandboxClaim naming a SandboxTemplate becomes a Sandbox object owned
//     by the claim with the template's spec and the claim's env, a running
//     sandbox in which a Run sees both; the claim's status names it and is
//     Ready. A claim naming no template says TemplateNotFound.
//   - A sandbox created with berth's Go client gets a Sandbox object in
//     berth-sandboxes, named by its id, labelled as berth's API's, its
//     owner recorded, its node and phase reflected; the claim's sandbox
//     (made from an object) gets none. Deleting a sandbox through berth
//     deletes its object; deleting the object deletes the sandbox.
func TestKubernetesMirror(t *testing.T) {
	e2e.NeedRoot(t, "containerd and berthd")
	repo := repoRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	k, cs, admin, _ := setUpKube(t, ctx, repo)
	node := startBerthd(t, repo, "node-a")
	runController(t, ctx, k, cs, controller.Options{Berth: node.client, MirrorNamespace: mirrorNamespace, MirrorInterval: time.Second})

	// A claim from a template: a Sandbox object owned by the claim, a
	// running sandbox with the template's and the claim's env.
	tmpl := &extv1alpha1.SandboxTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "small", Namespace: "default"},
		Spec: extv1alpha1.SandboxTemplateSpec{Berth: sandboxv1.BerthSpec{
			Image: baseImage, Env: map[string]string{"FROM_TEMPLATE": "template-env", "BOTH": "template"},
			Resources: &sandboxv1.Resources{MemoryBytes: 192 << 20},
		}},
	}
	if err := admin.Create(ctx, tmpl); err != nil {
		t.Fatalf("create SandboxTemplate: %v", err)
	}
	claim := &extv1alpha1.SandboxClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "claim-1", Namespace: "default"},
		Spec: extv1alpha1.SandboxClaimSpec{
			TemplateRef: extv1alpha1.SandboxTemplateRef{Name: "small"},
			Env:         []extv1alpha1.EnvVar{{Name: "FROM_CLAIM", Value: "claim-env"}, {Name: "BOTH", Value: "claim"}},
		},
	}
	if err := admin.Create(ctx, claim); err != nil {
		t.Fatalf("create SandboxClaim: %v", err)
	}
	orphan := &extv1alpha1.SandboxClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "claim-orphan", Namespace: "default"},
		Spec:       extv1alpha1.SandboxClaimSpec{TemplateRef: extv1alpha1.SandboxTemplateRef{Name: "no-such-template"}},
	}
	if err := admin.Create(ctx, orphan); err != nil {
		t.Fatalf("create SandboxClaim: %v", err)
	}
	var gotClaim extv1alpha1.SandboxClaim
	waitFor(t, 3*time.Minute, "the claim is Ready", func() (bool, string) {
		if err := admin.Get(ctx, client.ObjectKeyFromObject(claim), &gotClaim); err != nil {
			return false, err.Error()
		}
		return meta.IsStatusConditionTrue(gotClaim.Status.Conditions, sandboxv1.ConditionReady), fmt.Sprintf("%+v", gotClaim.Status)
	})
	if gotClaim.Status.Sandbox.Name != "claim-1" {
		t.Errorf("claim status.sandbox.name = %q, want claim-1", gotClaim.Status.Sandbox.Name)
	}
	var claimed sandboxv1.Sandbox
	if err := admin.Get(ctx, client.ObjectKey{Namespace: "default", Name: gotClaim.Status.Sandbox.Name}, &claimed); err != nil {
		t.Fatalf("the claim's Sandbox: %v", err)
	}
	if ref := metav1.GetControllerOf(&claimed); ref == nil || ref.UID != gotClaim.UID || ref.Kind != "SandboxClaim" {
		t.Errorf("the claim's Sandbox is controlled by %+v, want the claim %s", ref, gotClaim.UID)
	}
	if claimed.Status.Berth.Phase != sandboxv1.PhaseRunning || claimed.Status.NodeName != node.nodeID {
		t.Errorf("the claim's Sandbox status %+v, want Running on %s", claimed.Status, node.nodeID)
	}
	claimedID := claimed.Status.Berth.SandboxID
	res, err := node.client.Run(ctx, claimedID, &berthv1.ProcessSpec{Argv: []string{"sh", "-c", "echo $FROM_TEMPLATE $FROM_CLAIM $BOTH"}})
	if err != nil {
		t.Fatalf("Run in the claim's sandbox %s: %v", claimedID, err)
	}
	if out := strings.TrimSpace(string(res.GetStdout())); out != "template-env claim-env claim" || res.GetResult().GetExitCode() != 0 {
		t.Errorf("Run: stdout %q exit %d, want the template's and the claim's env, the claim's winning (stderr %q)", out, res.GetResult().GetExitCode(), res.GetStderr())
	}
	if sb, err := node.client.GetSandbox(ctx, claimedID); err != nil || sb.GetResources().GetMemoryBytes() != 192<<20 {
		t.Errorf("the claim's sandbox: memory %d, %v; want the template's %d", sb.GetResources().GetMemoryBytes(), err, 192<<20)
	}
	waitFor(t, time.Minute, "the orphan claim says TemplateNotFound", func() (bool, string) {
		if err := admin.Get(ctx, client.ObjectKeyFromObject(orphan), &gotClaim); err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(gotClaim.Status.Conditions, sandboxv1.ConditionReady)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == extv1alpha1.ReasonTemplateNotFound && strings.Contains(c.Message, "no-such-template"),
			fmt.Sprintf("%+v", gotClaim.Status)
	})

	// Sandboxes created through berth's API become objects.
	mirrorOf := func(id string) *sandboxv1.Sandbox {
		t.Helper()
		var got sandboxv1.Sandbox
		waitFor(t, time.Minute, "the Sandbox object of "+id, func() (bool, string) {
			err := admin.Get(ctx, client.ObjectKey{Namespace: mirrorNamespace, Name: id}, &got)
			if err != nil {
				return false, err.Error()
			}
			return got.Status.Berth.Phase == sandboxv1.PhaseRunning && meta.IsStatusConditionTrue(got.Status.Conditions, sandboxv1.ConditionReady),
				fmt.Sprintf("%+v", got.Status)
		})
		return &got
	}
	first, err := node.client.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: baseImage, Labels: map[string]string{"team": "a"}})
	if err != nil {
		t.Fatalf("berth CreateSandbox: %v", err)
	}
	obj := mirrorOf(first.GetId())
	if obj.Labels[controller.LabelOrigin] != controller.OriginAPI {
		t.Errorf("labels %v: no %s=%s", obj.Labels, controller.LabelOrigin, controller.OriginAPI)
	}
	if owner := obj.Annotations[controller.AnnotationOwner]; owner == "" || owner != first.GetOwner() {
		t.Errorf("annotation %s = %q, berth's owner %q", controller.AnnotationOwner, owner, first.GetOwner())
	}
	if obj.Status.NodeName != node.nodeID || obj.Status.Berth.SandboxID != first.GetId() || obj.Status.Berth.Image != baseImage {
		t.Errorf("status %+v, want sandbox %s of %s on %s", obj.Status, first.GetId(), baseImage, node.nodeID)
	}
	if obj.Spec.Berth.Image != baseImage || obj.Spec.Berth.Labels["team"] != "a" || !slices.Contains(obj.Finalizers, sandboxv1.Finalizer) {
		t.Errorf("spec.berth %+v finalizers %v: want berth's image and labels, and %s", obj.Spec.Berth, obj.Finalizers, sandboxv1.Finalizer)
	}
	// A second one after the claim's sandbox was running: the pass that
	// mirrored it saw the claim's sandbox too, and made no object of it.
	second, err := node.client.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: baseImage})
	if err != nil {
		t.Fatalf("berth CreateSandbox: %v", err)
	}
	mirrorOf(second.GetId())
	var all sandboxv1.SandboxList
	if err := admin.List(ctx, &all); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, o := range all.Items {
		names = append(names, o.Namespace+"/"+o.Name)
	}
	slices.Sort(names)
	want := []string{mirrorNamespace + "/" + first.GetId(), mirrorNamespace + "/" + second.GetId(), "default/claim-1"}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("Sandbox objects %v, want %v: one per sandbox", names, want)
	}

	// Deleted through berth: the object goes.
	if err := node.client.DeleteSandbox(ctx, first.GetId()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the object of a sandbox deleted through berth goes", func() (bool, string) {
		err := admin.Get(ctx, client.ObjectKey{Namespace: mirrorNamespace, Name: first.GetId()}, &sandboxv1.Sandbox{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	// A pause through berth's API stands: the object says Paused (a
	// reconcile that resumed it would reflect Running instead), and berth
	// still holds it paused. A spec change through Kubernetes acts.
	secondKey := client.ObjectKey{Namespace: mirrorNamespace, Name: second.GetId()}
	if _, err := node.client.PauseSandbox(ctx, second.GetId()); err != nil {
		t.Fatalf("berth PauseSandbox: %v", err)
	}
	var got sandboxv1.Sandbox
	waitFor(t, time.Minute, "the object of a sandbox paused through berth says Paused", func() (bool, string) {
		if err := admin.Get(ctx, secondKey, &got); err != nil {
			return false, err.Error()
		}
		return got.Status.Berth.Phase == sandboxv1.PhasePaused && meta.IsStatusConditionTrue(got.Status.Conditions, sandboxv1.ConditionSuspended),
			fmt.Sprintf("%+v", got.Status)
	})
	if sb, err := node.client.GetSandbox(ctx, second.GetId()); err != nil || sb.GetState() != berthv1.SandboxState_SANDBOX_STATE_PAUSED {
		t.Errorf("berth: %v, %v; want the sandbox still paused", sb.GetState(), err)
	}
	setMode(t, ctx, admin, secondKey, sandboxv1.OperatingModeSuspended)
	setMode(t, ctx, admin, secondKey, sandboxv1.OperatingModeRunning)
	waitFor(t, time.Minute, "operatingMode Running set through Kubernetes resumes it", func() (bool, string) {
		sb, err := node.client.GetSandbox(ctx, second.GetId())
		return err == nil && sb.GetState() == berthv1.SandboxState_SANDBOX_STATE_RUNNING, fmt.Sprintf("%v %v", sb.GetState(), err)
	})

	// The object deleted: the sandbox goes, then the object.
	if err := admin.Delete(ctx, &sandboxv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: mirrorNamespace, Name: second.GetId()}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the sandbox of a deleted object goes", func() (bool, string) {
		err := admin.Get(ctx, client.ObjectKey{Namespace: mirrorNamespace, Name: second.GetId()}, &sandboxv1.Sandbox{})
		if !apierrors.IsNotFound(err) {
			return false, fmt.Sprintf("object: %v", err)
		}
		_, err = node.client.GetSandbox(ctx, second.GetId())
		return berth.IsReason(err, berth.ReasonSandboxNotFound), fmt.Sprintf("berth GetSandbox: %v", err)
	})
	// The claim's sandbox is untouched by all that.
	if sb, err := node.client.GetSandbox(ctx, claimedID); err != nil || sb.GetState() != berthv1.SandboxState_SANDBOX_STATE_RUNNING {
		t.Errorf("the claim's sandbox: %v, %v; want it running", sb.GetState(), err)
	}
}
