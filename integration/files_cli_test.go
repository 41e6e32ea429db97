package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// berthCLI runs the berth CLI against the test berthd with stdin and
// returns stdout, stderr and the exit code.
func berthCLI(t *testing.T, stdin []byte, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(env.cliBinary, append([]string{"--addr", env.berthdAddr}, args...)...)
	cmd.Stdin = bytes.NewReader(stdin)
	return runCLI(t, cmd, args)
}

// runCLI runs a berth CLI command made with args and returns its stdout,
// stderr and exit code.
func runCLI(t *testing.T, cmd *exec.Cmd, args []string) (string, string, int) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("berth %q: %v", args, err)
	}
	return stdout.String(), stderr.String(), code
}

// TestFilesCLI copies a tree in and out with berth cp, and uses berth ls
// and berth cat.
func TestFilesCLI(t *testing.T) {
	need(t)
	sb := newSandbox(t, nil)
	id := sb.GetId()
	local := t.TempDir()
	src := filepath.Join(local, "proj")
	blob := randomData(1<<20 + 3)
	os.MkdirAll(filepath.Join(src, "sub", "deep"), 0o755)
	os.WriteFile(filepath.Join(src, "blob.bin"), blob, 0o640)
	os.WriteFile(filepath.Join(src, "sub", "deep", "a b.txt"), []byte("spaced\n"), 0o644)
	os.Symlink("sub/deep/a b.txt", filepath.Join(src, "link"))

	if out, errOut, code := berthCLI(t, nil, "cp", src, id+":/workspace/"); code != 0 {
		t.Fatalf("cp dir in: exit %d: %s%s", code, out, errOut)
	}
	out, errOut, code := berthCLI(t, nil, "ls", "-R", id+":proj")
	want := "blob.bin\nlink\nsub\nsub/deep\nsub/deep/a b.txt\n"
	if code != 0 || out != want {
		t.Errorf("ls -R = %q (exit %d, %s), want %q", out, code, errOut, want)
	}
	out, _, _ = berthCLI(t, nil, "ls", "-l", id+":/workspace/proj")
	if !strings.Contains(out, "-rw-r-----") || !strings.Contains(out, "link -> sub/deep/a b.txt") {
		t.Errorf("ls -l =\n%s\nwant blob.bin -rw-r----- and the link's target", out)
	}
	if out, _, code := berthCLI(t, nil, "cat", id+":proj/link"); code != 0 || out != "spaced\n" {
		t.Errorf("cat through the link = %q (exit %d)", out, code)
	}
	if got := sandboxSHA(t, id, "/workspace/proj/blob.bin"); got != hexSHA(blob) {
		t.Errorf("sha256sum of the copied blob = %s, want %s", got, hexSHA(blob))
	}

	// Out again, into a new directory and as a single file.
	back := filepath.Join(local, "back")
	if out, errOut, code := berthCLI(t, nil, "cp", id+":/workspace/proj", back); code != 0 {
		t.Fatalf("cp dir out: exit %d: %s%s", code, out, errOut)
	}
	if got, _ := os.ReadFile(filepath.Join(back, "blob.bin")); !bytes.Equal(got, blob) {
		t.Errorf("blob.bin back: %d bytes, want the %d sent", len(got), len(blob))
	}
	if target, err := os.Readlink(filepath.Join(back, "link")); err != nil || target != "sub/deep/a b.txt" {
		t.Errorf("link back: %q, %v", target, err)
	}
	if out, errOut, code := berthCLI(t, nil, "cp", id+":proj/blob.bin", local); code != 0 {
		t.Fatalf("cp file out: exit %d: %s%s", code, out, errOut)
	}
	if fi, err := os.Stat(filepath.Join(local, "blob.bin")); err != nil || fi.Size() != int64(len(blob)) || fi.Mode().Perm() != 0o640 {
		t.Errorf("file out: %v, %v", fi, err)
	}
	// Standard input in, standard output out.
	if _, errOut, code := berthCLI(t, []byte("from stdin"), "cp", "-", id+":/tmp/in/stdin.txt"); code != 0 {
		t.Fatalf("cp - in: exit %d: %s", code, errOut)
	}
	if out, _, code := berthCLI(t, nil, "cp", id+":/tmp/in/stdin.txt", "-"); code != 0 || out != "from stdin" {
		t.Errorf("cp out to - = %q (exit %d)", out, code)
	}
	// Errors are berth's: exit 125 with the reason.
	if _, errOut, code := berthCLI(t, nil, "cat", id+":/no/such/file"); code != 125 || !strings.Contains(errOut, "FILE_NOT_FOUND") {
		t.Errorf("cat of a missing file: exit %d, stderr %q; want 125 and FILE_NOT_FOUND", code, errOut)
	}
}
