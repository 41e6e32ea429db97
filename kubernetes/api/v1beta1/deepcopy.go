package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// DeepCopyObject implements runtime.Object.
func (in *Sandbox) DeepCopyObject() runtime.Object { return in.DeepCopy() }

// DeepCopy copies the Sandbox and everything it points to.
func (in *Sandbox) DeepCopy() *Sandbox {
	if in == nil {
		return nil
	}
	out := new(Sandbox)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyInto copies the Sandbox into out.
func (in *Sandbox) DeepCopyInto(out *Sandbox) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	in.Spec.DeepCopyInto(&out.Spec)
	in.Status.DeepCopyInto(&out.Status)
}

// DeepCopyObject implements runtime.Object.
func (in *SandboxList) DeepCopyObject() runtime.Object { return in.DeepCopy() }

// DeepCopy copies the list and its items.
func (in *SandboxList) DeepCopy() *SandboxList {
	if in == nil {
		return nil
	}
	out := new(SandboxList)
	*out = *in
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	if in.Items != nil {
		out.Items = make([]Sandbox, len(in.Items))
		for i := range in.Items {
			in.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
	return out
}

// DeepCopyInto copies the spec into out.
func (in *SandboxSpec) DeepCopyInto(out *SandboxSpec) {
	*out = *in
	if in.PodTemplate != nil {
		out.PodTemplate = new(PodTemplate)
		out.PodTemplate.Metadata.Labels = copyMap(in.PodTemplate.Metadata.Labels)
		out.PodTemplate.Metadata.Annotations = copyMap(in.PodTemplate.Metadata.Annotations)
		in.PodTemplate.Spec.DeepCopyInto(&out.PodTemplate.Spec)
	}
	if in.ShutdownTime != nil {
		out.ShutdownTime = in.ShutdownTime.DeepCopy()
	}
	b := &out.Berth
	b.Env = copyMap(in.Berth.Env)
	b.Labels = copyMap(in.Berth.Labels)
	if in.Berth.Resources != nil {
		r := *in.Berth.Resources
		b.Resources = &r
	}
	if in.Berth.IdleTimeout != nil {
		d := *in.Berth.IdleTimeout
		b.IdleTimeout = &d
	}
	if in.Berth.MaxLifetime != nil {
		d := *in.Berth.MaxLifetime
		b.MaxLifetime = &d
	}
	if in.Berth.Network != nil {
		n := *in.Berth.Network
		n.Allow = append([]string(nil), in.Berth.Network.Allow...)
		b.Network = &n
	}
}

// DeepCopyInto copies the status into out.
func (in *SandboxStatus) DeepCopyInto(out *SandboxStatus) {
	*out = *in
	if in.Conditions != nil {
		out.Conditions = make([]metav1.Condition, len(in.Conditions))
		for i := range in.Conditions {
			in.Conditions[i].DeepCopyInto(&out.Conditions[i])
		}
	}
}

func copyMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
