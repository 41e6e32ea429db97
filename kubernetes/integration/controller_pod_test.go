package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-sandbox/berth/internal/e2e"
	"github.com/berth-sandbox/berth/internal/testcerts"
	sandboxv1 "github.com/berth-sandbox/berth/kubernetes/api/v1beta1"
	"github.com/berth-sandbox/berth/kubernetes/controller"
)

// TestKubernetesControllerPod runs berth-controller as
// deploy/kubernetes/berth-controller.yaml's Deployment says, the way a
// kubelet would and with what the Dockerfile puts in the image: the binary
// (built as the tests build, with its shared libraries) at the
// Deployment's command path, which the Dockerfile's line puts there, in a
// root of its own, under runc with the container's
// securityContext (runAsUser, no capabilities, no privilege escalation, a
// read-only root), its args unchanged but for the ports (berthd's 7443 and
// the controller's 8080 and 8081 are free ports of this host: host
// networking), the Secret berth-controller-berth mounted at its
// mountPath, the ServiceAccount's token, the API server's CA and namespace
// at /var/run/secrets/kubernetes.io/serviceaccount and
// KUBERNETES_SERVICE_HOST/PORT as the kubelet provides them, and
// berthd.berth-system.svc resolving to the berthd node (TLS with a
// certificate for that name, the controller's token an admin's). Its
// probes answer, and a Sandbox object becomes a running sandbox on the
// node.
func TestKubernetesControllerPod(t *testing.T) {
	e2e.NeedRoot(t, "containerd, runc and berthd")
	if _, err := exec.LookPath("runc"); err != nil {
		e2e.Missing(t, "runc (scripts/deps.sh installs it)")
	}
	repo := repoRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	k, cs, admin, _ := setUpKube(t, ctx, repo)
	dep := readDeployment(t, filepath.Join(repo, "deploy", "kubernetes", "berth-controller.yaml"))
	pod := dep.Spec.Template.Spec
	if len(pod.Containers) != 1 || len(pod.Containers[0].Command) == 0 {
		t.Fatalf("the Deployment has %d containers; the test knows one with a command", len(pod.Containers))
	}
	c := pod.Containers[0]
	if bin := c.Command[0]; !dockerfileBuilds(t, repo, "berth-controller", bin) {
		t.Fatalf("the Dockerfile puts no berth-controller at the Deployment's command %s", bin)
	}

	// berthd serving TLS for the Service's name, the controller's token
	// an admin's.
	dir := t.TempDir()
	certs, err := testcerts.NewSet(dir)
	if err != nil {
		t.Fatal(err)
	}
	crt, key, err := certs.CA.Server("berthd.berth-system.svc")
	if err != nil {
		t.Fatal(err)
	}
	crtFile, keyFile, err := testcerts.Write(dir, "berthd", crt, key)
	if err != nil {
		t.Fatal(err)
	}
	opsToken := randomToken(t)
	tokens := filepath.Join(dir, "tokens")
	writeFile(t, tokens, []byte(tokenHash(opsToken)+" ops\n"))
	ports := map[int]int{7443: freePort(t)}
	for _, p := range c.Ports {
		ports[int(p.ContainerPort)] = freePort(t)
	}
	node := startBerthd(t, repo, "node-a", "--listen", fmt.Sprintf("127.0.0.1:%d", ports[7443]),
		"--tls-cert", crtFile, "--tls-key", keyFile, "--token-file", tokens, "--admin", "ops")

	// The pod's root: what the image holds for the controller, and the
	// cluster DNS's answer for the Service as /etc/hosts.
	root := filepath.Join(dir, "rootfs")
	// The tests' build settings, so that the Go build cache of this test
	// binary serves it (a static CGO_ENABLED=0 build, as the Dockerfile
	// makes, compiles every dependency again: minutes); its shared
	// libraries go into the root with it.
	bin := filepath.Join(dir, "berth-controller")
	goBuild(t, filepath.Join(repo, "kubernetes"), bin, "./cmd/berth-controller")
	e2e.CopyFile(t, bin, filepath.Join(root, c.Command[0]), 0o755)
	if out, err := exec.Command("ldd", bin).Output(); err == nil {
		for _, f := range strings.Fields(string(out)) {
			if strings.HasPrefix(f, "/") {
				e2e.CopyFile(t, f, filepath.Join(root, f), 0o755)
			}
		}
	}
	for _, d := range []string{"etc", "proc", "dev", "sys", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "hosts"), []byte("127.0.0.1 localhost berthd.berth-system.svc\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Volumes as the kubelet writes them (files 0644, the default mode).
	volume := func(name string, files map[string][]byte) string {
		d := filepath.Join(dir, "volume-"+name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for f, b := range files {
			if err := os.WriteFile(filepath.Join(d, f), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	secrets := map[string]map[string][]byte{
		"berth-controller-berth": {"token": []byte(opsToken), "ca.crt": certs.CA.PEM},
	}
	var mounts []podMount
	for _, m := range c.VolumeMounts {
		var src string
		for _, v := range pod.Volumes {
			if v.Name == m.Name && v.Secret != nil && secrets[v.Secret.SecretName] != nil {
				src = volume(m.Name, secrets[v.Secret.SecretName])
			}
		}
		if src == "" || !m.ReadOnly {
			t.Fatalf("volumeMount %s: the test knows read-only mounts of the Secret berth-controller-berth", m.Name)
		}
		mounts = append(mounts, podMount{src, m.MountPath})
	}
	if pod.ServiceAccountName != "berth-controller" || dep.Namespace != "berth-system" {
		t.Fatalf("the Deployment runs as %s/%s; the test knows berth-system/berth-controller", dep.Namespace, pod.ServiceAccountName)
	}
	saToken := saConfig(t, ctx, cs, k.admin, dep.Namespace, pod.ServiceAccountName).BearerToken
	apiCA, err := os.ReadFile(filepath.Join(k.certDir, "apiserver.crt"))
	if err != nil {
		t.Fatal(err)
	}
	mounts = append(mounts, podMount{volume("serviceaccount", map[string][]byte{
		"token": []byte(saToken), "ca.crt": apiCA, "namespace": []byte(dep.Namespace),
	}), "/var/run/secrets/kubernetes.io/serviceaccount"})

	args := append([]string{}, c.Command...)
	for _, a := range c.Args {
		for from, to := range ports {
			a = regexp.MustCompile(fmt.Sprintf(`:%d\b`, from)).ReplaceAllString(a, fmt.Sprintf(":%d", to))
		}
		args = append(args, a)
	}
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin",
		"KUBERNETES_SERVICE_HOST=127.0.0.1", fmt.Sprintf("KUBERNETES_SERVICE_PORT=%d", k.port)}
	for _, e := range c.Env {
		env = append(env, e.Name+"="+e.Value)
	}
	if c.SecurityContext == nil || pod.SecurityContext == nil {
		t.Fatal("the Deployment's pod and container have no securityContext")
	}
	runPod(t, dir, root, args, env, c.SecurityContext, pod.SecurityContext.RunAsUser, c.Resources.Limits.Memory().Value(), mounts)

	// The probes answer (httpGet, by port name).
	for what, probe := range map[string]*struct{ path, port string }{
		"liveness": {c.LivenessProbe.HTTPGet.Path, c.LivenessProbe.HTTPGet.Port.String()}, "readiness": {c.ReadinessProbe.HTTPGet.Path, c.ReadinessProbe.HTTPGet.Port.String()},
	} {
		port := 0
		for _, p := range c.Ports {
			if p.Name == probe.port {
				port = ports[int(p.ContainerPort)]
			}
		}
		url := fmt.Sprintf("http://127.0.0.1:%d%s", port, probe.path)
		waitFor(t, 2*time.Minute, what+" probe "+url, func() (bool, string) {
			resp, err := http.Get(url)
			if err != nil {
				return false, err.Error()
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode == 200, fmt.Sprintf("%d %s", resp.StatusCode, b)
		})
	}

	obj := &sandboxv1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Name: "from-the-pod", Namespace: "default"},
		Spec:       sandboxv1.SandboxSpec{Berth: sandboxv1.BerthSpec{Image: baseImage}},
	}
	if err := admin.Create(ctx, obj); err != nil {
		t.Fatal(err)
	}
	var got sandboxv1.Sandbox
	waitFor(t, 3*time.Minute, "the pod's controller makes the Sandbox Ready", func() (bool, string) {
		if err := admin.Get(ctx, client.ObjectKeyFromObject(obj), &got); err != nil {
			return false, err.Error()
		}
		return meta.IsStatusConditionTrue(got.Status.Conditions, sandboxv1.ConditionReady), fmt.Sprintf("%+v", got.Status)
	})
	id := controller.SandboxID(obj.Namespace, obj.Name, string(obj.UID))
	sb, err := node.client.GetSandbox(ctx, id)
	if err != nil || got.Status.NodeName != "node-a" || sb.GetNodeId() != "node-a" || got.Status.Berth.AgentBootID != sb.GetRuntime().GetAgentBootId() {
		t.Errorf("berth GetSandbox(%s): %v %v; status %+v, want it on node-a with the same agent", id, err, sb, got.Status)
	}
	if err := admin.Delete(ctx, obj); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "the object goes", func() (bool, string) {
		err := admin.Get(ctx, client.ObjectKeyFromObject(obj), &got)
		return client.IgnoreNotFound(err) == nil && err != nil, fmt.Sprint(err)
	})
}

// readDeployment is the Deployment of the manifest at path.
func readDeployment(t *testing.T, path string) *appsv1.Deployment {
	t.Helper()
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	dec := yaml.NewYAMLOrJSONDecoder(fh, 4096)
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		var d appsv1.Deployment
		if err := json.Unmarshal(raw, &d); err == nil && d.Kind == "Deployment" {
			return &d
		}
	}
	t.Fatalf("%s: no Deployment", path)
	return nil
}

// dockerfileBuilds says whether the repository's Dockerfile builds the
// command cmd (go build of ./cmd/CMD) and copies it to path in the image.
func dockerfileBuilds(t *testing.T, repo, cmd, path string) bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	build := regexp.MustCompile(`(?m)go build .*\./cmd/` + regexp.QuoteMeta(cmd) + `\b`)
	cp := regexp.MustCompile(`(?m)^COPY --from=build /out/` + regexp.QuoteMeta(cmd) + ` ` + regexp.QuoteMeta(path) + `$`)
	return build.Match(b) && cp.Match(b)
}

// podMount is a read-only bind mount of a pod's volume.
type podMount struct{ src, dst string }

// runPod runs argv in root under runc as the container's securityContext
// says, with its memory limit (bytes; 0: none), mounts and env, in the
// host's network; Cleanup stops it.
func runPod(t *testing.T, dir, root string, argv, env []string, sc *corev1.SecurityContext, podUser *int64, memory int64, mounts []podMount) {
	t.Helper()
	bundle := filepath.Join(dir, "bundle")
	if err := os.MkdirAll(bundle, 0o755); err != nil {
		t.Fatal(err)
	}
	uid := int64(0)
	if podUser != nil {
		uid = *podUser
	}
	if sc.RunAsUser != nil {
		uid = *sc.RunAsUser
	}
	caps := []string{} // capabilities: drop ["ALL"] leaves none
	if sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" || len(sc.Capabilities.Add) != 0 {
		t.Fatalf("capabilities %+v: the test knows drop [ALL]", sc.Capabilities)
	}
	ms := []map[string]any{
		{"destination": "/proc", "type": "proc", "source": "proc"},
		{"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "nodev", "mode=1777"}},
	}
	for _, m := range mounts {
		ms = append(ms, map[string]any{"destination": m.dst, "type": "bind", "source": m.src, "options": []string{"rbind", "ro"}})
	}
	spec := map[string]any{
		"ociVersion": "1.0.2",
		"process": map[string]any{
			"user": map[string]any{"uid": uid, "gid": uid}, "args": argv, "env": env, "cwd": "/",
			"capabilities":    map[string]any{"bounding": caps, "effective": caps, "permitted": caps},
			"noNewPrivileges": sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation,
		},
		"root":     map[string]any{"path": root, "readonly": sc.ReadOnlyRootFilesystem},
		"hostname": "berth-controller",
		"mounts":   ms,
		"linux": map[string]any{
			// hostNetwork is not set: a pod network would give the pod its
			// own address; here the host's stands for it (the API server
			// and berthd listen on 127.0.0.1).
			"namespaces": []map[string]any{{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}},
			"resources":  map[string]any{"memory": map[string]any{"limit": memory}},
		},
	}
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(bundle, "config.json"), b)
	state := filepath.Join(dir, "runc")
	id := "berth-controller-" + randomToken(t)[:8]
	startProc(t, "berth-controller-pod", exec.Command("runc", "--root", state, "run", "--bundle", bundle, id))
	t.Cleanup(func() { exec.Command("runc", "--root", state, "delete", "--force", id).Run() })
}
