package client

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestReadTarRefusesEscapes: DownloadDir's extraction (extractDir) refuses
// entries that would land outside the target directory, and device nodes,
// whatever the sandbox sends; nothing is written outside.
func TestReadTarRefusesEscapes(t *testing.T) {
	for name, entries := range map[string][]*tar.Header{
		"dotdot":        {{Name: "../escaped", Typeflag: tar.TypeReg, Mode: 0o644}},
		"nested dotdot": {{Name: "a/../../escaped", Typeflag: tar.TypeReg, Mode: 0o644}},
		"absolute":      {{Name: "/escaped", Typeflag: tar.TypeReg, Mode: 0o644}},
		"device":        {{Name: "null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3, Mode: 0o666}},
		"through a symlink made first": {
			{Name: "link", Typeflag: tar.TypeSymlink, Linkname: ".."},
			{Name: "link/escaped", Typeflag: tar.TypeReg, Mode: 0o644},
		},
	} {
		t.Run(name, func(t *testing.T) {
			parent := t.TempDir()
			dst := filepath.Join(parent, "dst")
			if err := os.Mkdir(dst, 0o755); err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			tw := tar.NewWriter(&b)
			for _, h := range entries {
				if err := tw.WriteHeader(h); err != nil {
					t.Fatal(err)
				}
			}
			if err := tw.Close(); err != nil {
				t.Fatal(err)
			}
			if err := extractDir(dst, &b); err == nil {
				t.Errorf("extractDir accepted %s", name)
			}
			if _, err := os.Lstat(filepath.Join(parent, "escaped")); err == nil {
				t.Errorf("%s: a file was written outside the target", name)
			}
		})
	}
}
