package v1beta1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

// GroupVersion is agent-sandbox's group and version of Sandbox.
var GroupVersion = schema.GroupVersion{Group: "agents.x-k8s.io", Version: "v1beta1"}

var (
	schemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}
	// AddToScheme adds Sandbox and SandboxList to a scheme.
	AddToScheme = schemeBuilder.AddToScheme
)

func init() {
	schemeBuilder.Register(&Sandbox{}, &SandboxList{})
}
