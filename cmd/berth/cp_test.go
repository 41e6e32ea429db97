package main

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type cpEntry struct {
	name, link string
	typ        byte
	body       string
}

func cpTar(t *testing.T, entries []cpEntry) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: 0o644, Size: int64(len(e.body))}
		if e.typ == tar.TypeDir {
			hdr.Mode = 0o755
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(e.body))
	}
	tw.Close()
	return &buf
}

// TestExtractTarHostile extracts archives a hostile sandbox could send to
// berth cp: no entry may write outside the destination, and no symlink
// that leads out of it may be left there for the user's next command to
// follow, wherever the link really lands.
func TestExtractTarHostile(t *testing.T) {
	tests := []struct {
		name    string
		entries []cpEntry
	}{
		{"dotdot name", []cpEntry{{name: "../evil", typ: tar.TypeReg, body: "x"}}},
		{"absolute name", []cpEntry{{name: "/tmp/evil", typ: tar.TypeReg, body: "x"}}},
		{"absolute symlink", []cpEntry{{name: "l", typ: tar.TypeSymlink, link: "/etc"}}},
		{"escaping symlink", []cpEntry{{name: "d/l", typ: tar.TypeSymlink, link: "../../x"}}},
		{"symlink landing higher", []cpEntry{
			{name: "a", typ: tar.TypeSymlink, link: "."},
			{name: "a/x", typ: tar.TypeSymlink, link: "../secret"},
		}},
		{"dotdot through a symlink", []cpEntry{
			{name: "d", typ: tar.TypeSymlink, link: "."},
			{name: "z", typ: tar.TypeSymlink, link: "d/../secret"},
		}},
		{"write through a symlink", []cpEntry{
			{name: "l", typ: tar.TypeSymlink, link: "sub/../.."},
			{name: "l/evil", typ: tar.TypeReg, body: "x"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := t.TempDir()
			dest := filepath.Join(base, "dest")
			os.Mkdir(dest, 0o755)
			root, err := os.OpenRoot(dest)
			if err != nil {
				t.Fatal(err)
			}
			defer root.Close()
			if err := extractTar(root, cpTar(t, tt.entries)); err == nil {
				t.Errorf("extractTar accepted the archive")
			}
			if entries, _ := os.ReadDir(base); len(entries) != 1 {
				t.Errorf("%s holds %v, want only dest", base, entries)
			}
			filepath.WalkDir(dest, func(p string, d os.DirEntry, err error) error {
				if err != nil || d.Type()&os.ModeSymlink == 0 {
					return nil
				}
				target, _ := os.Readlink(p)
				resolved := target
				if !filepath.IsAbs(target) {
					resolved = filepath.Join(filepath.Dir(p), target)
				}
				if real, err := filepath.EvalSymlinks(filepath.Dir(p)); err == nil && !filepath.IsAbs(target) {
					resolved = filepath.Join(real, target)
				}
				if !strings.HasPrefix(resolved+"/", dest+"/") {
					t.Errorf("symlink %s -> %s leads out of %s", p, target, dest)
				}
				return nil
			})
		})
	}
	// Ordinary relative links still come through.
	dest := t.TempDir()
	root, _ := os.OpenRoot(dest)
	defer root.Close()
	err := extractTar(root, cpTar(t, []cpEntry{
		{name: "lib/", typ: tar.TypeDir}, {name: "lib/real.js", typ: tar.TypeReg, body: "js"},
		{name: "bin/", typ: tar.TypeDir}, {name: "bin/tool", typ: tar.TypeSymlink, link: "../lib/real.js"},
	}))
	if b, rerr := os.ReadFile(filepath.Join(dest, "bin/tool")); err != nil || string(b) != "js" {
		t.Errorf("ordinary archive: %v; bin/tool = %q, %v", err, b, rerr)
	}
}
