package integration

import (
	"bytes"
	"context"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/tartree/treetest"
)

// TestFilesFidelityCLI copies a tree as real trees are (internal/tartree/
// treetest: a venv's absolute and relative symlinks, hard links, a FIFO, a
// device node, a 64 MiB sparse file, long names, other owners, mtimes to
// the nanosecond) into a sandbox and out again with berth cp -a, and out
// as a tar stream that GNU tar, bsdtar and busybox tar list and extract.
func TestFilesFidelityCLI(t *testing.T) {
	need(t)
	id := newSandbox(t, nil).GetId()
	local := t.TempDir()
	src := filepath.Join(local, "tree")
	treetest.Make(t, src, treetest.Options{})

	// The device node cannot be made in the sandbox: named, exit 1; with
	// --skip-special, exit 0 and still named.
	_, errOut, code := berthCLI(t, nil, "cp", "-a", src, id+":/workspace/first")
	if code != 1 || !strings.Contains(errOut, "skipped "+treetest.Device+": ") {
		t.Fatalf("cp -a in: exit %d, stderr %q; want 1 and the device named", code, errOut)
	}
	_, errOut, code = berthCLI(t, nil, "cp", "-a", "--skip-special", src, id+":/workspace/tree")
	if code != 0 || !strings.Contains(errOut, "skipped "+treetest.Device+": ") {
		t.Fatalf("cp -a --skip-special in: exit %d, stderr %q; want 0 and the device named", code, errOut)
	}
	// In the sandbox: the sparse file holds its holes, hard links are one
	// file.
	r := run(t, id, "stat", "-c", "%b %h %s", "/workspace/tree/"+treetest.Sparse, "/workspace/tree/venv/hard", "/workspace/tree/data/binary")
	lines := strings.Fields(string(r.GetStdout()))
	if len(lines) != 9 || lines[0] == "0" || len(lines[0]) > 3 || lines[4] != "2" || lines[7] != "2" {
		t.Errorf("stat in the sandbox = %q (%s); want a sparse file of few blocks and two links of data/binary", r.GetStdout(), r.GetStderr())
	}

	back := filepath.Join(local, "back")
	if _, errOut, code := berthCLI(t, nil, "cp", "-a", id+":/workspace/tree", back); code != 0 {
		t.Fatalf("cp -a out: exit %d: %s", code, errOut)
	}
	treetest.Check(t, src, back, treetest.Compare{Owners: true, Missing: []string{treetest.Device}})

	// Without -a: the workload user and you own everything, mtimes and
	// modes (but setuid/setgid) still travel.
	plain := filepath.Join(local, "plain")
	if _, errOut, code := berthCLI(t, nil, "cp", id+":/workspace/tree", plain); code != 0 {
		t.Fatalf("cp out: exit %d: %s", code, errOut)
	}
	treetest.Check(t, src, plain, treetest.Compare{NoSpecialSet: true, Missing: []string{treetest.Device}})

	// As a tar stream, for the three tar implementations.
	stream, errOut, code := berthCLI(t, nil, "cp", id+":/workspace/tree", "-")
	if code != 0 {
		t.Fatalf("cp out to -: exit %d: %s", code, errOut)
	}
	for _, tool := range []string{"gnu", "bsdtar", "busybox"} {
		argv := treetest.Tool(t, tool)
		list := treetest.Run(t, "", []byte(stream), append(argv, "-tvf", "-")...)
		if !bytes.Contains(list, []byte("venv/bin/python -> /usr/bin/python3")) {
			t.Errorf("%s -tv lacks the venv's python symlink:\n%s", tool, list)
		}
		if tool == "busybox" {
			continue // it cannot extract sparse entries
		}
		dst := t.TempDir()
		treetest.Run(t, dst, []byte(stream), append(argv, "--numeric-owner", "-xpf", "-")...)
		treetest.Check(t, src, dst, treetest.Compare{Owners: true, Missing: []string{treetest.Device}})
	}
}

// TestFilesFidelityRPC uploads what GNU tar (pax and GNU formats,
// --sparse), bsdtar and busybox tar archive, through the Upload RPC with
// keep_owners, downloads it through the Download RPC, and has the same
// tool extract that: the tree comes back whole.
func TestFilesFidelityRPC(t *testing.T) {
	need(t)
	id := newSandbox(t, nil).GetId()
	c := dialClient(t, env.berthdAddr)
	ctx := fileCtx(t)
	for _, tc := range []struct {
		name    string
		tool    string
		create  []string
		compare treetest.Compare
	}{
		{"gnu-pax", "gnu", []string{"--format=pax", "--sparse", "--numeric-owner", "-cf", "-", "."}, treetest.Compare{Owners: true}},
		{"gnu-gnu", "gnu", []string{"--format=gnu", "--sparse", "-cf", "-", "."}, treetest.Compare{Owners: true, Seconds: true}},
		{"bsdtar", "bsdtar", []string{"-cf", "-", "."}, treetest.Compare{Owners: true, Seconds: true}},
		{"busybox", "busybox", []string{"-cf", "-", "."}, treetest.Compare{Owners: true, Seconds: true, NoLinkTimes: true, NoDirTimes: true, NoLinkOwners: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			argv := treetest.Tool(t, tc.tool)
			src := filepath.Join(t.TempDir(), "tree")
			treetest.Make(t, src, treetest.Options{NoSparse: tc.tool == "busybox"})
			// bsdtar warns that it cannot translate the name that is
			// not UTF-8 (and archives it): creation may speak.
			cmd := exec.Command(argv[0], append(argv[1:], tc.create...)...)
			cmd.Dir = src
			archive, err := cmd.Output()
			if err != nil {
				t.Fatalf("%s: %v", cmd, err)
			}
			dir := "/workspace/rpc-" + tc.name
			resp, err := c.Upload(ctx, id, dir, bytes.NewReader(archive), client.WithKeepOwners())
			if err != nil {
				t.Fatalf("Upload: %v", err)
			}
			if len(resp.GetSkipped()) != 1 || string(resp.GetSkipped()[0]) != "./"+treetest.Device || resp.GetHardLinks() != 2 || resp.GetSpecialFiles() != 1 {
				t.Errorf("Upload = %v, want the device skipped, 2 hard links, 1 FIFO", resp)
			}
			var out bytes.Buffer
			if _, err := c.Download(ctx, id, dir, &out); err != nil {
				t.Fatalf("Download: %v", err)
			}
			treetest.Run(t, "", out.Bytes(), append(argv, "-tvf", "-")...)
			dst := t.TempDir()
			x := []string{"--numeric-owner", "-xpf", "-"}
			if tc.tool == "busybox" {
				x = []string{"--numeric-owner", "-xf", "-"}
			}
			treetest.Run(t, dst, out.Bytes(), append(argv, x...)...)
			tc.compare.Missing = []string{treetest.Device}
			treetest.Check(t, src, dst, tc.compare)
		})
	}
}

// TestFilesUploadCanceled cancels an upload half-way, through the public
// API: the sandbox keeps nothing of it, not even a staging directory.
func TestFilesUploadCanceled(t *testing.T) {
	need(t)
	id := newSandbox(t, nil).GetId()
	c := dialClient(t, env.berthdAddr)
	if r := run(t, id, "sh", "-c", "mkdir -p /workspace/up && echo keep > /workspace/up/old"); r.GetResult().GetExitCode() != 0 {
		t.Fatalf("setup: %s", r.GetStderr())
	}
	archive := treeArchive(t)
	for _, into := range []string{"/workspace/up", "/workspace/new/deeper"} {
		ctx, cancel := context.WithCancel(fileCtx(t))
		done, pw := stalledUpload(ctx, c, id, into, archive)
		// Wait until the sandbox holds a staging directory with content.
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			r := run(t, id, "sh", "-c", "ls -d /workspace/up/.berth-upload-*/venv /workspace/.berth-upload-*/deeper/venv 2>/dev/null")
			if len(r.GetStdout()) > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no staging directory appeared for the upload to %s", into)
			}
		}
		cancel()
		// Upload may be blocked reading the stalled pipe (everything it
		// had was sent): a read it is in cannot see the cancel, so the
		// writer gives up too, as a caller's source would be closed.
		pw.CloseWithError(context.Canceled)
		if err := <-done; err == nil {
			t.Fatalf("the canceled upload to %s succeeded", into)
		}
		pw.Close()
		want := "/workspace:\nup\n\n/workspace/up:\nold\n"
		var got string
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if got = string(run(t, id, "ls", "-A", "/workspace", "/workspace/up").GetStdout()); got == want {
				break
			}
		}
		if got != want {
			t.Errorf("after the canceled upload to %s: %q, want %q", into, got, want)
		}
	}
}

// TestFilesStagingAfterAgentCrash kills the sandbox's agent (SIGKILL) in
// the middle of an upload: its staging directory stays in the sandbox's
// disk. The agent of the new task removes it before it serves (it recorded
// it in /.berth-run), and leaves the workload's own directory of the same
// name pattern.
func TestFilesStagingAfterAgentCrash(t *testing.T) {
	need(t)
	sb := newSandbox(t, nil)
	id := sb.GetId()
	c := dialClient(t, env.berthdAddr)
	if r := run(t, id, "sh", "-c", "mkdir -p /workspace/up/.berth-upload-0123456789ab && echo keep > /workspace/up/old"); r.GetResult().GetExitCode() != 0 {
		t.Fatalf("setup: %s", r.GetStderr())
	}
	ctx, cancel := context.WithCancel(fileCtx(t))
	defer cancel()
	done, pw := stalledUpload(ctx, c, id, "/workspace/up", treeArchive(t))
	defer pw.Close()
	var staging string
	for deadline := time.Now().Add(20 * time.Second); staging == ""; time.Sleep(20 * time.Millisecond) {
		r := run(t, id, "sh", "-c", "ls -d /workspace/up/.berth-upload-*/venv 2>/dev/null")
		staging = strings.TrimSuffix(strings.TrimSpace(string(r.GetStdout())), "/venv")
		if staging == "" && time.Now().After(deadline) {
			t.Fatal("no staging directory appeared for the upload")
		}
	}
	signalAgent(t, sb.GetRuntime().GetTaskPid(), syscall.SIGKILL)
	if err := <-done; err == nil {
		t.Fatal("the upload whose agent was killed succeeded")
	}
	waitRuntime(t, c, id, sb.GetRuntime().GetAgentBootId())
	want := ".berth-upload-0123456789ab\nold\n"
	if got := string(run(t, id, "ls", "-A", "/workspace/up").GetStdout()); got != want {
		t.Errorf("after the agent's restart: %q, want %q (staging directory %s removed, the workload's own kept)", got, want, staging)
	}
}

// treeArchive returns a tar archive of a test tree (treetest, no device
// nodes), large enough that half of it leaves an upload mid-extraction.
func treeArchive(t *testing.T) []byte {
	t.Helper()
	src := filepath.Join(t.TempDir(), "tree")
	treetest.Make(t, src, treetest.Options{NoDevice: true})
	return treetest.Run(t, src, nil, "tar", "-cf", "-", ".")
}

// stalledUpload uploads the first half of archive into dir of sandbox id
// and then stalls: the agent waits for the rest, its staging directory
// made. The upload's error arrives on the channel; pw ends the stall.
func stalledUpload(ctx context.Context, c *client.Client, id, dir string, archive []byte) (<-chan error, *io.PipeWriter) {
	pr, pw := io.Pipe()
	go func() {
		pw.Write(archive[:len(archive)/2]) // then the writer stalls
	}()
	done := make(chan error, 1)
	go func() {
		_, err := c.Upload(ctx, id, dir, pr)
		done <- err
	}()
	return done, pw
}
