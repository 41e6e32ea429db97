package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs"
	"github.com/moby/sys/user"
	"github.com/opencontainers/image-spec/identity"
	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/sandboxid"
)

// ErrUnknownUser means a user or group name is not in an image's
// /etc/passwd or /etc/group.
var ErrUnknownUser = errors.New("unknown user")

// maxUserDBBytes bounds what is read of an image's /etc/passwd and
// /etc/group: a user database larger than that is not one.
const maxUserDBBytes = 16 << 20

// ImageUser resolves spec — "name", "name:group", "uid:group" or
// "name:gid" — against the /etc/passwd and /etc/group of stored image ref
// (a name found by ResolveImage) and returns its uid and gid: a name's
// group is its passwd entry's unless spec names one. The files are read
// from a read-only view of the image's unpacked snapshot, within its root
// (symbolic links cannot leave it). A name in neither file is
// ErrUnknownUser; a missing image ErrImageNotFound; a user database that is
// not a regular file, or a symbolic link that leaves the root (an absolute
// target included) or loops, ErrImageUnusable.
func (r *Runtime) ImageUser(ctx context.Context, ref, spec string) (uid, gid uint32, err error) {
	c := r.begin(ctx, "find user "+spec+" in image "+ref)
	defer c.end(&err)
	ctx, cancel := c.step()
	defer cancel()
	img, err := r.client.GetImage(ctx, ref)
	if errdefs.IsNotFound(err) {
		return 0, 0, fmt.Errorf("%w: %s", ErrImageNotFound, ref)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("get image %s: %w", ref, err)
	}
	diffIDs, err := img.RootFS(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("image %s root file system: %w", ref, err)
	}
	ctx, done, err := r.withLease(ctx, time.Minute)
	if err != nil {
		return 0, 0, fmt.Errorf("lease for reading image %s's users: %w", ref, err)
	}
	defer done(context.WithoutCancel(ctx))
	sn := r.client.SnapshotService(r.cfg.Snapshotter)
	key := sandboxid.New("berth-userdb-", 10)
	mounts, err := sn.View(ctx, key, identity.ChainID(diffIDs).String())
	if err != nil {
		return 0, 0, fmt.Errorf("view image %s's snapshot: %w", ref, err)
	}
	defer sn.Remove(context.WithoutCancel(ctx), key) //nolint:errcheck // the lease's end frees it too
	var found *user.ExecUser
	err = mount.WithReadonlyTempMount(ctx, mounts, func(dir string) error {
		root, err := os.OpenRoot(dir)
		if err != nil {
			return fmt.Errorf("root of image %s: %w", ref, err)
		}
		defer root.Close()
		var db [2]io.Reader
		for i, name := range userDB {
			// Checked before the open: open(2) of a named pipe waits for
			// a writer forever and no context ends it, and opening a
			// device may act on it. O_NONBLOCK too: the view is read-only,
			// but a pipe must never block berthd.
			st, err := root.Stat(name)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				// A link out of the root (os.Root refuses absolute
				// targets too) or in a loop: the image's fault.
				return fmt.Errorf("%w: image %s: /%s does not resolve within the image's root: %v", ErrImageUnusable, ref, name, err)
			}
			if !st.Mode().IsRegular() {
				return fmt.Errorf("%w: image %s: /%s is a %s, not a regular file", ErrImageUnusable, ref, name, fileKind(st.Mode()))
			}
			f, err := root.OpenFile(name, os.O_RDONLY|unix.O_NONBLOCK, 0)
			if err != nil {
				return fmt.Errorf("image %s: open /%s: %w", ref, name, err)
			}
			defer f.Close()
			if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
				return fmt.Errorf("%w: image %s: /%s is not a regular file", ErrImageUnusable, ref, name)
			}
			db[i] = io.LimitReader(f, maxUserDBBytes)
		}
		found, err = user.GetExecUser(spec, nil, db[0], db[1])
		if err != nil {
			return fmt.Errorf("%w: %s is not in image %s's /etc/passwd and /etc/group: %v", ErrUnknownUser, spec, ref, err)
		}
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	if found.Uid < 0 || found.Gid < 0 || found.Uid >= 1<<32-1 || found.Gid >= 1<<32-1 {
		return 0, 0, fmt.Errorf("%w: %s in image %s has ids %d:%d, outside 0 to 4294967294", ErrUnknownUser, spec, ref, found.Uid, found.Gid)
	}
	return uint32(found.Uid), uint32(found.Gid), nil
}
