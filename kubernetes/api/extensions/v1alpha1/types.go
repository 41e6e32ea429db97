// Package v1alpha1 is berth's SandboxTemplate and SandboxClaim:
// extensions.agents.x-k8s.io/v1alpha1 as kubernetes-sigs/agent-sandbox
// publishes them, the version whose claim names a template
// (spec.sandboxTemplateRef; agent-sandbox's v1beta1 claim names a warm pool
// instead, and berth has no warm pool object: berthd's warm pool is its
// --warm-pool flag). A template's spec is a Sandbox's podTemplate and berth
// key; a claim becomes a Sandbox object of that spec, owned by the claim.
// deploy/kubernetes/sandboxtemplate-crd.yaml and sandboxclaim-crd.yaml are
// their schemas, kept in step by TestCRDSchemasMatchTypes.
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sandboxv1 "github.com/berth-sandbox/berth/kubernetes/api/v1beta1"
)

// SandboxTemplate is the spec of the sandboxes its claims make.
type SandboxTemplate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec SandboxTemplateSpec `json:"spec"`
}

// SandboxTemplateList is a list of SandboxTemplate objects.
type SandboxTemplateList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxTemplate `json:"items"`
}

// SandboxTemplateSpec is agent-sandbox's template spec (podTemplate) with
// berth's fields under "berth": what a Sandbox's spec holds of them.
type SandboxTemplateSpec struct {
	// PodTemplate: Sandbox spec.podTemplate (berth reads the first
	// container's image when berth.image is empty).
	PodTemplate *sandboxv1.PodTemplate `json:"podTemplate,omitempty"`
	// Berth: Sandbox spec.berth.
	Berth sandboxv1.BerthSpec `json:"berth,omitempty"`
}

// SandboxClaim asks for one sandbox made from a template.
type SandboxClaim struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   SandboxClaimSpec   `json:"spec"`
	Status SandboxClaimStatus `json:"status,omitempty"`
}

// SandboxClaimList is a list of SandboxClaim objects.
type SandboxClaimList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxClaim `json:"items"`
}

// SandboxClaimSpec is agent-sandbox's v1alpha1 claim spec.
type SandboxClaimSpec struct {
	// TemplateRef names the SandboxTemplate, in the claim's namespace.
	TemplateRef SandboxTemplateRef `json:"sandboxTemplateRef"`
	// Lifecycle is agent-sandbox's shutdownTime and shutdownPolicy:
	// accepted and stored, not acted on yet (spec.berth.maxLifetime of the
	// template bounds a sandbox's life).
	Lifecycle *Lifecycle `json:"lifecycle,omitempty"`
	// AdditionalPodMetadata: labels and annotations added to the Sandbox's
	// spec.podTemplate.metadata.
	AdditionalPodMetadata sandboxv1.PodMetadata `json:"additionalPodMetadata,omitempty"`
	// Env is added to the template's spec.berth.env (a claim's value wins).
	Env []EnvVar `json:"env,omitempty"`
}

// SandboxTemplateRef names a SandboxTemplate.
type SandboxTemplateRef struct {
	Name string `json:"name"`
}

// Lifecycle is agent-sandbox's claim lifecycle.
type Lifecycle struct {
	ShutdownTime   *metav1.Time `json:"shutdownTime,omitempty"`
	ShutdownPolicy string       `json:"shutdownPolicy,omitempty"`
}

// EnvVar is one environment variable of a claim. ContainerName is
// agent-sandbox's; a berth sandbox has one environment, so it is ignored.
type EnvVar struct {
	Name          string `json:"name"`
	Value         string `json:"value"`
	ContainerName string `json:"containerName,omitempty"`
}

// SandboxClaimStatus is agent-sandbox's claim status.
type SandboxClaimStatus struct {
	// Conditions: Ready, as the Sandbox's Ready (or False with
	// TemplateNotFound, SandboxNameTaken).
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Sandbox names the Sandbox object made for the claim.
	Sandbox ClaimedSandbox `json:"sandbox,omitempty"`
}

// ClaimedSandbox is status.sandbox of a claim.
type ClaimedSandbox struct {
	// Name of the Sandbox object, in the claim's namespace.
	Name string `json:"name,omitempty"`
}

// Condition reasons of a claim's Ready beyond the Sandbox's own.
const (
	// ReasonTemplateNotFound: spec.sandboxTemplateRef names no template.
	ReasonTemplateNotFound = "TemplateNotFound"
	// ReasonSandboxNameTaken: a Sandbox of the claim's name exists and
	// is not the claim's.
	ReasonSandboxNameTaken = "SandboxNameTaken"
)
