package v1beta1_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	extv1alpha1 "github.com/berth-sandbox/berth/kubernetes/api/extensions/v1alpha1"
	sandboxv1 "github.com/berth-sandbox/berth/kubernetes/api/v1beta1"
)

// TestCRDSchemasMatchTypes: every field a fully set SandboxTemplate and
// SandboxClaim marshal to is in the schema of
// deploy/kubernetes/sandboxtemplate-crd.yaml and sandboxclaim-crd.yaml (the
// API server would prune it otherwise), at agent-sandbox's group and
// version.
func TestCRDSchemasMatchTypes(t *testing.T) {
	now := metav1.NewTime(time.Unix(1700000000, 0))
	meta := sandboxv1.PodMetadata{Labels: map[string]string{"a": "b"}, Annotations: map[string]string{"a": "b"}}
	berth := sandboxv1.BerthSpec{
		Image: "i", Runtime: "runc", User: "u", Workdir: "/w", Env: map[string]string{"k": "v"}, Labels: map[string]string{"k": "v"},
		Resources:   &sandboxv1.Resources{CPUMillis: 1, MemoryBytes: 1, DiskBytes: 1, PidsLimit: 1},
		IdleTimeout: &metav1.Duration{Duration: time.Second}, MaxLifetime: &metav1.Duration{Duration: time.Second},
		IdleAction: "Pause", SuspendAction: "Pause", Network: &sandboxv1.Network{Mode: "None", Allow: []string{"x"}},
	}
	for file, obj := range map[string]any{
		"sandboxtemplate-crd.yaml": extv1alpha1.SandboxTemplate{Spec: extv1alpha1.SandboxTemplateSpec{
			PodTemplate: &sandboxv1.PodTemplate{Metadata: meta}, Berth: berth,
		}},
		"sandboxclaim-crd.yaml": extv1alpha1.SandboxClaim{
			Spec: extv1alpha1.SandboxClaimSpec{
				TemplateRef:           extv1alpha1.SandboxTemplateRef{Name: "t"},
				Lifecycle:             &extv1alpha1.Lifecycle{ShutdownTime: &now, ShutdownPolicy: "Retain"},
				AdditionalPodMetadata: meta,
				Env:                   []extv1alpha1.EnvVar{{Name: "n", Value: "v", ContainerName: "c"}},
			},
			Status: extv1alpha1.SandboxClaimStatus{
				Conditions: []metav1.Condition{{Type: "Ready", Status: "True", Reason: "R", Message: "m", LastTransitionTime: now, ObservedGeneration: 1}},
				Sandbox:    extv1alpha1.ClaimedSandbox{Name: "s"},
			},
		},
	} {
		b, err := os.ReadFile(filepath.Join("..", "..", "..", "deploy", "kubernetes", file))
		if err != nil {
			t.Fatal(err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(b, &crd); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		gv := extv1alpha1.GroupVersion
		if crd.Spec.Group != gv.Group || len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Name != gv.Version {
			t.Fatalf("%s: %s %v: want the one version %s", file, crd.Spec.Group, crd.Spec.Versions, gv)
		}
		raw, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		var doc map[string]any
		if err := json.Unmarshal(raw, &doc); err != nil {
			t.Fatal(err)
		}
		schema := crd.Spec.Versions[0].Schema.OpenAPIV3Schema
		var missing []string
		for _, top := range []string{"spec", "status"} {
			if doc[top] != nil {
				sandboxv1.Walk(top, doc[top], schema.Properties[top], &missing)
			}
		}
		for _, p := range missing {
			t.Errorf("%s: %s: marshalled by the Go types, not in the CRD's schema (the API server would prune it)", file, p)
		}
	}
}
