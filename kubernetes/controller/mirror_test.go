package controller

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	extv1alpha1 "github.com/berth-sandbox/berth/kubernetes/api/extensions/v1alpha1"
	sandboxv1 "github.com/berth-sandbox/berth/kubernetes/api/v1beta1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

func TestMirrorObject(t *testing.T) {
	sb := &berthv1.Sandbox{
		Id: "sb-k3x9q2m7wa", Image: "berth.dev/base:latest", Owner: "unix:uid:0", State: berthv1.SandboxState_SANDBOX_STATE_HIBERNATED,
		RuntimeName: "gvisor", User: "1000:1000", Workdir: "/w", Labels: map[string]string{"team": "a"},
		Resources:   &berthv1.Resources{CpuMillis: 500, MemoryBytes: 1 << 30, DiskBytes: 2 << 30, PidsLimit: 64},
		IdleTimeout: durationpb.New(10 * time.Minute), MaxLifetime: durationpb.New(time.Hour),
		Network: &berthv1.NetworkPolicy{Mode: berthv1.NetworkMode_NETWORK_MODE_EGRESS, Allow: []string{"example.com"}},
	}
	obj := MirrorObject(sb, "berth-sandboxes")
	if obj.Name != sb.Id || obj.Namespace != "berth-sandboxes" || !Mirrored(obj) || obj.Annotations[AnnotationOwner] != "unix:uid:0" {
		t.Errorf("object meta %+v", obj.ObjectMeta)
	}
	if objectSandboxID(obj) != sb.Id {
		t.Errorf("objectSandboxID = %q, want the name %q", objectSandboxID(obj), sb.Id)
	}
	b := obj.Spec.Berth
	if b.Image != sb.Image || b.Runtime != "gvisor" || b.User != "1000:1000" || b.Workdir != "/w" || b.Labels["team"] != "a" ||
		*b.Resources != (sandboxv1.Resources{CPUMillis: 500, MemoryBytes: 1 << 30, DiskBytes: 2 << 30, PidsLimit: 64}) ||
		b.IdleTimeout.Duration != 10*time.Minute || b.MaxLifetime.Duration != time.Hour ||
		b.Network.Mode != "Egress" || b.Network.Allow[0] != "example.com" {
		t.Errorf("spec.berth = %+v", b)
	}
	// A hibernated sandbox's object says Suspended by Hibernate, so that
	// the reconciler does not wake it.
	if obj.Spec.OperatingMode != sandboxv1.OperatingModeSuspended || b.SuspendAction != "Hibernate" {
		t.Errorf("operatingMode %s suspendAction %q, want Suspended Hibernate", obj.Spec.OperatingMode, b.SuspendAction)
	}
	// An object made from kubectl keeps its derived id.
	kubectl := &sandboxv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "a", UID: "u"}}
	if objectSandboxID(kubectl) != SandboxID("default", "a", "u") {
		t.Errorf("objectSandboxID of a kubectl object = %q", objectSandboxID(kubectl))
	}
}

func TestClaimSandbox(t *testing.T) {
	tmpl := &extv1alpha1.SandboxTemplate{Spec: extv1alpha1.SandboxTemplateSpec{
		PodTemplate: &sandboxv1.PodTemplate{Metadata: sandboxv1.PodMetadata{Labels: map[string]string{"app": "t"}}},
		Berth:       sandboxv1.BerthSpec{Image: "i", Env: map[string]string{"A": "template", "B": "template"}},
	}}
	claim := &extv1alpha1.SandboxClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"},
		Spec: extv1alpha1.SandboxClaimSpec{
			Env:                   []extv1alpha1.EnvVar{{Name: "B", Value: "claim"}, {Name: "C", Value: "claim"}},
			AdditionalPodMetadata: sandboxv1.PodMetadata{Labels: map[string]string{"user": "u"}},
		},
	}
	sb := ClaimSandbox(claim, tmpl)
	if sb.Namespace != "ns" || sb.Name != "c" || sb.Spec.Berth.Image != "i" || sb.Spec.OperatingMode != sandboxv1.OperatingModeRunning {
		t.Errorf("Sandbox %s/%s spec %+v", sb.Namespace, sb.Name, sb.Spec)
	}
	if env := sb.Spec.Berth.Env; env["A"] != "template" || env["B"] != "claim" || env["C"] != "claim" {
		t.Errorf("env %v: want the template's with the claim's on top", env)
	}
	if l := sb.Spec.PodTemplate.Metadata.Labels; l["app"] != "t" || l["user"] != "u" {
		t.Errorf("pod labels %v", l)
	}
	if tmpl.Spec.Berth.Env["B"] != "template" || len(tmpl.Spec.PodTemplate.Metadata.Labels) != 1 {
		t.Errorf("the template changed: %+v", tmpl.Spec)
	}
}
