package files_test

import (
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/berth-sandbox/berth/internal/tarbomb"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
)

// TestDiskQuotaRefusesWhatCannotFit checks the agent's side of a sandbox's
// disk quota (--disk-bytes): a WriteFile or Upload whose bytes exceed it is
// RESOURCE_EXHAUSTED NO_SPACE naming the path and the limit, up front when
// a size is declared, and the refused file is not stored.
func TestDiskQuotaRefusesWhatCannotFit(t *testing.T) {
	const quota = 1 << 20
	a := startAgent(t, "--disk-bytes", "1048576")
	noSpace := func(t *testing.T, err error, path string) {
		t.Helper()
		meta := wantStatus(t, err, codes.ResourceExhausted, "NO_SPACE", path)
		if meta["limit"] != "1048576" {
			t.Errorf("metadata limit = %q, want 1048576", meta["limit"])
		}
		if _, err := os.Lstat(path); !os.IsNotExist(err) {
			t.Errorf("refused %s exists afterwards (lstat: %v)", path, err)
		}
	}

	t.Run("declared write", func(t *testing.T) {
		path := filepath.Join(a.dir, "declared")
		_, err := a.writeFile(t, &agentv1.WriteFileHeader{Path: []byte(path), SizeBytes: proto.Uint64(quota + 1)}, nil)
		noSpace(t, err, path)
	})
	t.Run("streamed write", func(t *testing.T) {
		path := filepath.Join(a.dir, "streamed")
		_, err := a.writeFile(t, &agentv1.WriteFileHeader{Path: []byte(path)}, make([]byte, quota+1))
		noSpace(t, err, path)
		if entries, _ := os.ReadDir(a.dir); len(entries) != 0 {
			t.Errorf("a refused write left %v", entries)
		}
	})
	t.Run("write that fits", func(t *testing.T) {
		path := filepath.Join(a.dir, "fits")
		if _, err := a.writeFile(t, &agentv1.WriteFileHeader{Path: []byte(path)}, make([]byte, quota)); err != nil {
			t.Fatalf("WriteFile of exactly the quota: %v", err)
		}
		os.Remove(path)
	})
	t.Run("files adding up", func(t *testing.T) {
		dir := filepath.Join(a.dir, "sum")
		half := string(make([]byte, quota/2+1))
		_, err := a.upload(t, dir, makeTar(t, []tarEntry{{name: "a", body: half}, {name: "b", body: half}}, false))
		noSpace(t, err, filepath.Join(dir, "b"))
	})
	gz, err := tarbomb.Gzip("zeros", 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	sparse, err := tarbomb.Sparse(t.TempDir(), "holes", 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	for _, bomb := range []struct {
		name, entry string
		archive     []byte
	}{{"gzip bomb", "zeros", gz}, {"sparse file", "holes", sparse}} {
		t.Run(bomb.name, func(t *testing.T) {
			dir := filepath.Join(a.dir, bomb.entry)
			_, err := a.upload(t, dir, bomb.archive)
			noSpace(t, err, filepath.Join(dir, bomb.entry))
		})
	}
}
