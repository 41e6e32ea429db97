package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

// GroupVersion is agent-sandbox's extensions group at the version whose
// claim names a template.
var GroupVersion = schema.GroupVersion{Group: "extensions.agents.x-k8s.io", Version: "v1alpha1"}

var (
	schemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}
	// AddToScheme adds SandboxTemplate, SandboxClaim and their lists to a
	// scheme.
	AddToScheme = schemeBuilder.AddToScheme
)

func init() {
	schemeBuilder.Register(&SandboxTemplate{}, &SandboxTemplateList{}, &SandboxClaim{}, &SandboxClaimList{})
}
