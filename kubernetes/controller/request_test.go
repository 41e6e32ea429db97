package controller

import (
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sandboxv1 "github.com/berth-sandbox/berth/kubernetes/api/v1beta1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// berth's sandbox id rule (CreateSandboxRequest.sandbox_id).
var sandboxIDRule = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

func TestSandboxID(t *testing.T) {
	long := strings.Repeat("n", 253)
	cases := []struct{ ns, name, uid string }{
		{"default", "agent-1", "u1"},
		{"team.a", "My.Agent", "u1"},
		{"kube-system", long, "u1"},
		{strings.Repeat("x", 63), "-", "u1"},
	}
	seen := map[string]bool{}
	for _, c := range cases {
		id := SandboxID(c.ns, c.name, c.uid)
		if !sandboxIDRule.MatchString(id) || strings.HasSuffix(id, "-") {
			t.Errorf("SandboxID(%q, %q) = %q: not a berth sandbox id", c.ns, c.name, id)
		}
		if again := SandboxID(c.ns, c.name, c.uid); again != id {
			t.Errorf("SandboxID not stable: %q then %q", id, again)
		}
		if other := SandboxID(c.ns, c.name, "u2"); other == id {
			t.Errorf("SandboxID(%q, %q) is %q for two uids: an object made again under its name would find the old sandbox", c.ns, c.name, id)
		}
		if seen[id] {
			t.Errorf("SandboxID %q for two objects", id)
		}
		seen[id] = true
	}
	if id := SandboxID("default", "agent-1", "u1"); !strings.HasPrefix(id, "default-agent-1-") {
		t.Errorf("SandboxID(default, agent-1) = %q: does not name the object", id)
	}
}

func TestCreateRequest(t *testing.T) {
	sb := &sandboxv1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns"},
		Spec: sandboxv1.SandboxSpec{Berth: sandboxv1.BerthSpec{
			Image: "berth.dev/base:latest", Runtime: "gvisor", User: "1000:1000", Workdir: "/w",
			Env:         map[string]string{"K": "V"},
			Labels:      map[string]string{"node.berth.dev/zone": "a"},
			Resources:   &sandboxv1.Resources{CPUMillis: 500, MemoryBytes: 1 << 30, DiskBytes: 2 << 30, PidsLimit: 64},
			IdleTimeout: &metav1.Duration{Duration: 10 * time.Minute}, MaxLifetime: &metav1.Duration{Duration: time.Hour},
			IdleAction: "Hibernate",
			Network:    &sandboxv1.Network{Mode: "Egress", Allow: []string{"example.com"}},
		}},
	}
	req, err := CreateRequest(sb, "ns-a-1")
	if err != nil {
		t.Fatal(err)
	}
	r := req.GetResources()
	if req.GetSandboxId() != "ns-a-1" || req.GetImage() != "berth.dev/base:latest" || req.GetRuntime() != "gvisor" ||
		req.GetUser() != "1000:1000" || req.GetWorkdir() != "/w" || req.GetEnv()["K"] != "V" ||
		r.GetCpuMillis() != 500 || r.GetMemoryBytes() != 1<<30 || r.GetDiskBytes() != 2<<30 || r.GetPidsLimit() != 64 ||
		req.GetIdleTimeout().AsDuration() != 10*time.Minute || req.GetMaxLifetime().AsDuration() != time.Hour ||
		req.GetIdleAction() != berthv1.IdleAction_IDLE_ACTION_HIBERNATE ||
		req.GetNetwork().GetMode() != berthv1.NetworkMode_NETWORK_MODE_EGRESS || req.GetNetwork().GetAllow()[0] != "example.com" {
		t.Errorf("CreateRequest = %v", req)
	}
	if l := req.GetLabels(); l[LabelNamespace] != "ns" || l[LabelName] != "a" || l["node.berth.dev/zone"] != "a" {
		t.Errorf("labels = %v", l)
	}

	// agent-sandbox's podTemplate names the image when spec.berth does not.
	pt := &sandboxv1.Sandbox{Spec: sandboxv1.SandboxSpec{PodTemplate: &sandboxv1.PodTemplate{
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "python:3.12"}}}}}}
	if req, err := CreateRequest(pt, "x"); err != nil || req.GetImage() != "python:3.12" {
		t.Errorf("podTemplate image: %v, %v", req.GetImage(), err)
	}

	for field, bad := range map[string]*sandboxv1.Sandbox{
		"spec.berth.image":         {},
		"spec.berth.idleAction":    {Spec: sandboxv1.SandboxSpec{Berth: sandboxv1.BerthSpec{Image: "i", IdleAction: "Sleep"}}},
		"spec.berth.network.mode":  {Spec: sandboxv1.SandboxSpec{Berth: sandboxv1.BerthSpec{Image: "i", Network: &sandboxv1.Network{Mode: "All"}}}},
		"spec.berth.suspendAction": {Spec: sandboxv1.SandboxSpec{Berth: sandboxv1.BerthSpec{Image: "i", SuspendAction: "Stop"}}},
	} {
		if _, err := CreateRequest(bad, "x"); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("CreateRequest with a bad %s: %v, want an error naming it", field, err)
		}
	}
}
