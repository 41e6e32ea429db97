package controller

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"google.golang.org/protobuf/types/known/durationpb"

	sandboxv1 "github.com/berth-sandbox/berth/kubernetes/api/v1beta1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// Labels the controller puts on every sandbox it creates, so that berth's
// listings name the object (keys under berth.dev/ are reserved for berth;
// these are the controller's).
const (
	LabelNamespace = "k8s.berth.dev/namespace"
	LabelName      = "k8s.berth.dev/name"
)

// SandboxID is the berth sandbox id of the object namespace/name with uid:
// the namespace and name as far as they fit, then 12 hex digits of
// SHA-256(namespace/name/uid), at most 63 characters of [a-z0-9-]. The
// same object always gives the same id, so a retried create is idempotent
// (berth's creates are idempotent on the id), and an object deleted and
// made again under its name (a new uid) gives a new one.
func SandboxID(namespace, name, uid string) string {
	sum := sha256.Sum256([]byte(namespace + "/" + name + "/" + uid))
	suffix := hex.EncodeToString(sum[:6])
	var b strings.Builder
	for _, r := range strings.ToLower(namespace + "-" + name) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-':
			b.WriteRune(r)
		default: // '.' of DNS subdomain names
			b.WriteByte('-')
		}
	}
	prefix := b.String()
	if max := 63 - 1 - len(suffix); len(prefix) > max {
		prefix = prefix[:max]
	}
	return strings.Trim(prefix, "-") + "-" + suffix
}

// Image is the image of sb: spec.berth.image, else the first container's
// image of spec.podTemplate; empty when neither names one.
func Image(sb *sandboxv1.Sandbox) string {
	if sb.Spec.Berth.Image != "" {
		return sb.Spec.Berth.Image
	}
	if pt := sb.Spec.PodTemplate; pt != nil && len(pt.Spec.Containers) > 0 {
		return pt.Spec.Containers[0].Image
	}
	return ""
}

// CreateRequest is berth's CreateSandboxRequest for sb with sandbox id id.
// It fails, naming the field, for a value the CRD's schema lets through but
// berth's API has no word for (an enum the schema and this code disagree
// on); berthd checks the rest and answers INVALID_ARGUMENT naming the field.
func CreateRequest(sb *sandboxv1.Sandbox, id string) (*berthv1.CreateSandboxRequest, error) {
	b := sb.Spec.Berth
	req := &berthv1.CreateSandboxRequest{
		SandboxId: id,
		Image:     Image(sb),
		Runtime:   b.Runtime,
		User:      b.User,
		Workdir:   b.Workdir,
		Env:       b.Env,
		Labels:    map[string]string{LabelNamespace: sb.Namespace, LabelName: sb.Name},
	}
	if req.Image == "" {
		return nil, fmt.Errorf("spec.berth.image: empty, and spec.podTemplate names no container image")
	}
	for k, v := range b.Labels {
		req.Labels[k] = v
	}
	if r := b.Resources; r != nil {
		req.Resources = &berthv1.Resources{
			CpuMillis:   uint64(max(r.CPUMillis, 0)),
			MemoryBytes: uint64(max(r.MemoryBytes, 0)),
			DiskBytes:   uint64(max(r.DiskBytes, 0)),
			PidsLimit:   uint64(max(r.PidsLimit, 0)),
		}
	}
	if b.IdleTimeout != nil {
		req.IdleTimeout = durationpb.New(b.IdleTimeout.Duration)
	}
	if b.MaxLifetime != nil {
		req.MaxLifetime = durationpb.New(b.MaxLifetime.Duration)
	}
	switch b.IdleAction {
	case "":
	case "Delete":
		req.IdleAction = berthv1.IdleAction_IDLE_ACTION_DELETE
	case "Pause":
		req.IdleAction = berthv1.IdleAction_IDLE_ACTION_PAUSE
	case "Hibernate":
		req.IdleAction = berthv1.IdleAction_IDLE_ACTION_HIBERNATE
	default:
		return nil, fmt.Errorf("spec.berth.idleAction: %q is none of Delete, Pause, Hibernate", b.IdleAction)
	}
	if n := b.Network; n != nil {
		req.Network = &berthv1.NetworkPolicy{Allow: n.Allow}
		switch n.Mode {
		case "", "None":
			req.Network.Mode = berthv1.NetworkMode_NETWORK_MODE_NONE
		case "Egress":
			req.Network.Mode = berthv1.NetworkMode_NETWORK_MODE_EGRESS
		default:
			return nil, fmt.Errorf("spec.berth.network.mode: %q is neither None nor Egress", n.Mode)
		}
	}
	switch b.SuspendAction {
	case "", "Pause", "Hibernate":
	default:
		return nil, fmt.Errorf("spec.berth.suspendAction: %q is neither Pause nor Hibernate", b.SuspendAction)
	}
	return req, nil
}

// phase is the status.berth.phase of berth's state.
func phase(s berthv1.SandboxState) string {
	switch s {
	case berthv1.SandboxState_SANDBOX_STATE_RUNNING:
		return sandboxv1.PhaseRunning
	case berthv1.SandboxState_SANDBOX_STATE_STARTING:
		return sandboxv1.PhaseStarting
	case berthv1.SandboxState_SANDBOX_STATE_PAUSED:
		return sandboxv1.PhasePaused
	case berthv1.SandboxState_SANDBOX_STATE_HIBERNATED:
		return sandboxv1.PhaseHibernated
	case berthv1.SandboxState_SANDBOX_STATE_STOPPING:
		return sandboxv1.PhaseStopping
	case berthv1.SandboxState_SANDBOX_STATE_STOPPED:
		return sandboxv1.PhaseStopped
	}
	return sandboxv1.PhasePending
}
