package v1beta1

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// TestCRDSchemaMatchesTypes: every field a fully set Sandbox marshals to is
// in deploy/kubernetes/sandbox-crd.yaml's schema (the API server prunes
// what the schema lacks, so a field missing there is silently lost), and
// every field of the schema's berth keys is one of the Go types'.
func TestCRDSchemaMatchesTypes(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "deploy", "kubernetes", "sandbox-crd.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(b, &crd); err != nil {
		t.Fatal(err)
	}
	if crd.Spec.Group != GroupVersion.Group || len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Name != GroupVersion.Version {
		t.Fatalf("CRD %s %v: want the one version %s", crd.Spec.Group, crd.Spec.Versions, GroupVersion)
	}
	schema := crd.Spec.Versions[0].Schema.OpenAPIV3Schema
	now := metav1.NewTime(time.Unix(1700000000, 0))
	full := Sandbox{
		Spec: SandboxSpec{
			OperatingMode: OperatingModeSuspended, ShutdownTime: &now, ShutdownPolicy: "Retain",
			PodTemplate: &PodTemplate{Metadata: PodMetadata{Labels: map[string]string{"a": "b"}, Annotations: map[string]string{"a": "b"}}},
			Berth: BerthSpec{
				Image: "i", Runtime: "runc", User: "u", Workdir: "/w", Env: map[string]string{"k": "v"}, Labels: map[string]string{"k": "v"},
				Resources:   &Resources{CPUMillis: 1, MemoryBytes: 1, DiskBytes: 1, PidsLimit: 1},
				IdleTimeout: &metav1.Duration{Duration: time.Second}, MaxLifetime: &metav1.Duration{Duration: time.Second},
				IdleAction: "Pause", SuspendAction: "Pause", Network: &Network{Mode: "None", Allow: []string{"x"}},
			},
		},
		Status: SandboxStatus{
			Conditions: []metav1.Condition{{Type: "Ready", Status: "True", Reason: "R", Message: "m", LastTransitionTime: now, ObservedGeneration: 1}},
			NodeName:   "n",
			Berth:      BerthStatus{SandboxID: "s", Phase: "Running", AgentBootID: "b", Image: "i", ObservedGeneration: 1},
		},
	}
	raw, err := json.Marshal(full)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, top := range []string{"spec", "status"} {
		walk(top, doc[top], schema.Properties[top], &paths)
	}
	for _, p := range paths {
		t.Errorf("%s: marshalled by the Go types, not in the CRD's schema (the API server would prune it)", p)
	}
	// The other way: the schema's berth fields are the Go types' (a field
	// only in the schema would be accepted and never read).
	for _, top := range []string{"spec", "status"} {
		var want []string
		for k := range doc[top].(map[string]any)["berth"].(map[string]any) {
			want = append(want, k)
		}
		var have []string
		for k := range schema.Properties[top].Properties["berth"].Properties {
			have = append(have, k)
		}
		sort.Strings(want)
		sort.Strings(have)
		if strings.Join(want, ",") != strings.Join(have, ",") {
			t.Errorf("%s.berth: Go fields %v, schema fields %v", top, want, have)
		}
	}
}

// walk adds to missing the paths of v that s does not describe.
func walk(path string, v any, s apiextensionsv1.JSONSchemaProps, missing *[]string) {
	if s.XPreserveUnknownFields != nil && *s.XPreserveUnknownFields {
		return
	}
	switch v := v.(type) {
	case map[string]any:
		if s.AdditionalProperties != nil {
			return
		}
		for k, child := range v {
			cs, ok := s.Properties[k]
			if !ok {
				*missing = append(*missing, path+"."+k)
				continue
			}
			walk(path+"."+k, child, cs, missing)
		}
	case []any:
		for _, child := range v {
			if s.Items == nil || s.Items.Schema == nil {
				*missing = append(*missing, path+"[]")
				return
			}
			walk(path+"[]", child, *s.Items.Schema, missing)
		}
	}
}
