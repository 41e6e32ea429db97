package runtime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/server/runtime/qgroup"
)

// Volumes (CreateVolume) are btrfs subvolumes of the disk pool, the btrfs
// snapshotter's root, at POOL/berth-volumes/NAMESPACE/OWNER/NAME/data
// (OWNER: ownerKey), each with a quota group limited to its quota and a
// volume.json beside it recording its owner, name, quota and creation:
// the files are the record, so volumes survive berthd restarts without
// containerd knowing of them. A sandbox that mounts one records it in the
// labelVolumes label; berthd mounts the volume at
// STATE_DIR/s/ID/volumes/N, idmapped into the sandbox's id range like its
// root (files are stored under the sandbox's own ids, 0-65535, so a file
// uid 1000 writes in one sandbox is uid 1000's in every other), and the
// container's spec binds that mount at the path asked for.

// Errors of the volume calls.
var (
	// ErrVolumeNotFound means no such volume, or one the caller may not
	// see.
	ErrVolumeNotFound = errors.New("volume not found")
	// ErrVolumeExists means the owner holds a volume of that name.
	ErrVolumeExists = errors.New("volume exists")
	// ErrVolumeUnsupported means volumes cannot be made or mounted here;
	// the error wrapping it says why (the snapshotter, quotas, idmapping).
	ErrVolumeUnsupported = errors.New("volumes are not available")
)

// VolumeInUseError refuses to delete a volume that sandboxes mount.
type VolumeInUseError struct {
	Name string
	// SandboxIDs are the sandboxes that mount it (or are being created
	// with it), sorted.
	SandboxIDs []string
}

func (e *VolumeInUseError) Error() string {
	return fmt.Sprintf("volume %s is mounted by sandboxes %s: delete them first", e.Name, strings.Join(e.SandboxIDs, ", "))
}

// VolumeMount is a volume mounted into a sandbox.
type VolumeMount struct {
	// Name is the volume's name; the volume is the sandbox owner's.
	Name string `json:"name"`
	// Path is the absolute path in the sandbox (VolumeMountPathError).
	Path string `json:"path"`
	// ReadOnly mounts it read-only.
	ReadOnly bool `json:"ro,omitempty"`
}

// Volume is a named volume with its usage.
type Volume struct {
	Name    string
	Owner   string
	Created time.Time
	// QuotaBytes caps what it holds (its quota group's exclusive bytes);
	// UsedBytes is what it holds now.
	QuotaBytes, UsedBytes uint64
	// SandboxIDs are the sandboxes that mount it, sorted.
	SandboxIDs []string
}

// MaxVolumeMounts is how many volumes one sandbox may mount.
const MaxVolumeMounts = 16

// volumesDir is the directory under the btrfs snapshotter's root that
// holds volumes.
const volumesDir = "berth-volumes"

// labelVolumes records a sandbox's VolumeMounts as a JSON array.
const labelVolumes = LabelPrefix + "volumes"

// volumeNamePattern is a volume's name: what a DNS label allows, plus "_"
// and ".", and what a directory name may be.
var volumeNamePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// VolumeNameError says why name is not a volume name, or is nil.
func VolumeNameError(name string) error {
	if !volumeNamePattern.MatchString(name) {
		return fmt.Errorf("%q is not a volume name: 1 to 63 characters of a-z, 0-9, '_', '.', '-', starting with a letter or digit", name)
	}
	return nil
}

// reservedMountPaths are where no volume may go: the kernel's file systems,
// the agent's binary and its socket directory, which the sandbox needs as
// they are (a volume over the binary's bind mount was runc's failure,
// INTERNAL).
var reservedMountPaths = []string{"/proc", "/sys", "/dev", AgentPath, RunDir}

// VolumeMountPathError says why p is no path a volume can be mounted at,
// or is nil: it must be absolute and clean, not "/", not on or under a
// reserved path (reservedMountPaths), at most 4096 bytes.
func VolumeMountPathError(p string) error {
	switch {
	case p == "" || !path.IsAbs(p):
		return fmt.Errorf("%q is not an absolute path", p)
	case len(p) > 4096:
		return fmt.Errorf("is longer than 4096 bytes")
	case strings.ContainsRune(p, 0):
		return fmt.Errorf("holds a NUL byte")
	case path.Clean(p) != p:
		return fmt.Errorf("%q is not clean (no '.', '..', '//' or trailing '/'): %q", p, path.Clean(p))
	case p == "/":
		return fmt.Errorf("is the sandbox's root")
	}
	for _, r := range reservedMountPaths {
		if p == r || strings.HasPrefix(p, r+"/") {
			return fmt.Errorf("%q is on %s, which the sandbox needs as it is", p, r)
		}
	}
	return nil
}

// volumesLabel is the value of labelVolumes for mounts.
func volumesLabel(mounts []VolumeMount) string {
	b, _ := json.Marshal(mounts) // of strings and bools: cannot fail
	return string(b)
}

// decodeVolumesLabel reads labelVolumes; nil for "" or a value it cannot
// read.
func decodeVolumesLabel(v string) []VolumeMount {
	if v == "" {
		return nil
	}
	var out []VolumeMount
	if json.Unmarshal([]byte(v), &out) != nil {
		return nil
	}
	return out
}

// volumeMeta is a volume's volume.json.
type volumeMeta struct {
	Name       string    `json:"name"`
	Owner      string    `json:"owner"`
	Created    time.Time `json:"created"`
	QuotaBytes uint64    `json:"quota_bytes"`
}

// ownerKey is the directory of owner's volumes: a principal's name may
// hold any character, a directory's may not.
func ownerKey(owner string) string {
	sum := sha256.Sum256([]byte(owner))
	return hex.EncodeToString(sum[:16])
}

// volumesSupported fails with ErrVolumeUnsupported unless volumes can be
// made here: the btrfs snapshotter with quotas on.
func (r *Runtime) volumesSupported() error {
	if r.cfg.Snapshotter != quotaSnapshotter {
		return fmt.Errorf("%w: snapshotter %s: a volume is a btrfs subvolume with a quota of its own in the btrfs snapshotter's pool (berthd --snapshotter btrfs); berth does not give volumes without a quota", ErrVolumeUnsupported, r.cfg.Snapshotter)
	}
	if r.quota == nil {
		return fmt.Errorf("%w: %w", ErrVolumeUnsupported, r.quotaErr)
	}
	return nil
}

// volumesRoot is the directory of the namespace's volumes.
func (r *Runtime) volumesRoot() string {
	return filepath.Join(r.quota.Dir(), volumesDir, r.cfg.Namespace)
}

// volumeDir is the directory of owner's volume name: data (the
// subvolume) and volume.json.
func (r *Runtime) volumeDir(owner, name string) string {
	return filepath.Join(r.volumesRoot(), ownerKey(owner), name)
}

// volumeKey names owner's volume name in maps.
func volumeKey(owner, name string) string { return owner + "\x00" + name }

// CreateVolume makes owner's empty volume name with a quota of quotaBytes
// (the quota group's limit in force before it returns). Its root is owned
// by the sandboxes' root and mode 1777, like /tmp: any user of a sandbox
// may make files there. Errors: ErrVolumeUnsupported, ErrVolumeExists,
// ErrDiskQuotaUnsupported (accounting the kernel cannot repair in time),
// btrfs's.
func (r *Runtime) CreateVolume(ctx context.Context, owner, name string, quotaBytes uint64) (_ Volume, err error) {
	if err := r.volumesSupported(); err != nil {
		return Volume{}, err
	}
	if err := r.checkHeadroom("create volume " + name); err != nil {
		return Volume{}, err
	}
	r.volMu.Lock()
	defer r.volMu.Unlock()
	dir := r.volumeDir(owner, name)
	if _, err := r.readVolume(owner, name); err == nil {
		return Volume{}, fmt.Errorf("%w: %s", ErrVolumeExists, name)
	} else if !errors.Is(err, ErrVolumeNotFound) {
		return Volume{}, err
	}
	// What a create that did not finish left (no volume.json).
	if err := removeVolumeDir(dir); err != nil {
		return Volume{}, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Volume{}, r.poolError("create volume "+name, err)
	}
	defer func() {
		if err != nil {
			removeVolumeDir(dir)
		}
	}()
	data := filepath.Join(dir, "data")
	if err := qgroup.Create(data); err != nil {
		return Volume{}, r.poolError("create volume "+name, err)
	}
	if err := os.Chmod(data, 0o777|os.ModeSticky); err != nil {
		return Volume{}, fmt.Errorf("volume %s: %w", name, err)
	}
	subvol, err := qgroup.SubvolIDAt(data)
	if err != nil {
		return Volume{}, err
	}
	if err := r.quota.Limit(ctx, subvol, quotaBytes); err != nil {
		if errors.Is(err, qgroup.ErrInconsistent) {
			return Volume{}, fmt.Errorf("%w: %v", ErrDiskQuotaUnsupported, err)
		}
		return Volume{}, err
	}
	meta := volumeMeta{Name: name, Owner: owner, Created: time.Now().UTC(), QuotaBytes: quotaBytes}
	b, _ := json.Marshal(meta) // plain fields: cannot fail
	tmp := filepath.Join(dir, "volume.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return Volume{}, r.poolError("record volume "+name, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "volume.json")); err != nil {
		return Volume{}, fmt.Errorf("record volume %s: %w", name, err)
	}
	return Volume{Name: name, Owner: owner, Created: meta.Created, QuotaBytes: quotaBytes}, nil
}

// poolError is err as a *PoolFullError naming the pool when it is ENOSPC
// or EDQUOT, err otherwise; op says what berthd was doing.
func (r *Runtime) poolError(op string, err error) error {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return &PoolFullError{Pool: r.poolName(), Op: op, Err: err}
	}
	return fmt.Errorf("%s: %w", op, err)
}

// removeVolumeDir removes a volume's directory: its subvolume (the
// kernel frees the extents in the background) and its record.
func removeVolumeDir(dir string) error {
	if err := qgroup.Delete(filepath.Join(dir, "data")); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove volume directory %s: %w", dir, err)
	}
	return nil
}

// readVolume reads owner's volume name's record: ErrVolumeNotFound when
// there is none.
func (r *Runtime) readVolume(owner, name string) (volumeMeta, error) {
	b, err := os.ReadFile(filepath.Join(r.volumeDir(owner, name), "volume.json"))
	if errors.Is(err, os.ErrNotExist) {
		return volumeMeta{}, fmt.Errorf("%w: %s", ErrVolumeNotFound, name)
	}
	if err != nil {
		return volumeMeta{}, fmt.Errorf("read volume %s: %w", name, err)
	}
	var m volumeMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return volumeMeta{}, fmt.Errorf("read volume %s: %w", name, err)
	}
	return m, nil
}

// GetVolume returns owner's volume name with its usage and the sandboxes
// that mount it. Errors: ErrVolumeUnsupported, ErrVolumeNotFound,
// containerd's, btrfs's.
func (r *Runtime) GetVolume(ctx context.Context, owner, name string) (Volume, error) {
	if err := r.volumesSupported(); err != nil {
		return Volume{}, err
	}
	m, err := r.readVolume(owner, name)
	if err != nil {
		return Volume{}, err
	}
	users, err := r.volumeUsers(ctx)
	if err != nil {
		return Volume{}, err
	}
	return r.volumeOf(m, users)
}

// volumeOf is the Volume of record m, users as volumeUsers returns them.
func (r *Runtime) volumeOf(m volumeMeta, users map[string][]string) (Volume, error) {
	v := Volume{Name: m.Name, Owner: m.Owner, Created: m.Created, QuotaBytes: m.QuotaBytes, SandboxIDs: users[volumeKey(m.Owner, m.Name)]}
	subvol, err := qgroup.SubvolIDAt(filepath.Join(r.volumeDir(m.Owner, m.Name), "data"))
	if err != nil {
		return Volume{}, err
	}
	if v.UsedBytes, err = r.quota.Exclusive(subvol); err != nil {
		return Volume{}, err
	}
	return v, nil
}

// ListVolumes returns the volumes whose owner sees accepts, ordered by
// owner and name, with their usage. Errors: ErrVolumeUnsupported,
// containerd's, btrfs's.
func (r *Runtime) ListVolumes(ctx context.Context, sees func(owner string) bool) ([]Volume, error) {
	if err := r.volumesSupported(); err != nil {
		return nil, err
	}
	metas, err := r.volumeRecords()
	if err != nil {
		return nil, err
	}
	users, err := r.volumeUsers(ctx)
	if err != nil {
		return nil, err
	}
	var out []Volume
	for _, m := range metas {
		if !sees(m.Owner) {
			continue
		}
		v, err := r.volumeOf(m, users)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// volumeRecords reads every volume's record, ordered by owner and name;
// directories without one (a create under way or cut short) are skipped.
func (r *Runtime) volumeRecords() ([]volumeMeta, error) {
	// berthd's own calls: out of descriptors or disk is a *HostError
	// (SERVER_DESCRIPTORS_EXHAUSTED naming the operation, nothing changed).
	hostErr := func(op string, err error) error {
		if _, ok := HostErrno(err); ok {
			return &HostError{Op: op, Err: err}
		}
		return fmt.Errorf("%s: %w", op, err)
	}
	owners, err := os.ReadDir(r.volumesRoot())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, hostErr("list volumes", err)
	}
	var out []volumeMeta
	for _, o := range owners {
		names, err := os.ReadDir(filepath.Join(r.volumesRoot(), o.Name()))
		if err != nil {
			return nil, hostErr("list volumes", err)
		}
		for _, n := range names {
			b, err := os.ReadFile(filepath.Join(r.volumesRoot(), o.Name(), n.Name(), "volume.json"))
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				return nil, hostErr("read volume "+n.Name(), err)
			}
			var m volumeMeta
			if err := json.Unmarshal(b, &m); err != nil {
				return nil, fmt.Errorf("read volume %s: %w", n.Name(), err)
			}
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b volumeMeta) int {
		return strings.Compare(volumeKey(a.Owner, a.Name), volumeKey(b.Owner, b.Name))
	})
	return out, nil
}

// volumeUsers returns the sandboxes that mount each volume (keyed by
// volumeKey), sorted, creates under way included.
func (r *Runtime) volumeUsers(ctx context.Context) (map[string][]string, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CallBudget)
	defer cancel()
	records, err := r.client.ContainerService().List(ctx, fmt.Sprintf("labels.%q", labelVolumes))
	if err != nil {
		return nil, fmt.Errorf("list the sandboxes that mount volumes: %w", err)
	}
	out := map[string][]string{}
	for _, c := range records {
		for _, m := range decodeVolumesLabel(c.Labels[labelVolumes]) {
			k := volumeKey(c.Labels[LabelOwner], m.Name)
			out[k] = append(out[k], c.ID)
		}
	}
	r.volPendingMu.Lock()
	for k, ids := range r.volPending {
		for id := range ids {
			out[k] = append(out[k], id)
		}
	}
	r.volPendingMu.Unlock()
	for k, ids := range out {
		slices.Sort(ids)
		out[k] = slices.Compact(ids)
	}
	return out, nil
}

// DeleteVolume removes owner's volume name and its files. Errors:
// ErrVolumeUnsupported, ErrVolumeNotFound, *VolumeInUseError while a
// sandbox mounts it or is being created with it, containerd's, btrfs's.
func (r *Runtime) DeleteVolume(ctx context.Context, owner, name string) error {
	if err := r.volumesSupported(); err != nil {
		return err
	}
	r.volMu.Lock()
	defer r.volMu.Unlock()
	if _, err := r.readVolume(owner, name); err != nil {
		return err
	}
	users, err := r.volumeUsers(ctx)
	if err != nil {
		return err
	}
	if ids := users[volumeKey(owner, name)]; len(ids) > 0 {
		return &VolumeInUseError{Name: name, SandboxIDs: ids}
	}
	// The record goes first: a delete cut short leaves a directory that
	// no call lists and the next create of the name clears.
	if err := os.Remove(filepath.Join(r.volumeDir(owner, name), "volume.json")); err != nil {
		return fmt.Errorf("delete volume %s: %w", name, err)
	}
	return removeVolumeDir(r.volumeDir(owner, name))
}

// VolumeDisk returns every volume in the namespace, keyed "volume/" +
// owner key + "/" + name (never a sandbox id), with its owner and its quota
// as the bytes it holds against the owner's disk: a volume may fill its
// quota at any time. Without volumes it returns nothing.
func (r *Runtime) VolumeDisk() (map[string]Promise, error) {
	if r.volumesSupported() != nil {
		return nil, nil
	}
	metas, err := r.volumeRecords()
	if err != nil {
		return nil, err
	}
	out := make(map[string]Promise, len(metas))
	for _, m := range metas {
		out["volume/"+ownerKey(m.Owner)+"/"+m.Name] = Promise{Owner: m.Owner, DiskBytes: m.QuotaBytes, Stored: true}
	}
	return out, nil
}

// claimVolumes checks that owner holds every volume mounts names and
// records sandbox id as their user until release is called (once the
// container, and so its labelVolumes, exists or the create failed), so
// that a DeleteVolume in between is refused. Errors:
// ErrVolumeUnsupported (also for a sandbox whose ids cannot be idmapped),
// ErrVolumeNotFound.
func (r *Runtime) claimVolumes(spec SandboxSpec) (release func(), err error) {
	if len(spec.Volumes) == 0 {
		return func() {}, nil
	}
	if err := r.volumesSupported(); err != nil {
		return nil, err
	}
	if spec.userns() && r.idmapErr != nil {
		return nil, fmt.Errorf("%w: a volume is shared by sandboxes of different id ranges through idmapped mounts, which this kernel or file system cannot make: %v", ErrVolumeUnsupported, r.idmapErr)
	}
	r.volMu.Lock()
	defer r.volMu.Unlock()
	for _, m := range spec.Volumes {
		if _, err := r.readVolume(spec.Owner, m.Name); err != nil {
			return nil, err
		}
	}
	r.volPendingMu.Lock()
	defer r.volPendingMu.Unlock()
	if r.volPending == nil {
		r.volPending = map[string]map[string]bool{}
	}
	for _, m := range spec.Volumes {
		k := volumeKey(spec.Owner, m.Name)
		if r.volPending[k] == nil {
			r.volPending[k] = map[string]bool{}
		}
		r.volPending[k][spec.ID] = true
	}
	return func() {
		r.volPendingMu.Lock()
		defer r.volPendingMu.Unlock()
		for _, m := range spec.Volumes {
			k := volumeKey(spec.Owner, m.Name)
			delete(r.volPending[k], spec.ID)
			if len(r.volPending[k]) == 0 {
				delete(r.volPending, k)
			}
		}
	}, nil
}

// volumeMountDir is where berthd mounts sandbox id's n-th volume.
func (r *Runtime) volumeMountDir(id string, n int) string {
	return filepath.Join(r.hostDir(id), "volumes", fmt.Sprint(n))
}

// withVolumes binds the sandbox's volume mounts (mountVolumes) at their
// paths in the container, read-only where asked, without setuid or
// device files.
func (r *Runtime) withVolumes(spec SandboxSpec) oci.SpecOpts {
	mounts := make([]specs.Mount, len(spec.Volumes))
	for i, m := range spec.Volumes {
		mode := "rw"
		if m.ReadOnly {
			mode = "ro"
		}
		mounts[i] = specs.Mount{Destination: m.Path, Type: "bind", Source: r.volumeMountDir(spec.ID, i), Options: []string{"rbind", mode, "nosuid", "nodev"}}
	}
	return oci.WithMounts(mounts)
}

// mountVolumes mounts sandbox id's volumes (mounts, owner's) at
// volumeMountDir, with ids mapped into the range at host id base when
// userns (idmapped bind mounts, mount_setattr(2) MOUNT_ATTR_IDMAP), as
// plain bind mounts otherwise (host_users, gVisor, whose gofer serves
// them), read-only where asked. What was mounted there before (a task's
// restart) is replaced.
func (r *Runtime) mountVolumes(id, owner string, mounts []VolumeMount, userns bool, base uint32) error {
	if len(mounts) == 0 {
		return nil
	}
	if err := r.volumesSupported(); err != nil {
		return err
	}
	for i, m := range mounts {
		target := r.volumeMountDir(id, i)
		if err := os.MkdirAll(target, 0o700); err != nil {
			return fmt.Errorf("volume mount point %s: %w", target, err)
		}
		if err := mount.UnmountAll(target, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount volume mount point %s: %w", target, err)
		}
		data := filepath.Join(r.volumeDir(owner, m.Name), "data")
		if _, err := os.Stat(data); err != nil {
			return fmt.Errorf("%w: %s: %v", ErrVolumeNotFound, m.Name, err)
		}
		opts := []string{"bind"}
		if m.ReadOnly {
			opts = append(opts, "ro")
		}
		if userns {
			opts = append(opts, idMapOptions(base)...)
		}
		if err := mount.All([]mount.Mount{{Type: "bind", Source: data, Options: opts}}, target); err != nil {
			mount.UnmountAll(target, unix.MNT_DETACH)
			return fmt.Errorf("mount volume %s at %s: %w", m.Name, target, err)
		}
	}
	return nil
}

// unmountVolumes unmounts every volume of sandbox id's host directory and
// fails unless none is left mounted: the directory is removed next, and a
// removal through a mounted volume would delete the volume's files.
func (r *Runtime) unmountVolumes(id string) error {
	dir := filepath.Join(r.hostDir(id), "volumes")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("volume mounts of sandbox %s: %w", id, err)
	}
	for _, e := range entries {
		target := filepath.Join(dir, e.Name())
		if err := mount.UnmountAll(target, unix.MNT_DETACH); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("unmount volume of sandbox %s at %s: %w", id, target, err)
		}
		// MNT_DETACH takes the mount out of the tree at once; what is
		// left at target now is the plain directory, whatever holds it.
		if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove volume mount point %s: %w", target, err)
		}
	}
	return nil
}
