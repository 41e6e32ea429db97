// Package integration tests berth-controller against a real kube-apiserver
// (scripts/kube-apiserver.sh builds it once into the cache) on Debian's
// etcd, with a real berthd node on a private containerd running the real
// agent: the manifests of deploy/kubernetes are applied with server-side
// apply, and Sandbox objects made with client-go become berth sandboxes.
// With BERTH_E2E=1 a missing part (root, etcd, the API server's build)
// fails the test; without it the test skips.
package integration

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	berth "github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/e2e"
)

// repoRoot is the berth repository (this module lives in its kubernetes/).
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startProc starts a child process; Cleanup stops it (SIGTERM, then
// SIGKILL after 15 s) and prints its log when the test failed. The
// returned channel is closed when the process has exited.
func startProc(t *testing.T, name string, cmd *exec.Cmd) <-chan struct{} {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		logFile.Close()
		if t.Failed() || os.Getenv("BERTH_TEST_LOG") != "" {
			b, _ := os.ReadFile(logPath)
			if len(b) > 16<<10 {
				b = b[len(b)-16<<10:]
			}
			t.Logf("%s log (last 16 KiB):\n%s", name, b)
		}
	})
	return done
}

// goBuild builds pkg of the berth repository into out.
func goBuild(t *testing.T, repo, out, pkg string, env ...string) {
	t.Helper()
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
}

// waitFor polls cond every 200 ms until it holds or timeout passes; then
// the test fails with what cond last said.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		ok, why := cond()
		if ok {
			return
		}
		last = why
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %s", what, timeout, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// kube is a running kube-apiserver on its own etcd.
type kube struct {
	admin   *rest.Config // system:masters through a static token
	port    int          // the secure port on 127.0.0.1
	certDir string       // the serving certificate: apiserver.crt, self-signed for 127.0.0.1
}

const adminToken = "berth-test-admin"

// startKube starts Debian's etcd and the cached kube-apiserver with the
// RBAC authorizer, a static admin token and service-account tokens.
func startKube(t *testing.T, repo string) *kube {
	t.Helper()
	etcdBin, err := exec.LookPath("etcd")
	if err != nil {
		e2e.Missing(t, "etcd (Debian's etcd-server; scripts/deps.sh installs it)")
	}
	apiserver := os.Getenv("BERTH_KUBE_APISERVER")
	if apiserver == "" {
		// Cached: a second run costs nothing; a first builds (~5 min).
		out, err := exec.Command(filepath.Join(repo, "scripts", "kube-apiserver.sh")).Output()
		if err != nil {
			e2e.Missing(t, fmt.Sprintf("kube-apiserver (scripts/kube-apiserver.sh): %v", err))
		}
		apiserver = strings.TrimSpace(string(out))
	}
	dir := t.TempDir()
	clientPort, peerPort, securePort := freePort(t), freePort(t), freePort(t)
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", clientPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	startProc(t, "etcd", exec.Command(etcdBin, "--name", "kube", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "kube="+peerURL))

	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "sa.key")
	pubFile := filepath.Join(dir, "sa.pub")
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, keyFile, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}))
	writeFile(t, pubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}))
	tokens := filepath.Join(dir, "tokens.csv")
	writeFile(t, tokens, []byte(adminToken+",berth-test-admin,berth-test-admin,system:masters\n"))
	// The endpoint reconciler publishes the advertise address as the
	// kubernetes Service's endpoint and refuses a loopback one; no pod
	// here needs that Service.
	exited := startProc(t, "kube-apiserver", exec.Command(apiserver,
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--endpoint-reconciler-type", "none",
		"--allow-privileged=true", // the berthd DaemonSet is privileged, as docs/kubernetes.md says
		"--secure-port", fmt.Sprint(securePort), "--cert-dir", filepath.Join(dir, "certs"),
		"--token-auth-file", tokens,
		"--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", pubFile,
		"--service-account-signing-key-file", keyFile,
		"--service-cluster-ip-range", "10.96.0.0/24",
		"--enable-priority-and-fairness=false",
	))
	k := &kube{port: securePort, certDir: filepath.Join(dir, "certs"), admin: &rest.Config{
		Host:            fmt.Sprintf("https://127.0.0.1:%d", securePort),
		BearerToken:     adminToken,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		QPS:             100, Burst: 200,
	}}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	waitFor(t, 3*time.Minute, "kube-apiserver /readyz", func() (bool, string) {
		select {
		case <-exited:
			t.Fatal("kube-apiserver exited before it was ready (its log follows)")
		default:
		}
		req, _ := http.NewRequest("GET", k.admin.Host+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := hc.Do(req)
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == 200, fmt.Sprintf("%d %s", resp.StatusCode, b)
	})
	return k
}

func writeFile(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// apply server-side applies every object of the YAML files (as kubectl
// apply --server-side --force-conflicts would), and returns them.
func (k *kube) apply(t *testing.T, files ...string) []*unstructured.Unstructured {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dyn, err := dynamic.NewForConfig(k.admin)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(k.admin)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	var applied []*unstructured.Unstructured
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewYAMLOrJSONDecoder(fh, 4096)
		for {
			var obj unstructured.Unstructured
			if err := dec.Decode(&obj.Object); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if obj.Object == nil {
				continue
			}
			gvk := obj.GroupVersionKind()
			mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				// A kind a CRD of this apply just made: discovery again.
				mapper.Reset()
				if mapping, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
					t.Fatalf("%s: %s %s: %v", f, gvk, obj.GetName(), err)
				}
			}
			ri := dyn.Resource(mapping.Resource)
			var res dynamic.ResourceInterface = ri
			if mapping.Scope.Name() == "namespace" {
				res = ri.Namespace(obj.GetNamespace())
			}
			out, err := res.Apply(ctx, obj.GetName(), &obj, metav1.ApplyOptions{FieldManager: "berth-test", Force: true})
			if err != nil {
				t.Fatalf("server-side apply %s: %s %s/%s: %v", f, gvk.Kind, obj.GetNamespace(), obj.GetName(), err)
			}
			applied = append(applied, out)
		}
		fh.Close()
	}
	return applied
}

// berthd is one real berthd node of a fleet on a private containerd, with
// the base image imported.
type berthd struct {
	sock    string // unix socket: root is an admin there
	cdir    string // its containerd's directory (containerd.sock)
	tcp     string // plaintext TCP address (--insecure-tcp), the fleet's address of the node
	nodeID  string
	etcdURL string // the embedded etcd's client URL; empty on a node that joined one
	client  *berth.Client

	argv []string        // berthd's command line, the same at every start
	cmd  *exec.Cmd       // the running berthd
	done <-chan struct{} // closed when cmd has exited
	runs int
}

const baseImage = "berth.dev/base:latest"

// startBerthd starts berthd as fleet node nodeID with flags added to its
// command line: with an --etcd-endpoints flag it joins that fleet,
// otherwise it runs the fleet's etcd embedded (etcdURL).
func startBerthd(t *testing.T, repo, nodeID string, flags ...string) *berthd {
	t.Helper()
	archive := os.Getenv("BERTH_TEST_IMAGE")
	if archive == "" {
		archive = filepath.Join(repo, "build", "base.oci.tar")
	}
	if _, err := os.Stat(archive); err != nil {
		e2e.Missing(t, fmt.Sprintf("the base image (make image): %v", err))
	}
	// Socket paths are limited to 108 bytes: a short directory.
	dir, err := os.MkdirTemp("/tmp", "bk")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// Run after berthd and containerd stop (cleanups run last first):
	// berthd keeps its sandboxes across a stop, and their root and run
	// mounts under dir (a claim's sandbox, whose object no garbage
	// collector deletes here) would outlive the test.
	t.Cleanup(func() { e2e.UnmountUnder(t, dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "bin")
	goBuild(t, repo, filepath.Join(bin, "berth-agent"), "./cmd/berth-agent", "CGO_ENABLED=0")
	goBuild(t, repo, filepath.Join(bin, "berthd"), "./cmd/berthd")

	script := filepath.Join(repo, "scripts", "containerd.sh")
	cdir := filepath.Join(dir, "c")
	if out, err := exec.Command("bash", script, "start", cdir).CombinedOutput(); err != nil {
		e2e.Missing(t, fmt.Sprintf("containerd (scripts/containerd.sh): %v: %s", err, out))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("bash", script, "stop", cdir).CombinedOutput(); err != nil {
			t.Logf("stop containerd: %v: %s", err, out)
		}
	})
	b := make([]byte, 4)
	rand.Read(b)
	n := &berthd{sock: filepath.Join(dir, "berthd.sock"), cdir: cdir, nodeID: nodeID}
	n.tcp = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	n.argv = []string{filepath.Join(bin, "berthd"),
		"--containerd-address", filepath.Join(cdir, "containerd.sock"),
		"--namespace", "berth-k8s-" + hex.EncodeToString(b),
		"--state-dir", filepath.Join(dir, "s"),
		"--agent-binary", filepath.Join(bin, "berth-agent"),
		"--snapshotter", "overlayfs",
		"--listen", "unix://" + n.sock, "--listen", n.tcp, "--insecure-tcp", "--peer-insecure",
		"--node-id", nodeID,
	}
	if !slices.Contains(flags, "--etcd-endpoints") {
		n.etcdURL = fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
		n.argv = append(n.argv, "--etcd-embed", "--etcd-embed-dir", filepath.Join(dir, "etcd"),
			"--etcd-embed-client-url", n.etcdURL,
			"--etcd-embed-peer-url", fmt.Sprintf("http://127.0.0.1:%d", freePort(t)))
	}
	n.argv = append(n.argv, flags...)
	n.start(t)
	n.client, err = berth.Dial(context.Background(), "unix://"+n.sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.client.Close() })
	n.waitServing(t)
	fh, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := n.client.ImportImage(ctx, fh, ""); err != nil {
		t.Fatalf("import the base image: %v", err)
	}
	return n
}

// start runs berthd with n.argv (its log: berthd-NODE[-RUN].log).
func (n *berthd) start(t *testing.T) {
	t.Helper()
	name := "berthd-" + n.nodeID
	if n.runs++; n.runs > 1 {
		name = fmt.Sprintf("%s-%d", name, n.runs)
	}
	n.cmd = exec.Command(n.argv[0], n.argv[1:]...)
	n.done = startProc(t, name, n.cmd)
}

func (n *berthd) waitServing(t *testing.T) {
	t.Helper()
	waitFor(t, 2*time.Minute, "berthd "+n.nodeID+" serves", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := n.client.ListImages(ctx)
		return err == nil, fmt.Sprint(err)
	})
}

// kill ends berthd with SIGKILL, as a crashed host would: its lease is not
// revoked, it runs out; its sandboxes' tasks keep running under
// containerd.
func (n *berthd) kill(t *testing.T) {
	t.Helper()
	if err := n.cmd.Process.Kill(); err != nil {
		t.Fatalf("kill berthd %s: %v", n.nodeID, err)
	}
	<-n.done
}

// restart starts berthd again with the same node id, state and flags, and
// waits until it serves (it re-adopted its sandboxes by then).
func (n *berthd) restart(t *testing.T) {
	t.Helper()
	n.start(t)
	n.waitServing(t)
}
