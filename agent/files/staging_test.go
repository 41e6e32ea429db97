package files_test

import (
	"archive/tar"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
)

// TestStaleStagingRemovedAtStart kills the agent (SIGKILL) in the middle
// of an upload: its staging directory, ".berth-upload-<random>", stays
// behind. The agent started again removes it before it serves, and only
// it: a directory of the workload user's with the very same name
// elsewhere, and one of the same pattern beside it, stay; so does nothing
// of the agent's bookkeeping in its own directory.
func TestStaleStagingRemovedAtStart(t *testing.T) {
	a := startAgent(t, "--user", "1000:1000")
	dest := filepath.Join(a.dir, "dest")
	if err := os.Mkdir(dest, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dest, 0o777); err != nil {
		t.Fatal(err)
	}
	stream, err := a.files.Upload(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	archive := makeTar(t, []tarEntry{{name: "big", typ: tar.TypeReg, body: strings.Repeat("x", 4<<20)}}, false)
	if err := stream.Send(&agentv1.UploadRequest{Part: &agentv1.UploadRequest_Header{Header: &agentv1.UploadHeader{Path: []byte(dest)}}}); err != nil {
		t.Fatal(err)
	}
	// Half of the archive: the agent waits for the rest, mid-extraction.
	if err := stream.Send(&agentv1.UploadRequest{Part: &agentv1.UploadRequest_Chunk{Chunk: archive[:len(archive)/2]}}); err != nil {
		t.Fatal(err)
	}
	staging := waitForStaging(t, dest)
	a.crash(t)
	if fi, err := os.Lstat(staging); err != nil || !fi.IsDir() {
		t.Fatalf("staging directory %s after the crash: %v, %v; want it left behind", staging, fi, err)
	}

	// The workload user's own directories, named as staging directories
	// are: one with the same name elsewhere, one of the pattern beside.
	users := []string{filepath.Join(a.dir, filepath.Base(staging)), filepath.Join(dest, ".berth-upload-0123456789ab")}
	for _, d := range users {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "mine"), []byte("keep"), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{d, filepath.Join(d, "mine")} {
			if err := os.Lchown(p, 1000, 1000); err != nil {
				t.Fatal(err)
			}
		}
	}

	startAgentIn(t, a.base, "--user", "1000:1000")
	if _, err := os.Lstat(staging); !os.IsNotExist(err) {
		t.Errorf("staging directory %s after the agent started again: %v, want it removed", staging, err)
	}
	for _, d := range users {
		if b, err := os.ReadFile(filepath.Join(d, "mine")); err != nil || string(b) != "keep" {
			t.Errorf("user's %s/mine after the agent started again = %q, %v; want it untouched", d, b, err)
		}
	}
	entries, err := os.ReadDir(a.run)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) != 1 || names[0] != "a.sock" {
		t.Errorf("agent's directory holds %q after the start, want only its socket", names)
	}
}

// waitForStaging waits until a staging directory appears in dir and
// returns its path.
func waitForStaging(t *testing.T, dir string) string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), ".berth-upload-") {
				return filepath.Join(dir, e.Name())
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no staging directory in %s within 10s of the upload's start", dir)
		}
		time.Sleep(5 * time.Millisecond) // polls a condition, bounded by deadline
	}
}
