package runtime

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Label keys of the sandbox record beyond those in runtime.go. Durations are
// Go duration strings, times RFC 3339 with nanoseconds in UTC.
const (
	labelUser        = LabelPrefix + "user"         // "uid:gid"
	labelWorkDir     = LabelPrefix + "workdir"      // absolute path
	labelIdleTimeout = LabelPrefix + "idle-timeout" // duration
	labelMaxLifetime = LabelPrefix + "max-lifetime" // duration
	labelEnvKeys     = LabelPrefix + "env-keys"     // JSON array of sorted keys
	labelEnvHash     = LabelPrefix + "env-sha256"   // EnvDigest
	labelSpecHash    = LabelPrefix + "spec-sha256"  // SandboxSpec.Digest
	labelPool        = LabelPrefix + "pool"         // "true" on unclaimed warm-pool members
	labelExpired     = LabelPrefix + "expired"      // reason, set just before removal
	labelHoldUntil   = LabelPrefix + "hold-until"   // time
	labelShm         = LabelPrefix + "shm-bytes"    // decimal bytes
	labelIdleAction  = LabelPrefix + "idle-action"  // IdlePause or IdleHibernate; absent for IdleDelete
	labelHibernated  = LabelPrefix + "hibernated"   // HibernatedMemoryKept or HibernatedProcessesEnded while hibernated; absent otherwise
	// labelCheckpointBytes is the size in bytes of a gVisor sandbox's
	// checkpoint image while it is hibernated with its memory; absent
	// otherwise (Promised counts it against the disk).
	labelCheckpointBytes = LabelPrefix + "checkpoint-bytes"
	// LabelOwner holds the principal that created the sandbox (package
	// server/auth); absent on warm-pool members no one claimed and on
	// sandboxes of a berthd that did not record owners.
	LabelOwner = LabelPrefix + "owner"
)

// DefaultWorkDir is the working directory of a spec that names none.
const DefaultWorkDir = "/workspace"

// MaxEnvKeysLabelBytes bounds the JSON list of env keys kept in a label
// (containerd limits a label to 4096 bytes with its key).
const MaxEnvKeysLabelBytes = 4000

// runtime returns the spec's runtime, RuntimeRunc for "".
func (s SandboxSpec) runtime() string {
	if s.Runtime == "" {
		return RuntimeRunc
	}
	return s.Runtime
}

// userns reports whether the sandbox gets a user namespace of its own:
// unless it asked for the host's, and not under gVisor, whose sentry runs
// as an unprivileged host user in a user namespace of its own already.
func (s SandboxSpec) userns() bool { return !s.HostUsers && s.runtime() == RuntimeRunc }

func (s SandboxSpec) workDir() string {
	if s.WorkDir == "" {
		return DefaultWorkDir
	}
	return s.WorkDir
}

// envList renders env as sorted "KEY=value" strings.
func envList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}

// EnvKeysJSON returns the label value listing env's keys, sorted.
func EnvKeysJSON(env map[string]string) string {
	b, _ := json.Marshal(slices.Sorted(maps.Keys(env)))
	return string(b)
}

// EnvDigest returns a SHA-256 over env's sorted entries, "" for no env. It
// lets a repeated create compare env without storing values in labels.
func EnvDigest(env map[string]string) string {
	if len(env) == 0 {
		return ""
	}
	h := sha256.New()
	for _, kv := range envList(env) {
		h.Write([]byte(kv))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Digest returns a SHA-256 over everything a caller chose in the spec —
// image, labels, env, limits, user, working directory, idle timeout and
// maximum lifetime — but not the id or Pooled. Two specs with equal digests
// create equal sandboxes.
func (s SandboxSpec) Digest() string {
	h := sha256.New()
	field := func(name, value string) { fmt.Fprintf(h, "%s=%q\n", name, value) }
	field("image", s.Image)
	for _, k := range slices.Sorted(maps.Keys(s.Labels)) {
		field("label."+k, s.Labels[k])
	}
	field("env", EnvDigest(s.Env))
	field("pids", strconv.FormatUint(s.PidsLimit, 10))
	field("cpu", strconv.FormatUint(s.CPUMillis, 10))
	field("memory", strconv.FormatUint(s.MemoryBytes, 10))
	field("nofile", strconv.FormatUint(s.OpenFiles, 10))
	field("host-users", strconv.FormatBool(s.HostUsers))
	field("runtime", s.runtime())
	if s.DiskBytes > 0 {
		// Only when set, so that digests of specs without a disk quota
		// stay what they were before disk quotas existed.
		field("disk", strconv.FormatUint(s.DiskBytes, 10))
	}
	if s.shmBytes() != DefaultShmBytes {
		// Only when set: the digests of sandboxes recorded before
		// shm_bytes existed stay what they were.
		field("shm", strconv.FormatUint(s.shmBytes(), 10))
	}
	if s.FromSnapshot != "" {
		field("from-snapshot", s.FromSnapshot)
	}
	if len(s.Volumes) > 0 {
		field("volumes", volumesLabel(s.Volumes))
	}
	field("user", fmt.Sprintf("%d:%d", s.UID, s.GID))
	field("workdir", s.workDir())
	field("idle", s.IdleTimeout.String())
	field("lifetime", s.MaxLifetime.String())
	s.Network.digestFields(field)
	if s.idleAction() != IdleDelete {
		// Only when set: digests of sandboxes recorded before idle
		// actions existed stay what they were.
		field("idle-action", s.idleAction())
	}
	return hex.EncodeToString(h.Sum(nil))
}

// labels returns the container labels recording spec, created at now.
func (s SandboxSpec) labels(now time.Time) map[string]string {
	labels := make(map[string]string, len(s.Labels)+16)
	for k, v := range s.Labels {
		labels[k] = v
	}
	labels[labelSandbox] = "true"
	labels[labelImage] = s.Image
	labels[labelCreatedAt] = now.UTC().Format(time.RFC3339Nano)
	labels[labelPidsLimit] = strconv.FormatUint(s.PidsLimit, 10)
	labels[labelCPUMillis] = strconv.FormatUint(s.CPUMillis, 10)
	labels[labelMemory] = strconv.FormatUint(s.MemoryBytes, 10)
	labels[labelOpenFiles] = strconv.FormatUint(s.OpenFiles, 10)
	labels[labelRuntime] = s.runtime()
	if s.HostUsers {
		labels[labelHostUsers] = "true"
	}
	labels[labelDisk] = strconv.FormatUint(s.DiskBytes, 10)
	labels[labelShm] = strconv.FormatUint(s.shmBytes(), 10)
	labels[labelUser] = fmt.Sprintf("%d:%d", s.UID, s.GID)
	labels[labelWorkDir] = s.workDir()
	labels[labelIdleTimeout] = s.IdleTimeout.String()
	labels[labelMaxLifetime] = s.MaxLifetime.String()
	if s.idleAction() != IdleDelete {
		labels[labelIdleAction] = s.idleAction()
	}
	if s.FromSnapshot != "" {
		labels[labelFromSnapshot] = s.FromSnapshot
	}
	if len(s.Volumes) > 0 {
		labels[labelVolumes] = volumesLabel(s.Volumes)
	}
	if s.Fork.Parent != "" {
		labels[labelForkOf] = s.Fork.Parent
		labels[labelForkCount] = strconv.Itoa(s.Fork.Count)
		if s.Fork.Memory {
			labels[labelForkMemory] = "true"
		}
		if s.Fork.RequestID != "" {
			labels[labelForkRequest] = s.Fork.RequestID
		}
	}
	if len(s.Env) > 0 {
		labels[labelEnvKeys] = EnvKeysJSON(s.Env)
		labels[labelEnvHash] = EnvDigest(s.Env)
	}
	labels[labelSpecHash] = s.Digest()
	if s.Pooled {
		labels[labelPool] = "true"
	}
	if s.Owner != "" {
		labels[LabelOwner] = s.Owner
	}
	s.Network.addLabels(labels)
	return labels
}

// decodeLabels fills the record fields kept in labels.go's labels.
func (sb *Sandbox) decodeLabels(labels map[string]string) {
	if u, g, ok := strings.Cut(labels[labelUser], ":"); ok {
		uid, _ := strconv.ParseUint(u, 10, 32)
		gid, _ := strconv.ParseUint(g, 10, 32)
		sb.UID, sb.GID = uint32(uid), uint32(gid)
	}
	sb.ShmBytes, _ = strconv.ParseUint(labels[labelShm], 10, 64)
	if sb.ShmBytes == 0 {
		sb.ShmBytes = DefaultShmBytes // recorded before shm_bytes existed
	}
	sb.WorkDir = labels[labelWorkDir]
	if sb.WorkDir == "" {
		sb.WorkDir = DefaultWorkDir
	}
	sb.IdleTimeout, _ = time.ParseDuration(labels[labelIdleTimeout])
	sb.MaxLifetime, _ = time.ParseDuration(labels[labelMaxLifetime])
	if v := labels[labelEnvKeys]; v != "" {
		_ = json.Unmarshal([]byte(v), &sb.EnvKeys)
	}
	sb.EnvHash = labels[labelEnvHash]
	sb.SpecHash = labels[labelSpecHash]
	sb.Pooled = labels[labelPool] == "true"
	sb.Owner = labels[LabelOwner]
	sb.Network = decodeNetwork(labels)
	sb.Expired = labels[labelExpired]
	sb.HoldUntil, _ = time.Parse(time.RFC3339Nano, labels[labelHoldUntil])
	sb.FromSnapshot = labels[labelFromSnapshot]
	sb.Volumes = decodeVolumesLabel(labels[labelVolumes])
	if sb.Fork.Parent = labels[labelForkOf]; sb.Fork.Parent != "" {
		sb.Fork.RequestID = labels[labelForkRequest]
		sb.Fork.Count, _ = strconv.Atoi(labels[labelForkCount])
		sb.Fork.Memory = labels[labelForkMemory] == "true"
	}
	sb.IdleAction = IdleDelete
	if a := labels[labelIdleAction]; a == IdlePause || a == IdleHibernate {
		sb.IdleAction = a
	}
	// Until the task is read: a sandbox with a live task is not (list).
	sb.HibernationMark = labels[labelHibernated]
	sb.Hibernated = sb.HibernationMark != ""
}

// idleAction returns the spec's idle action, IdleDelete for "".
func (s SandboxSpec) idleAction() string {
	if s.IdleAction == "" {
		return IdleDelete
	}
	return s.IdleAction
}

// Spec returns the spec the record describes, without env values (EnvHash
// stands for them) and without the id.
func (sb Sandbox) Spec() SandboxSpec {
	return SandboxSpec{
		ID: sb.ID, Image: sb.Image, Labels: sb.Labels,
		PidsLimit: sb.PidsLimit, CPUMillis: sb.CPUMillis, MemoryBytes: sb.MemoryBytes, OpenFiles: sb.OpenFiles, DiskBytes: sb.DiskBytes, ShmBytes: sb.ShmBytes,
		HostUsers: sb.HostUsers, Runtime: sb.Runtime,
		UID: sb.UID, GID: sb.GID, WorkDir: sb.WorkDir,
		IdleTimeout: sb.IdleTimeout, MaxLifetime: sb.MaxLifetime, Pooled: sb.Pooled, Owner: sb.Owner,
		Network: sb.Network, IdleAction: sb.IdleAction, FromSnapshot: sb.FromSnapshot, Fork: sb.Fork,
		Volumes: sb.Volumes,
	}
}

// RecordOf returns the record Get reads back of a sandbox created from
// spec at createdAt: what its labels keep, without the task (not running).
// Tests of the layers above stand it in for containerd's answer.
func RecordOf(spec SandboxSpec, createdAt time.Time) Sandbox {
	return recordFromLabels(spec.ID, spec.labels(createdAt))
}
