package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/e2e"
	"github.com/berth-sandbox/berth/internal/testcerts"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/auth"
	"github.com/berth-sandbox/berth/server/runtime"
	containerd "github.com/containerd/containerd/v2/client"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"sigs.k8s.io/yaml"
)

// The deployment artefact tests run berthd the way each artefact in deploy/
// runs it, read from the artefact itself, and create a sandbox and run a
// command in it (issue 19). berthd mounts each sandbox's root file system
// and run directory itself and hands their paths to containerd, whose runc
// works in the host's mount namespace: what an artefact gives berthd
// (capabilities, mount namespace and propagation, host paths) decides
// whether sandboxes start at all, and, because overlayfs works on a
// sandbox's upper layer with its mounter's credentials, what the
// workload's file writes may do. scripts/container-image.sh does the same
// with the image built from the Dockerfile.

// deployFilesImage is the image of the artefact tests' workload
// (writeDeployFilesImage).
const deployFilesImage = "berth.dev/deploy-files:1"

// deployWorkload writes to the files of deployFilesImage that overlayfs can
// copy up only with some of the mounter's capabilities (CAP_SETFCAP for a
// file with file capabilities, CAP_MKNOD for a device node, CAP_FOWNER
// for a mode change in the upper layer; CAP_FSETID and CAP_MKNOD for the
// chowned copy of the image), and prints what it sees.
const deployWorkload = `set -e
echo more >> /usr/bin/capf
chmod 600 /etc/devnode
echo x > /f
chmod 4755 /f
touch /etc/sgid
stat -c '%A %u:%g %n' /f /etc/devnode /etc/sgid
echo done`

const deployWant = "-rwsr-xr-x 0:0 /f\ncrw------- 0:0 /etc/devnode\n-rwxr-sr-x 0:42 /etc/sgid\ndone\n"

// TestDeploySystemdUnit runs berthd with the settings of
// deploy/berthd.service that decide whether sandboxes work: its capability
// bounding set and no_new_privs (setpriv(1)), in the host's mount
// namespace. The unit must set nothing that gives berthd a mount namespace
// of its own; the unit berth shipped before did (PrivateTmp,
// ProtectSystem, ProtectHome: systemd makes the namespace's mounts slaves
// of the host's), and the last subtest shows that no sandbox starts that
// way. What the emulation leaves out: the rest of systemd's execution
// environment (cgroup, RuntimeDirectory=, LimitNOFILE=, the unit's own
// ExecStart flags: berthd runs with the tests' paths and --no-network).
func TestDeploySystemdUnit(t *testing.T) {
	need(t)
	for _, tool := range []string{"setpriv", "unshare"} {
		if _, err := exec.LookPath(tool); err != nil {
			e2e.Missing(t, tool+" (util-linux; scripts/deps.sh installs it) not found")
		}
	}
	unit := readUnit(t, filepath.Join(env.repo, "deploy", "berthd.service"))
	for _, key := range mountNamespaceOptions {
		for _, v := range unit[key] {
			if key == "MountFlags" && v == "shared" || !isSet(v) {
				continue
			}
			t.Errorf("deploy/berthd.service sets %s=%s: it gives berthd a mount namespace of its own, whose mounts never reach runc", key, v)
		}
	}
	if v := unit["RestrictNamespaces"]; len(v) > 0 {
		t.Errorf("deploy/berthd.service sets RestrictNamespaces=%s: berthd creates user and network namespaces", strings.Join(v, " "))
	}
	wrapper := []string{"setpriv", "--inh-caps=-all"}
	if caps := unit["CapabilityBoundingSet"]; len(caps) > 0 {
		set := []string{"-all"}
		for _, c := range strings.Fields(strings.Join(caps, " ")) {
			if strings.HasPrefix(c, "~") {
				t.Fatalf("deploy/berthd.service: CapabilityBoundingSet=%s: the test knows only lists of capabilities to keep", c)
			}
			set = append(set, "+"+strings.ToLower(strings.TrimPrefix(c, "CAP_")))
		}
		wrapper = append(wrapper, "--bounding-set="+strings.Join(set, ","))
	}
	if nnp := unit["NoNewPrivileges"]; len(nnp) > 0 && isSet(nnp[len(nnp)-1]) {
		wrapper = append(wrapper, "--no-new-privs")
	}
	if t.Failed() {
		return
	}
	t.Logf("berthd under %s", strings.Join(wrapper, " "))
	flags := []string{"--snapshotter", "overlayfs", "--no-network", "--agent-ready-timeout", "10s"}

	t.Run("idmapped", func(t *testing.T) {
		e := newOverlayBinaryEnv(t, "unit")
		p := startBerthdUnder(t, e, wrapper, flags...)
		// The tests' runtime has every capability: where it gets idmapped
		// roots, berthd under the unit must too.
		if e.rt.IDMapped() == nil && len(p.logLines("roots are idmapped mounts")) == 0 {
			t.Errorf("berthd with the unit's capabilities does not give sandboxes idmapped roots:\n%s", p.log)
		}
		deploySandbox(t, e)
	})
	// Where the kernel or file system cannot idmap, berthd falls back to a
	// chowned copy of the image: it must work with the unit's capabilities
	// too.
	t.Run("chowned", func(t *testing.T) {
		e := newOverlayBinaryEnv(t, "unitch")
		startBerthdUnder(t, e, wrapper, append(flags, "--root-id-mapping", "chowned")...)
		deploySandbox(t, e)
	})
	// The unit before issue 19 (PrivateTmp=yes, ProtectSystem=full,
	// ProtectHome=yes), as far as the mounts are concerned: a mount
	// namespace whose mounts are slaves of the host's.
	t.Run("private mount namespace fails", func(t *testing.T) {
		e := newOverlayBinaryEnv(t, "unitold")
		p := startBerthdUnder(t, e, append([]string{"unshare", "--mount", "--propagation", "slave"}, wrapper...), flags...)
		importDeployFilesImage(t, e)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		resp, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: deployFilesImage})
		if err == nil {
			t.Fatalf("CreateSandbox by a berthd in a mount namespace of its own made %s; want an error: runc cannot see berthd's mounts", resp.GetSandbox().GetId())
		}
		t.Logf("CreateSandbox: %v (as expected); berthd's log says %q", err, p.logLines(`"internal error"`))
	})
}

// newOverlayBinaryEnv is newBinaryEnv with the tests' runtime on overlayfs,
// the snapshotter berthd uses by default and so the artefacts.
func newOverlayBinaryEnv(t *testing.T, name string) *berthEnv {
	t.Helper()
	rt, ns, stateDir := newNamespaceRuntimeWith(t, name, func(c *runtime.Config) { c.Snapshotter = "overlayfs" })
	return &berthEnv{ns: ns, stateDir: stateDir, rt: rt, sock: filepath.Join(env.dir, name+".sock")}
}

// mountNamespaceOptions are the unit settings that give a service a mount
// namespace of its own (systemd.exec(5); systemd's
// exec_needs_mount_namespace), MountFlags only when not "shared".
var mountNamespaceOptions = []string{
	"PrivateTmp", "PrivateDevices", "PrivateMounts", "PrivateNetwork", "PrivateIPC", "PrivateUsers",
	"ProtectSystem", "ProtectHome", "ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs",
	"ProtectControlGroups", "ProtectProc", "ProcSubset", "ProtectHostname",
	"ReadWritePaths", "ReadOnlyPaths", "InaccessiblePaths", "ExecPaths", "NoExecPaths",
	"TemporaryFileSystem", "BindPaths", "BindReadOnlyPaths", "RootDirectory", "RootImage",
	"MountImages", "ExtensionImages", "ExtensionDirectories", "MountAPIVFS", "MountFlags",
	"NetworkNamespacePath", "IPCNamespacePath", "LogNamespace", "DynamicUser",
}

// isSet reports whether a unit setting's value turns it on.
func isSet(v string) bool {
	switch strings.ToLower(v) {
	case "", "no", "false", "off", "0":
		return false
	}
	return true
}

// readUnit returns the Key=Value settings of a systemd unit file, every
// value of a key in order, continuation lines joined.
func readUnit(t *testing.T, path string) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	settings := map[string][]string{}
	var line string
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if line == "" && (l == "" || l[0] == '#' || l[0] == ';' || l[0] == '[') {
			continue
		}
		if c, ok := strings.CutSuffix(l, "\\"); ok {
			line += c + " "
			continue
		}
		line += l
		if k, v, ok := strings.Cut(line, "="); ok {
			settings[strings.TrimSpace(k)] = append(settings[strings.TrimSpace(k)], strings.TrimSpace(v))
		}
		line = ""
	}
	return settings
}

// TestDeployDaemonSet runs berthd as deploy/kubernetes/berthd-daemonset.yaml
// does, as a fleet of two nodes (issue 22 part 7): each "pod" a container
// made by containerd and runc (ctr run) with the pod's security context
// (privileged, read-only root file system), hostPID and hostNetwork, the
// host paths and Secrets at their mount paths with their mount
// propagation (as containerd's CRI plugin turns Bidirectional and
// HostToContainer into rshared and rslave bind mounts and an rshared
// root), its env (the downward API's node name and host IP, the
// ConfigMap's keys) and args, and the entrypoint of the Dockerfile, on a
// root file system laid out as the image is. Each pod stands for another
// Kubernetes node: its own node name, state directory, journal,
// machine-id and ports (the manifest's, mapped to free ones: both share
// this host's network); both use the tests' containerd, each in a
// namespace of its own. The fleet's etcd is one embedded etcd serving TLS
// with client certificates; the Secrets hold certificates of the tests'
// CA with the names the manifest gives. The pods' grpc probes must answer
// SERVING, and a sandbox created through one pod must run a command
// through the other. What the emulation leaves out: the kubelet, the
// pod's sandbox (pause) container, cgroups and resource limits, pod
// networking across hosts; the root file system holds the tests' binaries
// and busybox rather than the image's Debian (berthd linked dynamically,
// with its libraries copied, where the image's is static).
func TestDeployDaemonSet(t *testing.T) {
	need(t)
	for _, tool := range []string{"ctr", "ldd"} {
		if _, err := exec.LookPath(tool); err != nil {
			e2e.Missing(t, tool+" not found (scripts/deps.sh installs containerd; ldd is libc-bin)")
		}
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		e2e.Missing(t, "/bin/busybox (busybox-static; scripts/deps.sh installs it): "+err.Error())
	}
	ds, configMaps := readDaemonSet(t)
	pod := ds.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("the DaemonSet has %d containers; the test knows one", len(pod.Containers))
	}
	c := pod.Containers[0]

	// The Secrets: certificates of one test CA, a server certificate for
	// the name nodes verify each other by, a token of the admin ops.
	dir := filepath.Join(env.dir, "ds-secrets")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	certs, err := testcerts.NewSet(dir)
	if err != nil {
		t.Fatal(err)
	}
	peerName := configMaps["berthd-fleet"]["peer-server-name"]
	if peerName == "" {
		t.Fatal("the ConfigMap berthd-fleet has no peer-server-name")
	}
	serverCert, serverKey, err := certs.CA.Server(peerName)
	if err != nil {
		t.Fatal(err)
	}
	clientPair := func(cn string) [2][]byte {
		crt, key, err := certs.CA.Client(cn)
		if err != nil {
			t.Fatal(err)
		}
		return [2][]byte{crt, key}
	}
	tlsSecret := func(kp [2][]byte) map[string][]byte {
		return map[string][]byte{"tls.crt": kp[0], "tls.key": kp[1], "ca.crt": certs.CA.PEM}
	}
	secrets := map[string]map[string][]byte{
		"berthd-tls":         tlsSecret([2][]byte{serverCert, serverKey}),
		"berthd-peer":        tlsSecret(clientPair("berth-node")),
		"berthd-etcd-client": tlsSecret(clientPair("berthd")),
		"berthd-tokens":      {"tokens": []byte(auth.TokenHash(opsToken) + " ops\n")},
	}
	etcdURL := startTLSEtcd(t, certs)
	configMaps["berthd-fleet"]["etcd-endpoints"] = etcdURL

	pods := []*deployPod{
		runDaemonSetPod(t, pod, c, configMaps, secrets, "dsa", "node-a"),
		runDaemonSetPod(t, pod, c, configMaps, secrets, "dsb", "node-b"),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, p := range pods {
		// The kubelet's grpc probes: grpc.health.v1 Check in plaintext.
		for what, probe := range map[string]*k8sProbe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
			if probe == nil || probe.Grpc == nil {
				t.Errorf("the DaemonSet has no grpc %s probe", what)
				continue
			}
			if err := grpcProbe(ctx, "127.0.0.1:"+p.port(t, probe.Grpc.Port), probe.Grpc.Service); err != nil {
				t.Errorf("%s: %s probe: %v", p.node, what, err)
			}
		}
	}
	// Both nodes registered under their Kubernetes node names.
	tlsCfg, err := client.TLSConfigFromFiles(certs.CAFile, "", "")
	if err != nil {
		t.Fatal(err)
	}
	var ops []*client.Client
	for _, p := range pods {
		oc, err := client.Dial(ctx, "127.0.0.1:"+p.port(t, 7443), client.WithTLS(tlsCfg), client.WithToken(opsToken))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { oc.Close() })
		ops = append(ops, oc)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		nodes, err := ops[0].ListNodes(ctx)
		var ids []string
		for _, n := range nodes {
			if n.GetState() == berthv1.NodeState_NODE_STATE_READY {
				ids = append(ids, n.GetId())
			}
		}
		if slices.Equal(ids, []string{"node-a", "node-b"}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the fleet's ready nodes are %v (%v), want node-a and node-b", ids, err)
		}
	}
	// The image through node-a (an admin with a token: every node), a
	// sandbox on node-a through node-a, the workload through node-b.
	archive := filepath.Join(env.dir, "deploy-files.tar")
	if _, err := os.Stat(archive); err != nil {
		writeDeployFilesImage(t, archive)
	}
	tokenFile := filepath.Join(dir, "ops.token")
	if err := os.WriteFile(tokenFile, []byte(opsToken), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, env.cliBinary, "--addr", "127.0.0.1:"+pods[0].port(t, 7443), "--tls-ca", certs.CAFile, "--token-file", tokenFile,
		"image", "import", "--rootfs", "--name", deployFilesImage, archive).CombinedOutput()
	if err != nil || strings.Contains(string(out), "does not hold the image") {
		t.Fatalf("berth image import through node-a: %v\n%s", err, out)
	}
	sb, err := ops[0].CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: deployFilesImage, Labels: map[string]string{"node.berth.dev/id": "node-a"}})
	if err != nil || sb.GetNodeId() != "node-a" {
		t.Fatalf("create on node-a through node-a = %v, %v", sb, err)
	}
	t.Cleanup(func() { ops[0].DeleteSandbox(context.Background(), sb.GetId()) })
	run, err := ops[1].Run(ctx, sb.GetId(), &berthv1.ProcessSpec{Argv: []string{"sh", "-c", deployWorkload}})
	if err != nil {
		t.Fatalf("Run through node-b: %v", err)
	}
	if got := string(run.GetStdout()); got != deployWant || run.GetResult().GetExitCode() != 0 {
		t.Errorf("the workload (through node-b) exited %d with stdout\n%s\nstderr\n%s\nwant exit 0 and stdout\n%s", run.GetResult().GetExitCode(), got, run.GetStderr(), deployWant)
	}
}

// deployPod is one pod of the DaemonSet that TestDeployDaemonSet runs.
type deployPod struct {
	node  string
	ports map[int]int // the manifest's port -> the test's
}

func (p *deployPod) port(t *testing.T, manifest int) string {
	t.Helper()
	got, ok := p.ports[manifest]
	if !ok {
		t.Fatalf("port %d is not one of the container's ports %v", manifest, p.ports)
	}
	return fmt.Sprint(got)
}

// runDaemonSetPod runs container c of pod as the pod on Kubernetes node
// nodeName, with configMaps and secrets (name -> key -> value), its host
// paths and ports its own (name tells them apart), and returns once its
// berthd serves on its unix socket; the container is deleted at cleanup.
func runDaemonSetPod(t *testing.T, pod k8sPodSpec, c k8sContainer, configMaps map[string]map[string]string, secrets map[string]map[string][]byte, name, nodeName string) *deployPod {
	t.Helper()
	// The production paths of the DaemonSet and the tests' paths for them.
	// No path here may be a prefix of the root file system's (pod-root):
	// runc 1.1 takes the mount at such a prefix for the root's parent
	// mount, and pivot_root(2) then fails with EINVAL.
	state := filepath.Join(env.dir, name)
	machineID := filepath.Join(env.dir, name+"-machine-id")
	if err := os.WriteFile(machineID, []byte(fmt.Sprintf("%x\n", sha256.Sum256([]byte(name)))[32:]), 0o444); err != nil {
		t.Fatal(err)
	}
	paths := map[string]string{
		"/run/berth":             state,
		"/run/containerd":        filepath.Dir(env.containerd),
		"/var/lib/containerd":    containerdRoot(t),
		"/var/lib/berth/journal": filepath.Join(env.dir, name+"-journal"),
		"/etc/machine-id":        machineID,
	}
	prefixes := make([]string, 0, len(paths))
	for p := range paths {
		prefixes = append(prefixes, p)
	}
	sort.Slice(prefixes, func(i, j int) bool { return len(prefixes[i]) > len(prefixes[j]) })
	mapPath := func(s string) string {
		for _, p := range prefixes {
			if s == p || strings.HasPrefix(s, p+"/") {
				return paths[p] + strings.TrimPrefix(s, p)
			}
		}
		return s
	}
	mapValue := func(s string) string {
		for _, p := range prefixes {
			s = strings.ReplaceAll(s, p, paths[p])
		}
		return s
	}
	// The container's ports, each a free one of this host (hostNetwork:
	// the pods share it).
	dp := &deployPod{node: nodeName, ports: map[int]int{}}
	for _, cp := range c.Ports {
		dp.ports[cp.ContainerPort] = freePort(t)
	}
	mapPorts := func(s string) string {
		for from, to := range dp.ports {
			s = regexp.MustCompile(fmt.Sprintf(`:%d\b`, from)).ReplaceAllString(s, fmt.Sprintf(":%d", to))
		}
		return s
	}

	// The state directory is a shared mount on the node: containerd's CRI
	// plugin refuses a Bidirectional mount of anything else. Made here
	// first, unmounted last.
	if err := os.MkdirAll(state, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(state, state, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind-mount %s on itself: %v", state, err)
	}
	t.Cleanup(func() { unix.Unmount(state, unix.MNT_DETACH) })
	if err := unix.Mount("", state, "", unix.MS_SHARED, ""); err != nil {
		t.Fatalf("make %s a shared mount: %v", state, err)
	}
	e := newOverlayBinaryEnv(t, name)
	e.sock = filepath.Join(state, "berthd.sock")
	root := deployRootFS(t, filepath.Join(env.dir, "pod-root-"+name))

	id := "berthd-" + strings.TrimPrefix(shortID("x"), "x-")
	ctrNS := e.ns + "-pod"
	logPath := filepath.Join(env.dir, name+".log")
	args := []string{"run", "-d", "--rootfs", "--log-uri", "file://" + logPath}
	sc := c.SecurityContext
	if sc.RunAsUser != nil && *sc.RunAsUser != 0 {
		t.Fatalf("runAsUser %d: berthd runs as root", *sc.RunAsUser)
	}
	if sc.Privileged {
		// All capabilities, no seccomp or AppArmor profile, the host's
		// devices; Kubernetes allows no allowPrivilegeEscalation: false
		// with it.
		args = append(args, "--privileged", "--allow-new-privs")
	} else {
		for _, cp := range sc.Capabilities.Add {
			args = append(args, "--cap-add", "CAP_"+strings.TrimPrefix(cp, "CAP_"))
		}
		for _, cp := range sc.Capabilities.Drop {
			args = append(args, "--cap-drop", "CAP_"+strings.TrimPrefix(cp, "CAP_"))
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			args = append(args, "--allow-new-privs")
		}
	}
	if sc.ReadOnlyRootFilesystem {
		args = append(args, "--read-only")
	}
	if pod.HostPID {
		args = append(args, "--with-ns", fmt.Sprintf("pid:/proc/%d/ns/pid", os.Getpid()))
	}
	if pod.HostNetwork {
		args = append(args, "--net-host")
	}
	rootShared := false
	type bind struct{ src, dst, opts string }
	var binds []bind
	for _, m := range c.VolumeMounts {
		i := slices.IndexFunc(pod.Volumes, func(v k8sVolume) bool { return v.Name == m.Name })
		if i < 0 {
			t.Fatalf("volumeMount %s: no such volume", m.Name)
		}
		var src string
		switch v := pod.Volumes[i]; {
		case v.HostPath != nil:
			var ok bool
			if src, ok = paths[v.HostPath.Path]; !ok {
				t.Fatalf("hostPath %s: the test has no path of its own for it; add one", v.HostPath.Path)
			}
			if v.HostPath.Type == "DirectoryOrCreate" {
				if err := os.MkdirAll(src, 0o755); err != nil {
					t.Fatal(err)
				}
			}
		case v.EmptyDir != nil:
			src = filepath.Join(env.dir, name+"-empty-"+m.Name)
			if err := os.Mkdir(src, 0o777); err != nil {
				t.Fatal(err)
			}
		case v.Secret != nil:
			// The kubelet writes a Secret's keys as files of its volume.
			files, ok := secrets[v.Secret.SecretName]
			if !ok {
				t.Fatalf("secret %s: the test has no content for it; add some", v.Secret.SecretName)
			}
			src = filepath.Join(env.dir, name+"-secret-"+m.Name)
			if err := os.Mkdir(src, 0o700); err != nil {
				t.Fatal(err)
			}
			for k, b := range files {
				if err := os.WriteFile(filepath.Join(src, k), b, 0o400); err != nil {
					t.Fatal(err)
				}
			}
		default:
			t.Fatalf("volume %s: the test knows hostPath, emptyDir and secret volumes", m.Name)
		}
		opts := []string{"rbind"}
		switch m.MountPropagation {
		case "Bidirectional":
			opts, rootShared = append(opts, "rshared"), true
		case "HostToContainer":
			opts = append(opts, "rslave")
		case "", "None":
			opts = append(opts, "rprivate")
		default:
			t.Fatalf("volume %s: mountPropagation %q", m.Name, m.MountPropagation)
		}
		if m.ReadOnly {
			opts = append(opts, "ro")
		}
		binds = append(binds, bind{src, mapPath(m.MountPath), strings.Join(opts, ":")})
	}
	// Parents before children, as containerd's CRI plugin orders them:
	// the tests' paths all lie under the pod's /tmp.
	sort.SliceStable(binds, func(i, j int) bool {
		return strings.Count(filepath.Clean(binds[i].dst), "/") < strings.Count(filepath.Clean(binds[j].dst), "/")
	})
	for _, b := range binds {
		args = append(args, "--mount", fmt.Sprintf("type=bind,src=%s,dst=%s,options=%s", b.src, b.dst, b.opts))
	}
	if rootShared {
		args = append(args, "--rootfs-propagation", "rshared")
	}
	envs := map[string]string{}
	for _, v := range c.Env {
		val := v.Value
		switch from := v.ValueFrom; {
		case from == nil:
		case from.FieldRef != nil && from.FieldRef.FieldPath == "spec.nodeName":
			val = nodeName
		case from.FieldRef != nil && from.FieldRef.FieldPath == "status.hostIP":
			val = "127.0.0.1"
		case from.ConfigMapKeyRef != nil:
			var ok bool
			if val, ok = configMaps[from.ConfigMapKeyRef.Name][from.ConfigMapKeyRef.Key]; !ok {
				t.Fatalf("env %s: the manifest has no ConfigMap %s with key %s", v.Name, from.ConfigMapKeyRef.Name, from.ConfigMapKeyRef.Key)
			}
		default:
			t.Fatalf("env %s: the test knows only values, spec.nodeName, status.hostIP and ConfigMap keys", v.Name)
		}
		envs[v.Name] = mapValue(val)
		args = append(args, "--env", v.Name+"="+envs[v.Name])
	}
	args = append(args, root, id, dockerfileEntrypoint(t))
	for _, a := range c.Args {
		// Kubernetes expands $(VAR) in args from the container's env.
		a = k8sVarRef.ReplaceAllStringFunc(a, func(m string) string { return envs[m[2:len(m)-1]] })
		args = append(args, mapPorts(mapValue(a)))
	}
	// The tests' own containerd namespace and the workload's isolation.
	args = append(args, "--namespace="+e.ns, "--agent-ready-timeout=10s")

	ctr := func(ctx context.Context, args ...string) ([]byte, error) {
		return exec.CommandContext(ctx, "ctr", append([]string{"--address", env.containerd, "--namespace", ctrNS}, args...)...).CombinedOutput()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t.Logf("ctr %s", strings.Join(args, " "))
	if out, err := ctr(ctx, args...); err != nil {
		t.Fatalf("ctr run: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if t.Failed() {
			log, _ := os.ReadFile(logPath)
			t.Logf("berthd's log on %s (the container's output):\n%s", nodeName, log)
		}
		ctr(ctx, "task", "kill", "--signal", "SIGKILL", id)
		for i := 0; i < 50; i++ {
			if out, _ := ctr(ctx, "task", "ls", "-q"); !strings.Contains(string(out), id) {
				break
			}
			ctr(ctx, "task", "delete", "--force", id)
			time.Sleep(100 * time.Millisecond)
		}
		if out, err := ctr(ctx, "container", "delete", id); err != nil {
			t.Errorf("delete the berthd container: %v: %s", err, out)
		}
		ctr(ctx, "namespaces", "remove", ctrNS)
	})
	e.dial(t)
	if _, err := e.images.ListImages(ctx, &berthv1.ListImagesRequest{}, grpc.WaitForReady(true)); err != nil {
		log, _ := os.ReadFile(logPath)
		t.Fatalf("berthd in the DaemonSet's container on %s did not serve: %v\nlog:\n%s", nodeName, err, log)
	}
	// The container's /sys/fs/cgroup is not the host's root, where
	// containerd makes the sandboxes' cpuset parent: berthd (--cpuset
	// auto by default) says so once and pins nothing, and creates work
	// (issue 21: each failed INTERNAL at a mkdir there).
	log, _ := os.ReadFile(logPath)
	if n := strings.Count(string(log), "sandboxes are NOT pinned to CPUs"); n != 1 || !strings.Contains(string(log), `"cpuset":"off (auto unavailable)"`) {
		t.Errorf("berthd in the DaemonSet's container on %s logged the cpuset warning %d times and no \"off (auto unavailable)\" start line; want one warning and that line:\n%s", nodeName, n, log)
	}
	// Nor can it weigh the sandboxes' parent cpu cgroup there
	// (docs/default-limits.md#cpu-weight): one warning, and creates work.
	if n := strings.Count(string(log), "the sandboxes' parent cgroup is NOT weighed"); n != 1 || !strings.Contains(string(log), `"cpu_weight":"off (auto unavailable)"`) {
		t.Errorf("berthd in the DaemonSet's container on %s logged the cpu weight warning %d times and no \"off (auto unavailable)\" start line; want one warning and that line:\n%s", nodeName, n, log)
	}
	return dp
}

// grpcProbe checks addr's grpc.health.v1 for service in plaintext, as the
// kubelet's grpc probe does.
func grpcProbe(ctx context.Context, addr, service string) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service}, grpc.WaitForReady(true))
	if err != nil {
		return err
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("%s answers %v", addr, resp.GetStatus())
	}
	return nil
}

// startTLSEtcd starts an embedded etcd that serves its clients TLS with a
// certificate of certs and takes only client certificates of its CA, and
// returns its client URL; it stops at cleanup.
func startTLSEtcd(t *testing.T, certs *testcerts.Set) string {
	t.Helper()
	cu, _ := url.Parse(fmt.Sprintf("https://127.0.0.1:%d", freePort(t)))
	pu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", freePort(t)))
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = "ds", filepath.Join(env.dir, "ds-etcd")
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ClientTLSInfo = transport.TLSInfo{CertFile: certs.CertFile, KeyFile: certs.KeyFile, TrustedCAFile: certs.CAFile, ClientCertAuth: true}
	// Its listeners log errors when they close.
	cfg.LogLevel = "fatal"
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatalf("start etcd: %v", err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		t.Fatalf("etcd: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("etcd not ready within a minute")
	}
	return cu.String()
}

// k8sVarRef is a reference to an environment variable in a container's
// args, $(NAME).
var k8sVarRef = regexp.MustCompile(`\$\([A-Za-z_][A-Za-z0-9_]*\)`)

// k8sDaemonSet is what TestDeployDaemonSet reads of a DaemonSet (field
// names match the YAML's case-insensitively).
type k8sDaemonSet struct {
	Kind     string
	Metadata struct{ Name string }
	// Data is a ConfigMap's.
	Data map[string]string
	Spec struct {
		Template struct {
			Spec k8sPodSpec
		}
	}
}

type k8sPodSpec struct {
	HostPID     bool `json:"hostPID"`
	HostNetwork bool
	Containers  []k8sContainer
	Volumes     []k8sVolume
}

// k8sProbe is a probe of the kubelet's own: grpc.health.v1 on a port.
type k8sProbe struct {
	Grpc *struct {
		Port    int
		Service string
	}
}

type k8sContainer struct {
	Args []string
	Env  []struct {
		Name, Value string
		ValueFrom   *struct {
			FieldRef        *struct{ FieldPath string }
			ConfigMapKeyRef *struct{ Name, Key string }
		}
	}
	Ports []struct {
		ContainerPort int
	}
	ReadinessProbe, LivenessProbe *k8sProbe
	// SecurityContext holds what the test applies; anything else fails
	// the test only when it breaks berthd.
	SecurityContext struct {
		RunAsUser                *int64
		Privileged               bool
		AllowPrivilegeEscalation *bool
		ReadOnlyRootFilesystem   bool
		Capabilities             struct{ Add, Drop []string }
	}
	VolumeMounts []struct {
		Name, MountPath, MountPropagation string
		ReadOnly                          bool
	}
}

type k8sVolume struct {
	Name     string
	HostPath *struct{ Path, Type string }
	EmptyDir *struct{ Medium string }
	Secret   *struct{ SecretName string }
}

// readDaemonSet returns the DaemonSet of deploy/kubernetes/berthd-daemonset.yaml
// and its ConfigMaps' data by name.
func readDaemonSet(t *testing.T) (k8sDaemonSet, map[string]map[string]string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(env.repo, "deploy", "kubernetes", "berthd-daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	configMaps := map[string]map[string]string{}
	var out *k8sDaemonSet
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var ds k8sDaemonSet
		if err := yaml.Unmarshal([]byte(doc), &ds); err != nil {
			t.Fatalf("berthd-daemonset.yaml: %v", err)
		}
		switch ds.Kind {
		case "DaemonSet":
			out = &ds
		case "ConfigMap":
			configMaps[ds.Metadata.Name] = ds.Data
		}
	}
	if out == nil {
		t.Fatal("berthd-daemonset.yaml holds no DaemonSet")
	}
	return *out, configMaps
}

// dockerfileEntrypoint returns the image's entrypoint, as the Dockerfile's
// ENTRYPOINT ["..."] names it.
func dockerfileEntrypoint(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(env.repo, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^ENTRYPOINT \["([^"]+)"\]`).FindSubmatch(b)
	if m == nil {
		t.Fatal(`the Dockerfile has no ENTRYPOINT ["..."]`)
	}
	return string(m[1])
}

// containerdRoot returns the root directory of the tests' containerd: the
// parent of the overlayfs snapshotter's root, which containerd reports
// (introspection).
func containerdRoot(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, err := containerd.New(env.containerd)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	resp, err := client.IntrospectionService().Plugins(ctx, `type==io.containerd.snapshotter.v1,id==overlayfs`)
	if err != nil {
		t.Fatalf("containerd's plugins: %v", err)
	}
	if len(resp.Plugins) != 1 || resp.Plugins[0].Exports["root"] == "" {
		t.Fatalf("containerd reports no root of its overlayfs snapshotter: %v", resp.Plugins)
	}
	return filepath.Dir(resp.Plugins[0].Exports["root"])
}

// deployRootFS lays out at dir what the Dockerfile's image holds for
// berthd: berthd and berth in /usr/local/bin, the agent in
// /usr/local/lib/berth, the entrypoint; with busybox for the entrypoint's
// shell and tools, and the shared libraries of the tests' berthd and
// berth (the image's are static).
func deployRootFS(t *testing.T, dir string) string {
	t.Helper()
	copyFile := func(src, dst string, mode os.FileMode) { e2e.CopyFile(t, src, dst, mode) }
	copyFile("/bin/busybox", filepath.Join(dir, "bin", "busybox"), 0o755)
	applets, err := exec.Command("/bin/busybox", "--list").Output()
	if err != nil {
		t.Fatalf("busybox --list: %v", err)
	}
	for _, a := range strings.Fields(string(applets)) {
		if a != "busybox" && !strings.Contains(a, "/") {
			os.Symlink("busybox", filepath.Join(dir, "bin", a))
		}
	}
	bins := map[string]string{
		berthdBinary(t): "usr/local/bin/berthd",
		env.cliBinary:   "usr/local/bin/berth",
		env.agentBinary: "usr/local/lib/berth/berth-agent",
		filepath.Join(env.repo, "deploy", "berthd-entrypoint.sh"): "usr/local/bin/berthd-entrypoint",
	}
	for src, dst := range bins {
		copyFile(src, filepath.Join(dir, dst), 0o755)
		out, err := exec.Command("ldd", src).CombinedOutput()
		if err != nil {
			continue // static, or a script
		}
		for _, f := range strings.Fields(string(out)) {
			if strings.HasPrefix(f, "/") {
				copyFile(f, filepath.Join(dir, f), 0o755)
			}
		}
	}
	return dir
}

// deploySandbox imports deployFilesImage through e, creates a sandbox of
// it (deleted at cleanup) and runs deployWorkload in it.
func deploySandbox(t *testing.T, e *berthEnv) {
	t.Helper()
	importDeployFilesImage(t, e)
	sb := createSandboxOn(t, e.sandboxes, &berthv1.CreateSandboxRequest{Image: deployFilesImage})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	run, err := e.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: sb.GetId(), Process: &berthv1.ProcessSpec{Argv: []string{"sh", "-c", deployWorkload}}})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := string(run.GetStdout()); got != deployWant || run.GetResult().GetExitCode() != 0 {
		t.Errorf("the workload exited %d with stdout\n%s\nstderr\n%s\nwant exit 0 and stdout\n%s", run.GetResult().GetExitCode(), got, run.GetStderr(), deployWant)
	}
}

// importDeployFilesImage imports deployFilesImage into e's berthd with the
// berth CLI, from a root file system archive (writeDeployFilesImage).
func importDeployFilesImage(t *testing.T, e *berthEnv) {
	t.Helper()
	archive := filepath.Join(env.dir, "deploy-files.tar")
	if _, err := os.Stat(archive); err != nil {
		writeDeployFilesImage(t, archive)
	}
	out, err := exec.Command(env.cliBinary, "--addr", "unix://"+e.sock, "image", "import", "--rootfs", "--name", deployFilesImage, archive).CombinedOutput()
	if err != nil {
		t.Fatalf("berth image import: %v\n%s", err, out)
	}
}

// writeDeployFilesImage writes a root file system archive: busybox, a
// file with file capabilities (cap_net_raw=ep, as Debian's ping has), a
// device node, a setgid file of group 42.
func writeDeployFilesImage(t *testing.T, path string) {
	t.Helper()
	busybox, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	// struct vfs_cap_data, revision 2 (capability.h): magic with the
	// effective flag, then permitted and inheritable, low and high words.
	capNetRaw := binary.LittleEndian.AppendUint32(nil, 0x02000000|1)
	for _, w := range []uint32{1 << unix.CAP_NET_RAW, 0, 0, 0} {
		capNetRaw = binary.LittleEndian.AppendUint32(capNetRaw, w)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(h *tar.Header, body []byte) {
		h.Size, h.Format = int64(len(body)), tar.FormatPAX
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write(body)
		}
	}
	for _, d := range []string{"bin", "etc", "usr", "usr/bin"} {
		add(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755}, nil)
	}
	add(&tar.Header{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777}, nil)
	add(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755}, busybox)
	for _, a := range []string{"sh", "echo", "chmod", "touch", "stat", "cat", "ls"} {
		add(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + a, Linkname: "busybox", Mode: 0o777}, nil)
	}
	add(&tar.Header{Typeflag: tar.TypeReg, Name: "etc/passwd", Mode: 0o644}, []byte("root:x:0:0:root:/root:/bin/sh\n"))
	add(&tar.Header{Typeflag: tar.TypeReg, Name: "etc/sgid", Mode: 0o2755, Gid: 42}, []byte("setgid\n"))
	add(&tar.Header{Typeflag: tar.TypeChar, Name: "etc/devnode", Mode: 0o644, Devmajor: 1, Devminor: 3}, nil)
	add(&tar.Header{Typeflag: tar.TypeReg, Name: "usr/bin/capf", Mode: 0o755,
		PAXRecords: map[string]string{"SCHILY.xattr.security.capability": string(capNetRaw)}}, []byte("file capabilities\n"))
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}
