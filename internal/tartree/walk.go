package tartree

import (
	"path"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Entry is one file of a tree being archived.
type Entry struct {
	// Name is the entry's name in the archive: slash-separated, relative,
	// without a trailing slash ("." for the walked directory itself).
	Name string
	// Path is the file's path, for opening it and for messages.
	Path string
	// Stat is lstat(2) of the file when it was walked (stat(2) for the
	// walked root itself).
	Stat unix.Stat_t
	// Target is a symlink's target, verbatim.
	Target string

	// root is set for the walked root itself, whose path was resolved
	// following symlinks.
	root bool
}

// IsDir reports whether the entry is a directory.
func (e *Entry) IsDir() bool { return e.Stat.Mode&unix.S_IFMT == unix.S_IFDIR }

// IsRegular reports whether the entry is a regular file.
func (e *Entry) IsRegular() bool { return e.Stat.Mode&unix.S_IFMT == unix.S_IFREG }

// WalkOptions configure Walk.
type WalkOptions struct {
	// IncludeRoot visits a walked directory itself first, as the entry
	// ".", so that its mode, owner and time travel too.
	IncludeRoot bool
	// Name names a walked root that is not a directory in the archive.
	// Empty: its base name.
	Name string
	// Skip is called for each file a tar archive cannot hold (a unix
	// socket) instead of visit, with why. Nil: such files are passed over
	// silently.
	Skip func(e *Entry, why string)
}

// Walk visits what an archive of root holds, in archive order. A
// directory's entries are visited depth first, names in byte order,
// named relative to root, without following symlinks (each directory is
// opened O_NOFOLLOW from its parent's descriptor, so a directory swapped
// for a symlink meanwhile fails instead of being followed). A root that is
// not a directory is visited alone, named opts.Name or by its base name.
// Files removed while the walk runs are passed over; any other failure
// stops the walk with a *fs.PathError.
func Walk(root string, opts WalkOptions, visit func(*Entry) error) error {
	e := &Entry{Path: root, root: true}
	if err := unix.Stat(root, &e.Stat); err != nil {
		return pathError("stat", root, err)
	}
	if !e.IsDir() {
		e.Name = opts.Name
		if e.Name == "" {
			e.Name = filepath.Base(root)
		}
		return visit(e)
	}
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return pathError("open directory", root, err)
	}
	if opts.IncludeRoot {
		e.Name = "."
		if err := visit(e); err != nil {
			unix.Close(fd)
			return err
		}
	}
	return walkDir(fd, root, "", opts, visit)
}

// walkDir visits the entries of the directory open at fd, whose path is
// dir and whose archive name is rel ("" for the root), and closes fd.
func walkDir(fd int, dir, rel string, opts WalkOptions, visit func(*Entry) error) error {
	defer unix.Close(fd)
	names, err := ReadDirNames(fd)
	if err != nil {
		return pathError("read directory", dir, err)
	}
	for _, name := range names {
		e := &Entry{Name: path.Join(rel, name), Path: filepath.Join(dir, name)}
		if err := unix.Fstatat(fd, name, &e.Stat, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // removed since it was read
		}
		switch e.Stat.Mode & unix.S_IFMT {
		case unix.S_IFSOCK:
			if opts.Skip != nil {
				opts.Skip(e, "a unix socket cannot be archived")
			}
			continue
		case unix.S_IFLNK:
			if e.Target, err = readlinkAt(fd, name); err != nil {
				return pathError("readlink", e.Path, err)
			}
		}
		if err := visit(e); err != nil {
			return err
		}
		if e.IsDir() {
			sub, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return pathError("open directory", e.Path, err)
			}
			if err := walkDir(sub, e.Path, e.Name, opts, visit); err != nil {
				return err
			}
		}
	}
	return nil
}
