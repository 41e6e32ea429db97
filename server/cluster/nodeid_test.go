package cluster

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBindNodeID checks that a state directory keeps the node id of its
// first start and refuses any other, naming both and the way out.
func TestBindNodeID(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, NodeIDFile)
	if err := BindNodeID(dir, "n1"); err != nil {
		t.Fatalf("first BindNodeID(n1) = %v, want nil", err)
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "n1\n" {
		t.Fatalf("%s = %q, %v; want \"n1\\n\"", file, b, err)
	}
	if err := BindNodeID(dir, "n1"); err != nil {
		t.Errorf("BindNodeID(n1) again = %v, want nil", err)
	}
	err := BindNodeID(dir, "n2")
	var conflict *NodeIDConflictError
	if !errors.As(err, &conflict) {
		t.Fatalf("BindNodeID(n2) = %v, want a *NodeIDConflictError", err)
	}
	if conflict.Recorded != "n1" || conflict.Given != "n2" || conflict.File != file {
		t.Errorf("conflict = %+v, want recorded n1, given n2, file %s", *conflict, file)
	}
	for _, want := range []string{`"n1"`, `"n2"`, file, "--node-id n1", "remove"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("BindNodeID(n2) error %q does not name %s", err, want)
		}
	}
	if b, _ := os.ReadFile(file); string(b) != "n1\n" {
		t.Errorf("%s after a refused start = %q, want \"n1\\n\"", file, b)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("state directory holds %d entries, want only %s", len(entries), NodeIDFile)
	}

	// A file that is not a node id is refused, never overwritten.
	if err := os.WriteFile(file, []byte("not an id!\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := BindNodeID(dir, "n1"); err == nil || !strings.Contains(err.Error(), file) {
		t.Errorf("BindNodeID with a malformed %s = %v, want an error naming it", file, err)
	}
}
