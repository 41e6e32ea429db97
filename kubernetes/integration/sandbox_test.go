package integration

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
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
	"k8s.io/apimachinery/pkg/runtime"
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
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	k, cs, admin, scheme := setUpKube(t, ctx, repo)

	node := startBerthd(t, repo, "node-a")
	controllerCfg := runController(t, ctx, k, cs, controller.Options{Berth: node.client})

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

// TestKubernetesNodes: two berthd fleet nodes under berth-controller.
// Sandbox objects are placed on each by spec.berth.labels
// (node.berth.dev/zone), status.nodeName names the node berth records, and
// an Exec through either node runs in each. node-b killed (SIGKILL): its
// objects turn Ready False, reason NodeLost, within the lease time while
// node-a's stay Ready; deleting an object of the lost node waits
// NodeLostGrace for it, then the object goes and the sandbox stays on
// node-b; node-b restarted under its id re-adopts its sandboxes and their
// objects are Ready again, with the same agent. spec.shutdownTime deletes
// the sandbox when it comes: shutdownPolicy Retain keeps the object
// (SandboxExpired), Delete deletes it; a shutdownTime already past at
// create makes no sandbox.
func TestKubernetesNodes(t *testing.T) {
	e2e.NeedRoot(t, "containerd and berthd")
	repo := repoRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	k, cs, admin, _ := setUpKube(t, ctx, repo)

	// Tokens, as the DaemonSet has them: the controller's is an admin's
	// (ops), and the nodes forward calls to each other as berth-node.
	dir := t.TempDir()
	opsToken, nodeToken := randomToken(t), randomToken(t)
	tokens, peerToken := filepath.Join(dir, "tokens"), filepath.Join(dir, "peer-token")
	writeFile(t, tokens, []byte(fmt.Sprintf("%s ops\n%s berth-node\n", tokenHash(opsToken), tokenHash(nodeToken))))
	writeFile(t, peerToken, []byte(nodeToken))
	// A short lease: a killed node is lost within 3 s.
	const leaseTTL = 3 * time.Second
	fleet := []string{"--token-file", tokens, "--admin", "ops", "--node-principal", "berth-node", "--peer-token-file", peerToken,
		"--lease-ttl", leaseTTL.String()}
	a := startBerthd(t, repo, "node-a", append(fleet, "--node-label", "zone=a")...)
	b := startBerthd(t, repo, "node-b", append(fleet, "--node-label", "zone=b", "--etcd-endpoints", a.etcdURL)...)
	waitFor(t, time.Minute, "node-a and node-b ready in the fleet", func() (bool, string) {
		return slices.Equal(readyNodes(ctx, a.client), []string{"node-a", "node-b"}), fmt.Sprint(readyNodes(ctx, a.client))
	})
	// ops through each node's TCP address: the controller's berth, and
	// the test's.
	ops := map[*berthd]*berth.Client{}
	for _, n := range []*berthd{a, b} {
		c, err := berth.Dial(ctx, n.tcp, berth.WithInsecure(), berth.WithToken(opsToken))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		ops[n] = c
	}
	runController(t, ctx, k, cs, controller.Options{Berth: ops[a]})

	// Placed by node labels: one object on node-a, two on node-b.
	place := map[string]string{"on-a": "a", "on-b": "b", "on-b-deleted": "b"}
	objs := map[string]*sandboxv1.Sandbox{}
	for _, name := range []string{"on-a", "on-b", "on-b-deleted"} {
		o := &sandboxv1.Sandbox{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: sandboxv1.SandboxSpec{Berth: sandboxv1.BerthSpec{
				Image:  baseImage,
				Env:    map[string]string{"OBJECT": name},
				Labels: map[string]string{"node.berth.dev/zone": place[name]},
			}},
		}
		if err := admin.Create(ctx, o); err != nil {
			t.Fatalf("create Sandbox %s: %v", name, err)
		}
		objs[name] = o
	}
	idOf := func(name string) string {
		o := objs[name]
		return controller.SandboxID(o.Namespace, o.Name, string(o.UID))
	}
	get := func(name string) (*sandboxv1.Sandbox, error) {
		var got sandboxv1.Sandbox
		err := admin.Get(ctx, client.ObjectKeyFromObject(objs[name]), &got)
		return &got, err
	}
	waitReady := func(what string, names ...string) map[string]*sandboxv1.Sandbox {
		t.Helper()
		out := map[string]*sandboxv1.Sandbox{}
		waitFor(t, 3*time.Minute, what, func() (bool, string) {
			for _, name := range names {
				got, err := get(name)
				if err != nil {
					return false, fmt.Sprintf("%s: %v", name, err)
				}
				if !meta.IsStatusConditionTrue(got.Status.Conditions, sandboxv1.ConditionReady) {
					return false, fmt.Sprintf("%s: %+v", name, got.Status)
				}
				out[name] = got
			}
			return true, ""
		})
		return out
	}
	ready := waitReady("the three Sandboxes Ready", "on-a", "on-b", "on-b-deleted")
	boot := map[string]string{}
	for name, got := range ready {
		want := "node-" + place[name]
		sb, err := ops[a].GetSandbox(ctx, idOf(name))
		if err != nil {
			t.Fatalf("berth GetSandbox(%s): %v", idOf(name), err)
		}
		if got.Status.NodeName != want || sb.GetNodeId() != want {
			t.Errorf("%s: status.nodeName %q, berth's node_id %q, want %s (spec.berth.labels node.berth.dev/zone=%s)",
				name, got.Status.NodeName, sb.GetNodeId(), want, place[name])
		}
		boot[name] = sb.GetRuntime().GetAgentBootId()
		if boot[name] == "" || got.Status.Berth.AgentBootID != boot[name] {
			t.Errorf("%s: status.berth.agentBootID %q, berth says %q", name, got.Status.Berth.AgentBootID, boot[name])
		}
		// An Exec through either node runs in the sandbox, wherever it is.
		for _, via := range []*berthd{a, b} {
			res, err := ops[via].Run(ctx, idOf(name), &berthv1.ProcessSpec{Argv: []string{"sh", "-c", "echo $OBJECT"}})
			if err != nil {
				t.Fatalf("Run in %s through %s: %v", name, via.nodeID, err)
			}
			if out := strings.TrimSpace(string(res.GetStdout())); out != name || res.GetResult().GetExitCode() != 0 {
				t.Errorf("Run in %s through %s: stdout %q exit %d, want %s 0", name, via.nodeID, out, res.GetResult().GetExitCode(), name)
			}
		}
	}

	// node-b killed: its objects say NodeLost within the lease time (plus
	// the controller's resync of 2 s); node-a's stays Ready.
	b.kill(t)
	killed := time.Now()
	waitFor(t, 2*time.Minute, "node-b's Sandboxes NodeLost", func() (bool, string) {
		var why []string
		for _, name := range []string{"on-b", "on-b-deleted"} {
			got, err := get(name)
			if err != nil {
				return false, err.Error()
			}
			c := meta.FindStatusCondition(got.Status.Conditions, sandboxv1.ConditionReady)
			if c == nil || c.Status != metav1.ConditionFalse || c.Reason != sandboxv1.ReasonNodeLost || got.Status.NodeName != "node-b" {
				why = append(why, fmt.Sprintf("%s: nodeName %q Ready %+v", name, got.Status.NodeName, c))
			}
		}
		return len(why) == 0, strings.Join(why, "; ")
	})
	t.Logf("node-b's Sandboxes NodeLost %s after the kill (lease %s, resync 2s)", time.Since(killed).Round(100*time.Millisecond), leaseTTL)
	if got, err := get("on-a"); err != nil || !meta.IsStatusConditionTrue(got.Status.Conditions, sandboxv1.ConditionReady) ||
		got.Status.NodeName != "node-a" || got.Status.Berth.AgentBootID != boot["on-a"] {
		t.Errorf("on-a while node-b is lost: %v %+v, want Ready on node-a with agent %s", err, got.Status, boot["on-a"])
	}

	// Deleting an object of the lost node: berth's fleet deletes a lost
	// node's sandbox at once (its record goes, a tombstone stays for the
	// node), so the finalizer does not wait for the node.
	if err := admin.Delete(ctx, objs["on-b-deleted"]); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	waitFor(t, 2*time.Minute, "on-b-deleted goes while node-b is lost", func() (bool, string) {
		_, err := get("on-b-deleted")
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	t.Logf("on-b-deleted went %s after its delete, node-b lost", time.Since(deleted).Round(100*time.Millisecond))
	if _, err := ops[a].GetSandbox(ctx, idOf("on-b-deleted")); !berth.IsReason(err, berth.ReasonSandboxNotFound) {
		t.Errorf("berth GetSandbox(on-b-deleted) after its object went: %v, want SANDBOX_NOT_FOUND", err)
	}

	// node-b back under its id: it re-adopts its sandboxes (the same
	// agents), on-b is Ready again; on-b-deleted's sandbox, still running
	// there, is deleted by node-b itself at its registration (the
	// tombstone), as node-b's own socket shows.
	b.restart(t)
	waitReady("on-b Ready again after node-b's restart", "on-b")
	if got, _ := get("on-b"); got.Status.NodeName != "node-b" || got.Status.Berth.AgentBootID != boot["on-b"] {
		t.Errorf("on-b after node-b's restart: %+v, want node-b, agent %s (re-adopted)", got.Status, boot["on-b"])
	}
	waitFor(t, time.Minute, "node-b deletes on-b-deleted's sandbox", func() (bool, string) {
		_, err := b.client.GetSandbox(ctx, idOf("on-b-deleted"))
		return berth.IsReason(err, berth.ReasonSandboxNotFound), fmt.Sprintf("node-b's GetSandbox: %v", err)
	})

	// spec.shutdownTime: Retain (the default) keeps the object; Delete
	// deletes it. Both sandboxes are deleted when it comes.
	// RFC 3339 as sent has whole seconds: soon is what the object holds.
	soon := metav1.NewTime(time.Now().Add(2 * time.Second).Truncate(time.Second))
	patchSpec(t, ctx, admin, objs["on-a"], fmt.Sprintf(`{"spec":{"shutdownTime":%q}}`, soon.Format(time.RFC3339)))
	patchSpec(t, ctx, admin, objs["on-b"], fmt.Sprintf(`{"spec":{"shutdownTime":%q,"shutdownPolicy":"Delete"}}`, soon.Format(time.RFC3339)))
	waitFor(t, 2*time.Minute, "shutdownTime: on-a Expired, on-b deleted, both sandboxes gone", func() (bool, string) {
		var why []string
		got, err := get("on-a")
		c := meta.FindStatusCondition(got.Status.Conditions, sandboxv1.ConditionReady)
		if err != nil || got.Status.Berth.Phase != sandboxv1.PhaseExpired || got.Status.NodeName != "" ||
			c == nil || c.Status != metav1.ConditionFalse || c.Reason != sandboxv1.ReasonExpired {
			why = append(why, fmt.Sprintf("on-a: %v %+v", err, got.Status))
		}
		if _, err := get("on-b"); !apierrors.IsNotFound(err) {
			why = append(why, fmt.Sprintf("on-b: %v", err))
		}
		for _, name := range []string{"on-a", "on-b"} {
			if _, err := ops[a].GetSandbox(ctx, idOf(name)); !berth.IsReason(err, berth.ReasonSandboxNotFound) {
				why = append(why, fmt.Sprintf("berth GetSandbox(%s): %v", name, err))
			}
		}
		return len(why) == 0, strings.Join(why, "; ")
	})
	if time.Now().Before(soon.Time) {
		t.Errorf("the sandboxes went before their shutdownTime %s", soon)
	}

	// A shutdownTime already past at create: no sandbox, the object says
	// SandboxExpired.
	past := &sandboxv1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Name: "expired-at-birth", Namespace: "default"},
		Spec: sandboxv1.SandboxSpec{
			ShutdownTime: &metav1.Time{Time: time.Now().Add(-time.Minute)},
			Berth:        sandboxv1.BerthSpec{Image: baseImage},
		},
	}
	if err := admin.Create(ctx, past); err != nil {
		t.Fatal(err)
	}
	objs[past.Name] = past
	waitFor(t, time.Minute, "expired-at-birth Expired", func() (bool, string) {
		got, err := get(past.Name)
		if err != nil {
			return false, err.Error()
		}
		return got.Status.Berth.Phase == sandboxv1.PhaseExpired && meta.IsStatusConditionFalse(got.Status.Conditions, sandboxv1.ConditionReady), fmt.Sprintf("%+v", got.Status)
	})
	if _, err := ops[a].GetSandbox(ctx, idOf(past.Name)); !berth.IsReason(err, berth.ReasonSandboxNotFound) {
		t.Errorf("berth GetSandbox(%s) of an object expired at create: %v, want SANDBOX_NOT_FOUND", idOf(past.Name), err)
	}
}

// readyNodes is the ids of the fleet's READY nodes, as c lists them.
func readyNodes(ctx context.Context, c *berth.Client) []string {
	nodes, err := c.ListNodes(ctx)
	if err != nil {
		return []string{err.Error()}
	}
	var ids []string
	for _, n := range nodes {
		if n.GetState() == berthv1.NodeState_NODE_STATE_READY {
			ids = append(ids, n.GetId())
		}
	}
	slices.Sort(ids)
	return ids
}

func randomToken(t *testing.T) string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// tokenHash is token's line in a --token-file, as docs/security.md gives
// it: sha256: and the hex of SHA-256(token). (server/auth's TokenHash would
// bring berthd's dependencies into this module.)
func tokenHash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return "sha256:" + hex.EncodeToString(sum[:])
}

func patchSpec(t *testing.T, ctx context.Context, c client.Client, obj *sandboxv1.Sandbox, patch string) {
	t.Helper()
	o := &sandboxv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: obj.Name, Namespace: obj.Namespace}}
	if err := c.Patch(ctx, o, client.RawPatch("application/merge-patch+json", []byte(patch))); err != nil {
		t.Fatalf("patch %s with %s: %v", obj.Name, patch, err)
	}
}

// setUpKube starts kube-apiserver, applies deploy/kubernetes's manifests
// with server-side apply (checking that the objects the tests rely on are
// among them), and waits until the Sandbox CRD serves. It returns the
// cluster, clients as its admin, and the controller's scheme.
func setUpKube(t *testing.T, ctx context.Context, repo string) (*kube, kubernetes.Interface, client.Client, *runtime.Scheme) {
	t.Helper()
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
	cs := kubernetes.NewForConfigOrDie(k.admin)
	scheme, err := controller.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	admin, err := client.New(k.admin, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	// A CRD serves once it is Established: list until each answers.
	waitFor(t, time.Minute, "the CRDs serve", func() (bool, string) {
		err := admin.List(ctx, &sandboxv1.SandboxList{}, client.InNamespace("default"))
		if err == nil {
			err = admin.List(ctx, &extv1alpha1.SandboxClaimList{})
		}
		if err == nil {
			err = admin.List(ctx, &extv1alpha1.SandboxTemplateList{})
		}
		return err == nil, fmt.Sprint(err)
	})
	return k, cs, admin, scheme
}

// runController runs berth-controller (controller.Run with opts, a resync
// of 2 s unless opts says) as the manifest's ServiceAccount: its token from
// the TokenRequest API, its rights only what the ClusterRole grants. It
// returns that ServiceAccount's config; Cleanup stops the controller.
func runController(t *testing.T, ctx context.Context, k *kube, cs kubernetes.Interface, opts controller.Options) *rest.Config {
	t.Helper()
	cfg := saConfig(t, ctx, cs, k.admin, "berth-system", "berth-controller")
	opts.Config = cfg
	opts.Log = zap.New(zap.UseDevMode(true), zap.WriteTo(testWriter{t}))
	opts.MetricsAddr = "0"
	opts.SeveralPerProcess = true // the tests of this package run several in one process
	if opts.Resync == 0 {
		opts.Resync = 2 * time.Second
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- controller.Run(runCtx, opts) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("controller.Run: %v", err)
		}
	})
	return cfg
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
