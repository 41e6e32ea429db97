package integration

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	berth "github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/e2e"
	extv1alpha1 "github.com/berth-sandbox/berth/kubernetes/api/extensions/v1alpha1"
	sandboxv1 "github.com/berth-sandbox/berth/kubernetes/api/v1beta1"
	"github.com/berth-sandbox/berth/kubernetes/controller"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestKubernetesSandbox: deploy/kubernetes applied to a real kube-apiserver
// (server-side apply); berth-controller runs as its ServiceAccount with the
// manifest's ClusterRole against a real berthd node; a Sandbox object made
// with client-go becomes a running berth sandbox whose status names the
// node and the agent's boot id, and an Exec through berth's API runs in
// it; Suspended pauses it and Running resumes it; deleting the object
// deletes the sandbox; a ServiceAccount without rights cannot create
// Sandbox objects, nor the controller's SandboxTemplates.
func TestKubernetesSandbox(t *testing.T) {
	e2e.NeedRoot(t, "containerd and berthd")
	repo := repoRoot(t)
	k := startKube(t, repo)
	deploy := filepath.Join(repo, "deploy", "kubernetes")
	applied := k.apply(t,
		filepath.Join(deploy, "sandbox-crd.yaml"),
		filepath.Join(deploy, "sandboxtemplate-crd.yaml"),
		filepath.Join(deploy, "sandboxclaim-crd.yaml"),
		filepath.Join(deploy, "berth-controller.yaml"),
		filepath.Join(deploy, "berthd-daemonset.yaml"))
	kinds := map[string]bool{}
	for _, o := range applied {
		kinds[o.GetKind()+"/"+o.GetName()] = true
	}
	for _, want := range []string{"CustomResourceDefinition/sandboxes.agents.x-k8s.io", "ClusterRole/berth-controller",
		"ClusterRoleBinding/berth-controller", "ServiceAccount/berth-controller", "Deployment/berth-controller", "DaemonSet/berthd"} {
		if !kinds[want] {
			t.Errorf("applied %v: no %s", kinds, want)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cs := kubernetes.NewForConfigOrDie(k.admin)
	scheme, err := controller.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	admin, err := client.New(k.admin, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	// The CRD serves once it is Established: list until it answers.
	waitFor(t, time.Minute, "the Sandbox CRD serves", func() (bool, string) {
		err := admin.List(ctx, &sandboxv1.SandboxList{}, client.InNamespace("default"))
		return err == nil, fmt.Sprint(err)
	})

	node := startBerthd(t, repo, "node-a")

	// The controller as the manifest's ServiceAccount: its token from the
	// TokenRequest API, its rights only what the ClusterRole grants.
	controllerCfg := saConfig(t, ctx, cs, k.admin, "berth-system", "berth-controller")
	runCtx, stopController := context.WithCancel(ctx)
	controllerDone := make(chan error, 1)
	go func() {
		controllerDone <- controller.Run(runCtx, controller.Options{
			Config: controllerCfg, Berth: node.client, Log: zap.New(zap.UseDevMode(true), zap.WriteTo(testWriter{t})),
			MetricsAddr: "0", Resync: 2 * time.Second,
		})
	}()
	t.Cleanup(func() {
		stopController()
		if err := <-controllerDone; err != nil {
			t.Errorf("controller.Run: %v", err)
		}
	})

	obj := &sandboxv1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Name: "agent-1", Namespace: "default"},
		Spec: sandboxv1.SandboxSpec{
			OperatingMode: sandboxv1.OperatingModeRunning,
			Berth: sandboxv1.BerthSpec{
				Image: baseImage,
				Env:   map[string]string{"GREETING": "hello-from-kubernetes"},
				Resources: &sandboxv1.Resources{
					MemoryBytes: 256 << 20,
				},
			},
		},
	}
	if err := admin.Create(ctx, obj); err != nil {
		t.Fatalf("create Sandbox: %v", err)
	}
	id := controller.SandboxID(obj.Namespace, obj.Name, string(obj.UID))
	key := client.ObjectKeyFromObject(obj)
	var got sandboxv1.Sandbox
	waitFor(t, 3*time.Minute, "Sandbox Ready", func() (bool, string) {
		if err := admin.Get(ctx, key, &got); err != nil {
			return false, err.Error()
		}
		return meta.IsStatusConditionTrue(got.Status.Conditions, sandboxv1.ConditionReady), fmt.Sprintf("%+v", got.Status)
	})
	if got.Status.NodeName != node.nodeID {
		t.Errorf("status.nodeName = %q, want the berthd node %q", got.Status.NodeName, node.nodeID)
	}
	if got.Status.Berth.SandboxID != id || got.Status.Berth.Phase != sandboxv1.PhaseRunning || got.Status.Berth.Image != baseImage {
		t.Errorf("status.berth = %+v, want sandbox %s Running from %s", got.Status.Berth, id, baseImage)
	}
	if !slices.Contains(got.Finalizers, sandboxv1.Finalizer) {
		t.Errorf("finalizers %v: no %s", got.Finalizers, sandboxv1.Finalizer)
	}
	sb, err := node.client.GetSandbox(ctx, id)
	if err != nil {
		t.Fatalf("berth GetSandbox(%s): %v", id, err)
	}
	if boot := sb.GetRuntime().GetAgentBootId(); boot == "" || got.Status.Berth.AgentBootID != boot {
		t.Errorf("status.berth.agentBootID = %q, berth says %q", got.Status.Berth.AgentBootID, boot)
	}
	if sb.GetLabels()[controller.LabelNamespace] != "default" || sb.GetLabels()[controller.LabelName] != "agent-1" {
		t.Errorf("berth labels %v do not name the object", sb.GetLabels())
	}
	if mem := sb.GetResources().GetMemoryBytes(); mem != 256<<20 {
		t.Errorf("berth memory_bytes = %d, want spec.berth.resources.memoryBytes %d", mem, 256<<20)
	}
	res, err := node.client.Run(ctx, id, &berthv1.ProcessSpec{Argv: []string{"sh", "-c", "echo $GREETING"}})
	if err != nil {
		t.Fatalf("Run in the sandbox: %v", err)
	}
	if out := strings.TrimSpace(string(res.GetStdout())); out != "hello-from-kubernetes" || res.GetResult().GetExitCode() != 0 {
		t.Fatalf("Run: stdout %q exit %d, want hello-from-kubernetes 0 (stderr %q)", out, res.GetResult().GetExitCode(), res.GetStderr())
	}

	// Suspended pauses it; Running resumes it.
	setMode(t, ctx, admin, key, sandboxv1.OperatingModeSuspended)
	waitFor(t, 2*time.Minute, "Suspended pauses", func() (bool, string) {
		sb, err := node.client.GetSandbox(ctx, id)
		if err != nil {
			return false, err.Error()
		}
		if err := admin.Get(ctx, key, &got); err != nil {
			return false, err.Error()
		}
		return sb.GetState() == berthv1.SandboxState_SANDBOX_STATE_PAUSED && got.Status.Berth.Phase == sandboxv1.PhasePaused &&
				meta.IsStatusConditionTrue(got.Status.Conditions, sandboxv1.ConditionSuspended) &&
				meta.IsStatusConditionFalse(got.Status.Conditions, sandboxv1.ConditionReady),
			fmt.Sprintf("berth %s, status %+v", sb.GetState(), got.Status)
	})
	setMode(t, ctx, admin, key, sandboxv1.OperatingModeRunning)
	waitFor(t, 2*time.Minute, "Running resumes", func() (bool, string) {
		sb, err := node.client.GetSandbox(ctx, id)
		if err != nil {
			return false, err.Error()
		}
		if err := admin.Get(ctx, key, &got); err != nil {
			return false, err.Error()
		}
		return sb.GetState() == berthv1.SandboxState_SANDBOX_STATE_RUNNING && got.Status.Berth.Phase == sandboxv1.PhaseRunning &&
				meta.IsStatusConditionTrue(got.Status.Conditions, sandboxv1.ConditionReady),
			fmt.Sprintf("berth %s, status %+v", sb.GetState(), got.Status)
	})

	// RBAC: a ServiceAccount without rights cannot create Sandbox objects
	// (the API server's RBAC authorizer says so), while the controller's
	// can read them.
	if _, err := cs.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "nobody"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	nobody, err := client.New(saConfig(t, ctx, cs, k.admin, "default", "nobody"), client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	denied := &sandboxv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: "denied", Namespace: "default"}, Spec: sandboxv1.SandboxSpec{Berth: sandboxv1.BerthSpec{Image: baseImage}}}
	if err := nobody.Create(ctx, denied); !apierrors.IsForbidden(err) {
		t.Errorf("create Sandbox as default/nobody: %v, want Forbidden", err)
	}
	controllerClient, err := client.New(controllerCfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := controllerClient.List(ctx, &sandboxv1.SandboxList{}); err != nil {
		t.Errorf("list Sandboxes as berth-system/berth-controller: %v", err)
	}
	tmpl := &extv1alpha1.SandboxTemplate{ObjectMeta: metav1.ObjectMeta{Name: "denied", Namespace: "default"}, Spec: extv1alpha1.SandboxTemplateSpec{Berth: sandboxv1.BerthSpec{Image: baseImage}}}
	if err := controllerClient.Create(ctx, tmpl); !apierrors.IsForbidden(err) {
		t.Errorf("create SandboxTemplate as berth-system/berth-controller: %v, want Forbidden (its ClusterRole reads templates only)", err)
	}

	// Deleting the object deletes the sandbox, then the object goes.
	if err := admin.Delete(ctx, obj); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "the object and the sandbox are gone", func() (bool, string) {
		err := admin.Get(ctx, key, &got)
		if !apierrors.IsNotFound(err) {
			return false, fmt.Sprintf("object: %v", err)
		}
		_, err = node.client.GetSandbox(ctx, id)
		return berth.IsReason(err, berth.ReasonSandboxNotFound), fmt.Sprintf("berth GetSandbox: %v", err)
	})
}

// saConfig is cfg as the ServiceAccount namespace/name, with a token from
// the TokenRequest API.
func saConfig(t *testing.T, ctx context.Context, cs kubernetes.Interface, cfg *rest.Config, namespace, name string) *rest.Config {
	t.Helper()
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(3600))},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token of %s/%s: %v", namespace, name, err)
	}
	out := rest.AnonymousClientConfig(cfg)
	out.BearerToken = tr.Status.Token
	return out
}

func setMode(t *testing.T, ctx context.Context, c client.Client, key client.ObjectKey, mode sandboxv1.OperatingMode) {
	t.Helper()
	patch := []byte(fmt.Sprintf(`{"spec":{"operatingMode":%q}}`, mode))
	obj := &sandboxv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace}}
	if err := c.Patch(ctx, obj, client.RawPatch("application/merge-patch+json", patch)); err != nil {
		t.Fatalf("set operatingMode %s: %v", mode, err)
	}
}

func ptr[T any](v T) *T { return &v }

// testWriter sends the controller's log to the test's.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
