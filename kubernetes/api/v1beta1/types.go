// Package v1beta1 is berth's Sandbox custom resource: agents.x-k8s.io/v1beta1
// Sandbox as kubernetes-sigs/agent-sandbox publishes it (spec.podTemplate,
// spec.operatingMode, spec.shutdownTime and spec.shutdownPolicy;
// status.conditions and status.nodeName), with berth's own fields under the
// key "berth" of spec and status. deploy/kubernetes/sandbox-crd.yaml is its
// schema; the two are kept in step by TestCRDSchemaMatchesTypes.
package v1beta1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// OperatingMode is agent-sandbox's spec.operatingMode.
type OperatingMode string

const (
	// OperatingModeRunning: the sandbox runs (the default).
	OperatingModeRunning OperatingMode = "Running"
	// OperatingModeSuspended: the sandbox is paused or hibernated, as
	// spec.berth.suspendAction says; its files are kept.
	OperatingModeSuspended OperatingMode = "Suspended"
)

// Condition types and reasons of status.conditions. Ready and Suspended are
// agent-sandbox's types; the reasons beyond agent-sandbox's are berth's.
const (
	ConditionReady     = "Ready"
	ConditionSuspended = "Suspended"

	// ReasonRunning: Ready is True, the sandbox's agent answers.
	ReasonRunning = "SandboxRunning"
	// ReasonStarting: the create was sent; the agent has not answered yet.
	ReasonStarting = "SandboxStarting"
	// ReasonSuspended is agent-sandbox's reason for Ready False while
	// suspended.
	ReasonSuspended = "SandboxSuspended"
	// ReasonNotSuspended is agent-sandbox's reason for Suspended False.
	ReasonNotSuspended = "NotSuspended"
	// ReasonPaused and ReasonHibernated say how a suspended sandbox rests.
	ReasonPaused     = "Paused"
	ReasonHibernated = "Hibernated"
	// ReasonGone: berth no longer holds the sandbox (its idle timeout or
	// lifetime ended it, or it was deleted through berth's API); the
	// object stays until it is deleted.
	ReasonGone = "SandboxGone"
	// ReasonInvalidSpec: the object names no image.
	ReasonInvalidSpec = "InvalidSpec"
	// ReasonExpired is agent-sandbox's reason for Ready False once
	// spec.shutdownTime has come and the sandbox was deleted (shutdownPolicy
	// Retain).
	ReasonExpired = "SandboxExpired"
	// ReasonNodeLost: the berthd node holding the sandbox left the fleet
	// (its lease ended: killed, cut off from the fleet's store, or
	// stopped); berth answers SANDBOX_UNREACHABLE, cause NODE_LOST. The
	// sandbox may still run there and is Ready again when the node comes
	// back under its node id.
	ReasonNodeLost = "NodeLost"
	// ReasonNodeUnreachable: the node's lease runs but it does not answer
	// (SANDBOX_UNREACHABLE, cause NODE_UNREACHABLE).
	ReasonNodeUnreachable = "NodeUnreachable"
	// Any other reason of a False Ready is the reason of berth's typed
	// error (docs/errors.md), e.g. IMAGE_NOT_FOUND, FLEET_BUSY.
)

// Phases of status.berth.phase: berth's sandbox state.
const (
	PhasePending    = "Pending"
	PhaseStarting   = "Starting"
	PhaseRunning    = "Running"
	PhasePaused     = "Paused"
	PhaseHibernated = "Hibernated"
	PhaseStopping   = "Stopping"
	PhaseStopped    = "Stopped"
	PhaseGone       = "Gone"
	PhaseFailed     = "Failed"
	// PhaseExpired: spec.shutdownTime came and the sandbox was deleted;
	// the object stays (shutdownPolicy Retain).
	PhaseExpired = "Expired"
)

// Values of spec.shutdownPolicy, agent-sandbox's.
const (
	// ShutdownPolicyRetain (the default) keeps the object at shutdownTime:
	// its sandbox is deleted, its status says SandboxExpired.
	ShutdownPolicyRetain = "Retain"
	// ShutdownPolicyDelete deletes the object at shutdownTime, after its
	// sandbox.
	ShutdownPolicyDelete = "Delete"
)

// Finalizer is the finalizer the controller puts on every Sandbox it
// reconciles: the object is deleted only after berth's sandbox is.
const Finalizer = "berth.dev/sandbox"

// Sandbox is one berth sandbox as a Kubernetes object.
type Sandbox struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   SandboxSpec   `json:"spec"`
	Status SandboxStatus `json:"status,omitempty"`
}

// SandboxList is a list of Sandbox objects.
type SandboxList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Sandbox `json:"items"`
}

// SandboxSpec is agent-sandbox's spec with berth's fields under "berth".
type SandboxSpec struct {
	// PodTemplate is agent-sandbox's pod template. berth reads the image of
	// its first container when spec.berth.image is empty; the rest of it
	// is kept, not used (berth runs no pods).
	PodTemplate *PodTemplate `json:"podTemplate,omitempty"`
	// OperatingMode: Running (default) or Suspended.
	OperatingMode OperatingMode `json:"operatingMode,omitempty"`
	// ShutdownTime is agent-sandbox's expiry (RFC 3339): when it comes the
	// controller deletes the berth sandbox (an object whose shutdownTime
	// has passed at create gets none) and applies ShutdownPolicy to the
	// object. Unset: the sandbox lives until the object is deleted (or
	// spec.berth.maxLifetime ends it).
	ShutdownTime *metav1.Time `json:"shutdownTime,omitempty"`
	// ShutdownPolicy is Retain (default: the object stays, Ready False,
	// reason SandboxExpired, status.berth.phase Expired) or Delete (the
	// object is deleted after its sandbox).
	ShutdownPolicy string `json:"shutdownPolicy,omitempty"`
	// Berth holds berth's own fields.
	Berth BerthSpec `json:"berth,omitempty"`
}

// PodTemplate is agent-sandbox's podTemplate.
type PodTemplate struct {
	Metadata PodMetadata    `json:"metadata,omitempty"`
	Spec     corev1.PodSpec `json:"spec"`
}

// PodMetadata is the labels and annotations of a pod template.
type PodMetadata struct {
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// BerthSpec is what berth's CreateSandboxRequest takes (docs/api.md). Every
// field is read at create; changing one later has no effect on a sandbox
// that exists, except operatingMode above.
type BerthSpec struct {
	// Image is an image reference in berthd's image store
	// (CreateSandboxRequest.image); defaults to the first container's
	// image of spec.podTemplate.
	Image string `json:"image,omitempty"`
	// Runtime is "runc" (default) or "gvisor".
	Runtime string `json:"runtime,omitempty"`
	// User is the workload user, "uid[:gid]" or "name[:group]".
	User string `json:"user,omitempty"`
	// Workdir is the working directory of processes started without one.
	Workdir string `json:"workdir,omitempty"`
	// Env is the environment of every process, on top of the image's.
	Env map[string]string `json:"env,omitempty"`
	// Resources limits the sandbox; unset fields take berthd's defaults.
	Resources *Resources `json:"resources,omitempty"`
	// IdleTimeout and MaxLifetime are durations ("10m", "2h").
	IdleTimeout *metav1.Duration `json:"idleTimeout,omitempty"`
	MaxLifetime *metav1.Duration `json:"maxLifetime,omitempty"`
	// IdleAction is what the idle timeout does: Delete, Pause or Hibernate.
	IdleAction string `json:"idleAction,omitempty"`
	// SuspendAction is what operatingMode Suspended does: Pause (default:
	// memory kept, processes frozen) or Hibernate (processes end, files
	// kept, memory released).
	SuspendAction string `json:"suspendAction,omitempty"`
	// Network is the sandbox's network policy.
	Network *Network `json:"network,omitempty"`
	// Labels are berth labels of the sandbox (keys under berth.dev/ are
	// reserved); node.berth.dev/KEY=VALUE places it (docs/fleet.md).
	Labels map[string]string `json:"labels,omitempty"`
}

// Resources are berth's limits (CreateSandboxRequest.resources).
type Resources struct {
	// CPUMillis: thousandths of a CPU.
	CPUMillis int64 `json:"cpuMillis,omitempty"`
	// MemoryBytes, DiskBytes: bytes.
	MemoryBytes int64 `json:"memoryBytes,omitempty"`
	DiskBytes   int64 `json:"diskBytes,omitempty"`
	// PidsLimit: processes and threads.
	PidsLimit int64 `json:"pidsLimit,omitempty"`
}

// Network is berth's network policy: mode None (default) or Egress, with
// an allow-list of hosts, CIDRs or host:port.
type Network struct {
	Mode  string   `json:"mode,omitempty"`
	Allow []string `json:"allow,omitempty"`
}

// SandboxStatus is agent-sandbox's status with berth's fields under "berth".
type SandboxStatus struct {
	// Conditions: Ready and Suspended.
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// NodeName is the berthd node that holds the sandbox (Sandbox.node_id
	// in berth's API): the fleet's node id, which on Kubernetes is the
	// node's name.
	NodeName string `json:"nodeName,omitempty"`
	// Berth holds berth's own status.
	Berth BerthStatus `json:"berth,omitempty"`
}

// BerthStatus is what berth reports of the sandbox.
type BerthStatus struct {
	// SandboxID is the id of the sandbox in berth's API (Exec, files):
	// derived from the object's namespace, name and uid.
	SandboxID string `json:"sandboxID,omitempty"`
	// Phase is the sandbox's state: Pending, Starting, Running, Paused,
	// Hibernated, Stopping, Stopped, Gone, Failed or Expired.
	Phase string `json:"phase,omitempty"`
	// AgentBootID is random per start of the sandbox's agent: it changes
	// when the agent restarted (after a hibernation, say).
	AgentBootID string `json:"agentBootID,omitempty"`
	// Image is the image the sandbox was created from.
	Image string `json:"image,omitempty"`
	// ObservedGeneration is the metadata.generation last reconciled.
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}
