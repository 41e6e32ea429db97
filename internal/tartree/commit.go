package tartree

import (
	"errors"
	"fmt"
	"path"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// commit moves the extracted tree from the staging directory into place.
func (x *extraction) commit() error {
	if x.merge {
		return x.mergeInto()
	}
	// The staging directory becomes a real one: the usual mode (a root
	// entry's own is applied by fixDirs).
	if err := unix.Chmod(x.staging, defaultDirMode); err != nil {
		return pathError("chmod", x.staging, err)
	}
	for i := range x.chain {
		src := filepath.Join(append([]string{x.staging}, x.chain[1:i+1]...)...)
		dst := filepath.Join(append([]string{x.ancestor}, x.chain[:i+1]...)...)
		err := renameNoReplace(unix.AT_FDCWD, src, unix.AT_FDCWD, dst)
		if err == nil {
			if i == 0 {
				x.staging = "" // it is the tree now
			}
			return nil
		}
		if !errors.Is(err, unix.EEXIST) && !errors.Is(err, unix.ENOTEMPTY) {
			return pathError("rename staging directory to", dst, err)
		}
		// dst was made meanwhile (a concurrent upload): go one deeper.
		var st unix.Stat_t
		if err := unix.Stat(dst, &st); err != nil {
			return pathError("stat", dst, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return pathError("extract into", dst, unix.ENOTDIR)
		}
	}
	x.merge = true
	return x.mergeInto()
}

// move is one entry moved into the existing directory, for rolling back.
type move struct {
	rel       string // name relative to the directory
	exchanged bool   // it replaced an entry, which went to the staging directory
}

// mergeInto moves the entries of the staging directory into the existing
// directory dir, as extracting there would leave it: in a first pass that
// changes nothing, every conflict is found; then entries move, and a
// failure moves back what had moved (replaced entries were exchanged with
// the new ones, RENAME_EXCHANGE, so they come back too).
func (x *extraction) mergeInto() error {
	if x.final == nil {
		f, err := openBeneath(x.dir)
		if err != nil {
			return err
		}
		x.final = f
	}
	var moves []move
	pass := func(check bool) error {
		sfd, err := unix.Open(x.root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return pathError("open staging directory", x.root, err)
		}
		defer unix.Close(sfd)
		tfd, err := x.final.open(".", unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return pathError("open directory", x.dir, err)
		}
		defer unix.Close(tfd)
		return x.mergeDir(sfd, tfd, "", check, &moves)
	}
	if err := pass(true); err != nil {
		return err
	}
	if err := pass(false); err != nil {
		x.rollback(moves)
		return err
	}
	return nil
}

// mergeDir merges the staging directory open at sfd into the directory
// open at tfd; rel is their name relative to dir ("" at the top). With
// check it only looks for conflicts.
func (x *extraction) mergeDir(sfd, tfd int, rel string, check bool, moves *[]move) error {
	names, err := ReadDirNames(sfd)
	if err != nil {
		return pathError("read staging directory", x.b.full(rel), err)
	}
	for _, name := range names {
		if rel == "" && filepath.Join(x.dir, name) == x.staging {
			continue // the staging directory itself
		}
		srel := path.Join(rel, name)
		var s, t unix.Stat_t
		if err := unix.Fstatat(sfd, name, &s, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return pathError("stat staged", x.b.full(srel), err)
		}
		terr := unix.Fstatat(tfd, name, &t, unix.AT_SYMLINK_NOFOLLOW)
		sDir := s.Mode&unix.S_IFMT == unix.S_IFDIR
		tType := t.Mode & unix.S_IFMT
		_, explicit := x.dirAt[srel]
		switch {
		case errors.Is(terr, unix.ENOENT):
			if !check {
				if err := renameNoReplace(sfd, name, tfd, name); err != nil {
					return pathError("move into place", x.b.full(srel), err)
				}
				*moves = append(*moves, move{rel: srel})
			}
		case terr != nil:
			return pathError("stat", x.b.full(srel), terr)
		case sDir && tType == unix.S_IFDIR:
			sub, err := unix.Openat(tfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return pathError("open directory", x.b.full(srel), err)
			}
			err = x.mergeSub(sfd, name, sub, srel, check, moves)
			unix.Close(sub)
			if err != nil {
				return err
			}
		case sDir && tType == unix.S_IFLNK && !explicit:
			// Entries below a directory the archive does not hold go
			// where the existing symlink leads, as with tar(1), as long
			// as that is inside dir.
			sub, err := x.final.open(srel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
			if errors.Is(err, ErrEscape) {
				return &EntryError{srel + "/" + firstEntry(sfd, name), true, "would be written through the existing symlink " + Display(x.b.full(srel)) + ", which leads out of the target directory"}
			}
			if err != nil {
				return pathError("extract into", x.b.full(srel), unix.ENOTDIR)
			}
			err = x.mergeSub(sfd, name, sub, srel, check, moves)
			unix.Close(sub)
			if err != nil {
				return err
			}
		case sDir && !explicit:
			return pathError("extract into", x.b.full(srel), unix.ENOTDIR)
		case !sDir && tType == unix.S_IFDIR:
			empty, err := emptyDir(tfd, name)
			if err != nil {
				return pathError("read directory", x.b.full(srel), err)
			}
			if !empty {
				return &replaceError{x.b.full(srel), fmt.Sprintf("the archive has a %s there", typeName(s.Mode))}
			}
			fallthrough
		default: // an entry replaces another
			if !check {
				exchanged, err := replace(sfd, name, tfd, name, tType == unix.S_IFDIR)
				if err != nil {
					return pathError("move into place", x.b.full(srel), err)
				}
				*moves = append(*moves, move{rel: srel, exchanged: exchanged})
			}
		}
	}
	return nil
}

// firstEntry names an entry of the archive inside the staged directory
// name of dirfd, for messages: the first one in byte order, deepest first
// ("c", "e/"), or "" when it is empty.
func firstEntry(dirfd int, name string) string {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return ""
	}
	defer unix.Close(fd)
	names, err := ReadDirNames(fd)
	if err != nil || len(names) == 0 {
		return ""
	}
	var st unix.Stat_t
	if unix.Fstatat(fd, names[0], &st, unix.AT_SYMLINK_NOFOLLOW) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return names[0]
	}
	return names[0] + "/" + firstEntry(fd, names[0])
}

// replaceError says that an entry cannot replace what is at path: a
// directory that is not empty.
type replaceError struct {
	path string
	why  string
}

func (e *replaceError) Error() string {
	return fmt.Sprintf("%s is a directory that is not empty and %s", Display(e.path), e.why)
}

// Unwrap makes a *replaceError an EISDIR (IS_A_DIRECTORY).
func (e *replaceError) Unwrap() error { return unix.EISDIR }

// mergeSub merges the staging subdirectory name of sfd into the directory
// open at sub.
func (x *extraction) mergeSub(sfd int, name string, sub int, srel string, check bool, moves *[]move) error {
	s, err := unix.Openat(sfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return pathError("open staging directory", x.b.full(srel), err)
	}
	defer unix.Close(s)
	return x.mergeDir(s, sub, srel, check, moves)
}

// replace puts the staged entry sname in place of tname, which exists:
// exchanged with it (renameat2(2) RENAME_EXCHANGE), so that it can be put
// back, or, where the file system cannot exchange, renamed over it (an
// empty directory is removed first).
func replace(sfd int, sname string, tfd int, tname string, tIsDir bool) (bool, error) {
	err := unix.Renameat2(sfd, sname, tfd, tname, unix.RENAME_EXCHANGE)
	if err == nil {
		return true, nil
	}
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOSYS) {
		return false, err
	}
	if tIsDir {
		if err := unix.Unlinkat(tfd, tname, unix.AT_REMOVEDIR); err != nil {
			return false, err
		}
	}
	return false, unix.Renameat(sfd, sname, tfd, tname)
}

// rollback moves back what a failed merge moved, latest first. It undoes
// a failure, so its own errors are ignored.
func (x *extraction) rollback(moves []move) {
	for i := len(moves) - 1; i >= 0; i-- {
		m := moves[i]
		dir, base := path.Dir(m.rel), path.Base(m.rel)
		sdir, err := x.b.dir(dir)
		if err != nil {
			continue
		}
		tdir, err := x.final.dir(dir)
		if err != nil {
			unix.Close(sdir)
			continue
		}
		if m.exchanged {
			unix.Renameat2(sdir, base, tdir, base, unix.RENAME_EXCHANGE)
		} else {
			renameNoReplace(tdir, base, sdir, base)
		}
		unix.Close(sdir)
		unix.Close(tdir)
	}
}

// emptyDir reports whether the directory name in dirfd is empty.
func emptyDir(dirfd int, name string) (bool, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	names, err := ReadDirNames(fd)
	return len(names) == 0, err
}

// renameNoReplace is renameat2(2) with RENAME_NOREPLACE; where the file
// system cannot do that, a check for the target and rename(2).
func renameNoReplace(olddirfd int, oldname string, newdirfd int, newname string) error {
	err := unix.Renameat2(olddirfd, oldname, newdirfd, newname, unix.RENAME_NOREPLACE)
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOSYS) {
		return err
	}
	var st unix.Stat_t
	if unix.Fstatat(newdirfd, newname, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
		return unix.EEXIST
	}
	return unix.Renameat(olddirfd, oldname, newdirfd, newname)
}

// fixDirs applies the directory entries' owners, modes and times, deepest
// first, in their final place. The directory itself (an entry ".") gets
// them only when this extraction made it.
func (x *extraction) fixDirs() error {
	if len(x.dirs) == 0 {
		return nil
	}
	b, err := openBeneath(x.dir)
	if err != nil {
		return err
	}
	defer b.close()
	for i := len(x.dirs) - 1; i >= 0; i-- {
		d := x.dirs[i]
		if d.name == "." && x.merge {
			continue
		}
		if err := x.fixDir(b, d); err != nil {
			return err
		}
	}
	return nil
}

func (x *extraction) fixDir(b *beneath, d dirMeta) error {
	full := b.full(d.name)
	fd, err := b.open(d.name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return x.entryErr(d.raw, d.name, err)
	}
	defer unix.Close(fd)
	if err := unix.Fchmod(fd, d.mode); err != nil {
		return pathError("chmod", full, err)
	}
	ts := []unix.Timespec{d.atime, d.mtime}
	if d.name == "." {
		err = unix.UtimesNanoAt(unix.AT_FDCWD, x.dir, ts, 0)
	} else {
		parent, perr := b.dir(path.Dir(d.name))
		if perr != nil {
			return x.entryErr(d.raw, d.name, perr)
		}
		err = unix.UtimesNanoAt(parent, path.Base(d.name), ts, unix.AT_SYMLINK_NOFOLLOW)
		unix.Close(parent)
	}
	if err != nil {
		return pathError("set times of", full, err)
	}
	// The owner last: once another user owns it, the rest would need
	// CAP_FOWNER.
	if x.opts.Chown != nil {
		if err := x.opts.Chown(fd, d.uid, d.gid, d.mode); err != nil {
			return x.chownError(d.raw, d.name, d.uid, d.gid, err)
		}
	}
	return nil
}
