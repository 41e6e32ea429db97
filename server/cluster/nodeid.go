package cluster

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/berth-sandbox/berth/internal/sandboxid"
)

// NodeIDFile is the file in a node's state directory that records the node
// id it was first started with (one line).
const NodeIDFile = "node-id"

// NodeIDConflictError is BindNodeID's refusal: the state directory belongs
// to the node Recorded, and berthd was started as Given.
type NodeIDConflictError struct {
	// File is the path of the state directory's NodeIDFile.
	File string
	// Recorded is the id in File; Given is the one berthd was started with.
	Recorded, Given string
}

func (e *NodeIDConflictError) Error() string {
	return fmt.Sprintf("node id %q was given, but this state directory belongs to node %q (recorded in %s): "+
		"its sandboxes are recorded in the fleet under %q; start berthd with --node-id %s, "+
		"or, once this node's sandboxes are deleted (or moved), remove %s to start it under a new id",
		e.Given, e.Recorded, e.File, e.Recorded, e.Recorded, e.File)
}

// BindNodeID binds the state directory dir, which must exist, to node id:
// on the first start it records id in dir/NodeIDFile (written to a
// temporary file, synced and hard-linked into place, so that a crash leaves
// the file whole or absent, and of two berthds starting at once one wins);
// later it fails with a *NodeIDConflictError when the file records another
// id. A restart under another id would make the fleet take this node's
// sandboxes for another node's. It fails too when the file cannot be read
// or written, or holds no valid id.
func BindNodeID(dir, id string) error {
	file := filepath.Join(dir, NodeIDFile)
	err := checkNodeID(file, id)
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := recordNodeID(dir, file, id); errors.Is(err, fs.ErrExist) {
		// Another berthd recorded its id a moment ago.
		return checkNodeID(file, id)
	} else if err != nil {
		return fmt.Errorf("record node id %s in %s: %w", id, file, err)
	}
	return nil
}

// checkNodeID compares the id recorded in file with id; it fails with
// fs.ErrNotExist when there is none.
func checkNodeID(file, id string) error {
	b, err := os.ReadFile(file)
	switch {
	case err == nil:
		recorded := strings.TrimSpace(string(b))
		if !sandboxid.Valid(recorded) {
			return fmt.Errorf("%s holds %q, not a node id: remove it only if this state directory holds no node's sandboxes", file, recorded)
		}
		if recorded != id {
			return &NodeIDConflictError{File: file, Recorded: recorded, Given: id}
		}
		return nil
	case errors.Is(err, fs.ErrNotExist):
		return err
	}
	return fmt.Errorf("read the node id of the state directory: %w", err)
}

// recordNodeID writes id to a temporary file, syncs it and links it to
// file, which fails with fs.ErrExist when file exists: of two berthds
// starting at once on one directory, one records its id.
func recordNodeID(dir, file, id string) error {
	tmp, err := os.CreateTemp(dir, NodeIDFile+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.WriteString(id + "\n")
	if err == nil {
		err = tmp.Chmod(0o644)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Link(tmp.Name(), file)
	}
	if err == nil {
		err = syncDir(dir)
	}
	return err
}

// syncDir makes a rename in dir durable (fsync(2) of the directory).
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
