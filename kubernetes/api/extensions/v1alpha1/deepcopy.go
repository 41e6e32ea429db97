package v1alpha1

import (
	"maps"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	sandboxv1 "github.com/berth-sandbox/berth/kubernetes/api/v1beta1"
)

// DeepCopyObject implements runtime.Object.
func (in *SandboxTemplate) DeepCopyObject() runtime.Object { return in.DeepCopy() }

// DeepCopy copies the template and everything it points to.
func (in *SandboxTemplate) DeepCopy() *SandboxTemplate {
	if in == nil {
		return nil
	}
	out := new(SandboxTemplate)
	*out = *in
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	out.Spec = in.Spec.DeepCopy()
	return out
}

// DeepCopy copies the spec (through Sandbox's spec, which holds the same
// fields).
func (in SandboxTemplateSpec) DeepCopy() SandboxTemplateSpec {
	var out sandboxv1.SandboxSpec
	(&sandboxv1.SandboxSpec{PodTemplate: in.PodTemplate, Berth: in.Berth}).DeepCopyInto(&out)
	return SandboxTemplateSpec{PodTemplate: out.PodTemplate, Berth: out.Berth}
}

// DeepCopyObject implements runtime.Object.
func (in *SandboxTemplateList) DeepCopyObject() runtime.Object {
	if in == nil {
		return nil
	}
	out := new(SandboxTemplateList)
	*out = *in
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	if in.Items != nil {
		out.Items = make([]SandboxTemplate, len(in.Items))
		for i := range in.Items {
			out.Items[i] = *in.Items[i].DeepCopy()
		}
	}
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *SandboxClaim) DeepCopyObject() runtime.Object { return in.DeepCopy() }

// DeepCopy copies the claim and everything it points to.
func (in *SandboxClaim) DeepCopy() *SandboxClaim {
	if in == nil {
		return nil
	}
	out := new(SandboxClaim)
	*out = *in
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	if in.Spec.Lifecycle != nil {
		l := *in.Spec.Lifecycle
		l.ShutdownTime = in.Spec.Lifecycle.ShutdownTime.DeepCopy()
		out.Spec.Lifecycle = &l
	}
	out.Spec.AdditionalPodMetadata.Labels = maps.Clone(in.Spec.AdditionalPodMetadata.Labels)
	out.Spec.AdditionalPodMetadata.Annotations = maps.Clone(in.Spec.AdditionalPodMetadata.Annotations)
	out.Spec.Env = append([]EnvVar(nil), in.Spec.Env...)
	if in.Status.Conditions != nil {
		out.Status.Conditions = make([]metav1.Condition, len(in.Status.Conditions))
		for i := range in.Status.Conditions {
			in.Status.Conditions[i].DeepCopyInto(&out.Status.Conditions[i])
		}
	}
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *SandboxClaimList) DeepCopyObject() runtime.Object {
	if in == nil {
		return nil
	}
	out := new(SandboxClaimList)
	*out = *in
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	if in.Items != nil {
		out.Items = make([]SandboxClaim, len(in.Items))
		for i := range in.Items {
			out.Items[i] = *in.Items[i].DeepCopy()
		}
	}
	return out
}
