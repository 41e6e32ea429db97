package files_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// randomBytes returns n random bytes that include NUL and 0xFF.
func randomBytes(t testing.TB, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	rand.Read(b)
	if n >= 2 {
		b[0], b[n-1] = 0x00, 0xff
	}
	return b
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func TestWriteReadRoundTrip(t *testing.T) {
	a := startAgent(t, "--user", "65534:65534")
	for i, size := range []int{0, 1, 18433, 1<<20 + 1, 9 << 20} {
		t.Run("", func(t *testing.T) {
			data := randomBytes(t, size)
			path := filepath.Join(a.dir, "f", "data.bin")
			// Every other write asks for the SHA-256; the others get none.
			wantSum := i%2 == 0
			resp, err := a.writeFile(t, &agentv1.WriteFileHeader{Path: []byte(path), CreateParents: true, WantSha256: wantSum}, data)
			if err != nil {
				t.Fatalf("WriteFile %d bytes: %v", size, err)
			}
			res := resp.GetResult()
			want := ""
			if wantSum {
				want = sha(data)
			}
			if res.GetWrittenBytes() != uint64(size) || res.GetSha256() != want {
				t.Errorf("WriteFile(want_sha256 %v) = %d bytes sha %q, want %d sha %q", wantSum, res.GetWrittenBytes(), res.GetSha256(), size, want)
			}
			onDisk, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if sha(onDisk) != sha(data) {
				t.Errorf("file on disk sha %s, want %s", sha(onDisk), sha(data))
			}
			r, err := a.readFile(t, &agentv1.ReadFileRequest{Path: []byte(path)})
			if err != nil {
				t.Fatalf("ReadFile: %v", err)
			}
			h := r.header.GetHeader()
			if h.GetLengthBytes() != uint64(size) || h.GetInfo().GetSizeBytes() != uint64(size) || h.GetInfo().GetUid() != 65534 {
				t.Errorf("header = %v, want length and size %d, uid 65534", h, size)
			}
			if !bytes.Equal(r.data, data) {
				t.Errorf("read %d bytes sha %s, want %d sha %s", len(r.data), sha(r.data), size, sha(data))
			}
		})
	}
}

func TestReadRange(t *testing.T) {
	a := startAgent(t)
	data := randomBytes(t, 200_000)
	path := filepath.Join(a.dir, "r")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct{ offset, limit, wantFrom, wantTo uint64 }{
		{0, 0, 0, 200_000},
		{100, 50, 100, 150},
		{199_990, 100, 199_990, 200_000},
		{300_000, 0, 0, 0},
	}
	for _, tt := range tests {
		r, err := a.readFile(t, &agentv1.ReadFileRequest{Path: []byte(path), OffsetBytes: tt.offset, LimitBytes: tt.limit})
		if err != nil {
			t.Fatalf("ReadFile(offset %d, limit %d): %v", tt.offset, tt.limit, err)
		}
		want := data[tt.wantFrom:tt.wantTo]
		if !bytes.Equal(r.data, want) || r.header.GetHeader().GetLengthBytes() != uint64(len(want)) {
			t.Errorf("ReadFile(offset %d, limit %d) = %d bytes (header %d), want %d", tt.offset, tt.limit, len(r.data), r.header.GetHeader().GetLengthBytes(), len(want))
		}
	}
}

func TestReadCapRefusedBeforeAnyByte(t *testing.T) {
	a := startAgent(t, "--max-read-bytes", "1000")
	path := filepath.Join(a.dir, "big")
	if err := os.WriteFile(path, make([]byte, 1001), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := a.readFile(t, &agentv1.ReadFileRequest{Path: []byte(path)})
	meta := wantStatus(t, err, codes.FailedPrecondition, "FILE_TOO_LARGE", path)
	if r.header != nil || len(r.data) > 0 {
		t.Errorf("a refused read sent header %v and %d bytes", r.header, len(r.data))
	}
	if meta["limit"] != "1000" {
		t.Errorf("metadata limit = %q, want 1000", meta["limit"])
	}
	// A range within the cap is fine.
	if r, err := a.readFile(t, &agentv1.ReadFileRequest{Path: []byte(path), LimitBytes: 1000}); err != nil || len(r.data) != 1000 {
		t.Errorf("ReadFile(limit 1000) = %d bytes, %v; want 1000 bytes", len(r.data), err)
	}
	// A declared write over the write cap is refused before any byte.
	b := startAgent(t, "--max-write-bytes", "10")
	_, err = b.writeFile(t, &agentv1.WriteFileHeader{Path: []byte(filepath.Join(b.dir, "w")), SizeBytes: proto.Uint64(11)}, nil)
	wantStatus(t, err, codes.FailedPrecondition, "FILE_TOO_LARGE", filepath.Join(b.dir, "w"))
	// An undeclared one when it crosses the cap, storing nothing.
	_, err = b.writeFile(t, &agentv1.WriteFileHeader{Path: []byte(filepath.Join(b.dir, "w"))}, make([]byte, 11))
	wantStatus(t, err, codes.FailedPrecondition, "FILE_TOO_LARGE", filepath.Join(b.dir, "w"))
	if entries, _ := os.ReadDir(b.dir); len(entries) != 0 {
		t.Errorf("a refused write left %v", entries)
	}
}

func TestWriteSizeMismatchStoresNothing(t *testing.T) {
	a := startAgent(t)
	path := filepath.Join(a.dir, "short")
	_, err := a.writeFile(t, &agentv1.WriteFileHeader{Path: []byte(path), SizeBytes: proto.Uint64(10)}, make([]byte, 9))
	wantStatus(t, err, codes.InvalidArgument, "INVALID_ARGUMENT", "")
	if entries, _ := os.ReadDir(a.dir); len(entries) != 0 {
		t.Errorf("a short write left %v", entries)
	}
}

// TestOwnershipAndMode checks that a file and the parents created for it
// belong to the workload user and that the mode is applied exactly.
func TestOwnershipAndMode(t *testing.T) {
	a := startAgent(t, "--user", "1000:1001")
	path := filepath.Join(a.dir, "p1", "p2", "f.txt")
	resp, err := a.writeFile(t, &agentv1.WriteFileHeader{Path: []byte(path), Mode: proto.Uint32(0o640), CreateParents: true}, []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	if info := resp.GetResult().GetInfo(); info.GetMode() != 0o640 || info.GetUid() != 1000 || info.GetGid() != 1001 {
		t.Errorf("WriteFile info = mode %o uid %d gid %d, want 640 1000 1001", info.GetMode(), info.GetUid(), info.GetGid())
	}
	for _, p := range []string{path, filepath.Dir(path), filepath.Dir(filepath.Dir(path))} {
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		wantMode := os.FileMode(0o755) | os.ModeDir
		if p == path {
			wantMode = 0o640
		}
		if st.Uid != 1000 || st.Gid != 1001 || fi.Mode() != wantMode {
			t.Errorf("%s: uid %d gid %d mode %v, want 1000 1001 %v", p, st.Uid, st.Gid, fi.Mode(), wantMode)
		}
	}
	// MakeDir with a mode the umask would cut.
	dir := filepath.Join(a.dir, "m1", "m2")
	mresp, err := a.files.MakeDir(testCtx(t), &agentv1.MakeDirRequest{Path: []byte(dir), Parents: true, Mode: proto.Uint32(0o775)})
	if err != nil {
		t.Fatal(err)
	}
	if info := mresp.GetInfo(); info.GetMode() != 0o775 || info.GetUid() != 1000 || info.GetType() != berthv1.FileType_FILE_TYPE_DIRECTORY {
		t.Errorf("MakeDir info = %v, want mode 775 uid 1000 directory", info)
	}
	// An owner other than the workload user is applied with CAP_CHOWN.
	other := filepath.Join(a.dir, "other")
	resp, err = a.writeFile(t, &agentv1.WriteFileHeader{Path: []byte(other), Uid: proto.Uint32(2000), Gid: proto.Uint32(2001)}, []byte("y"))
	if err != nil {
		t.Fatal(err)
	}
	if info := resp.GetResult().GetInfo(); info.GetUid() != 2000 || info.GetGid() != 2001 {
		t.Errorf("WriteFile with owner 2000:2001 stored uid %d gid %d", info.GetUid(), info.GetGid())
	}
}

// TestPermissionsOfTheWorkloadUser checks that file operations run with
// the workload user's permissions, not the agent's (root).
func TestPermissionsOfTheWorkloadUser(t *testing.T) {
	a := startAgent(t, "--user", "1000:1000")
	secret := filepath.Join(a.dir, "secret")
	if err := os.WriteFile(secret, []byte("root only"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := a.readFile(t, &agentv1.ReadFileRequest{Path: []byte(secret)})
	wantStatus(t, err, codes.PermissionDenied, "PERMISSION_DENIED", secret)

	locked := filepath.Join(a.dir, "locked")
	if err := os.Mkdir(locked, 0o755); err != nil {
		t.Fatal(err)
	}
	_, err = a.writeFile(t, &agentv1.WriteFileHeader{Path: []byte(filepath.Join(locked, "f"))}, []byte("x"))
	wantStatus(t, err, codes.PermissionDenied, "PERMISSION_DENIED", filepath.Join(locked, "f"))
	_, err = a.files.Remove(testCtx(t), &agentv1.RemoveRequest{Path: []byte(secret)})
	if err != nil {
		t.Errorf("Remove of a file in a 0777 directory as another user: %v", err)
	}
	// Supplementary groups of the agent (root's) must not apply.
	grp := filepath.Join(a.dir, "grp")
	if err := os.WriteFile(grp, []byte("group 0"), 0o640); err != nil {
		t.Fatal(err)
	}
	_, err = a.readFile(t, &agentv1.ReadFileRequest{Path: []byte(grp)})
	wantStatus(t, err, codes.PermissionDenied, "PERMISSION_DENIED", grp)
}

func TestErrors(t *testing.T) {
	a := startAgent(t)
	file := filepath.Join(a.dir, "file")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(a.dir, "missing")
	ctx := testCtx(t)

	_, err := a.files.Stat(ctx, &agentv1.StatRequest{Path: []byte(missing)})
	wantStatus(t, err, codes.NotFound, "FILE_NOT_FOUND", missing)
	_, err = a.readFile(t, &agentv1.ReadFileRequest{Path: []byte(missing)})
	wantStatus(t, err, codes.NotFound, "FILE_NOT_FOUND", missing)
	_, err = a.readFile(t, &agentv1.ReadFileRequest{Path: []byte(a.dir)})
	wantStatus(t, err, codes.FailedPrecondition, "IS_A_DIRECTORY", a.dir)
	_, err = a.writeFile(t, &agentv1.WriteFileHeader{Path: []byte(a.dir + "/")}, []byte("x"))
	wantStatus(t, err, codes.FailedPrecondition, "IS_A_DIRECTORY", a.dir)
	_, err = a.writeFile(t, &agentv1.WriteFileHeader{Path: []byte(filepath.Join(missing, "f"))}, []byte("x"))
	wantStatus(t, err, codes.NotFound, "FILE_NOT_FOUND", filepath.Join(missing, "f"))
	_, err = a.files.Remove(ctx, &agentv1.RemoveRequest{Path: []byte(missing)})
	wantStatus(t, err, codes.NotFound, "FILE_NOT_FOUND", missing)
	_, err = a.files.MakeDir(ctx, &agentv1.MakeDirRequest{Path: []byte(file)})
	wantStatus(t, err, codes.AlreadyExists, "FILE_EXISTS", file)

	// A path through a regular file fails and creates nothing.
	through := filepath.Join(file, "sub", "f")
	_, err = a.writeFile(t, &agentv1.WriteFileHeader{Path: []byte(through), CreateParents: true}, []byte("x"))
	wantStatus(t, err, codes.FailedPrecondition, "NOT_A_DIRECTORY", file)
	_, err = a.files.Stat(ctx, &agentv1.StatRequest{Path: []byte(through)})
	wantStatus(t, err, codes.FailedPrecondition, "NOT_A_DIRECTORY", through)
	_, err = a.files.MakeDir(ctx, &agentv1.MakeDirRequest{Path: []byte(filepath.Join(file, "d")), Parents: true})
	wantStatus(t, err, codes.FailedPrecondition, "NOT_A_DIRECTORY", file)
	if entries, _ := os.ReadDir(a.dir); len(entries) != 1 {
		t.Errorf("failed writes left %d entries in %s, want only the file", len(entries), a.dir)
	}

	nonEmpty := filepath.Join(a.dir, "ne")
	if err := os.MkdirAll(filepath.Join(nonEmpty, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err = a.files.Remove(ctx, &agentv1.RemoveRequest{Path: []byte(nonEmpty)})
	wantStatus(t, err, codes.FailedPrecondition, "DIRECTORY_NOT_EMPTY", nonEmpty)
	if _, err := a.files.Remove(ctx, &agentv1.RemoveRequest{Path: []byte(nonEmpty), Recursive: true}); err != nil {
		t.Errorf("Remove recursive: %v", err)
	}
	_, err = a.files.Rename(ctx, &agentv1.RenameRequest{FromPath: []byte(file), ToPath: []byte(a.dir)})
	wantStatus(t, err, codes.AlreadyExists, "FILE_EXISTS", a.dir)

	for _, bad := range []string{"", "relative", "/a\x00b"} {
		_, err = a.files.Stat(ctx, &agentv1.StatRequest{Path: []byte(bad)})
		wantStatus(t, err, codes.InvalidArgument, "INVALID_ARGUMENT", "")
	}
	_, err = a.files.Remove(ctx, &agentv1.RemoveRequest{Path: []byte("/"), Recursive: true})
	wantStatus(t, err, codes.InvalidArgument, "INVALID_ARGUMENT", "")
}

func TestRenameAndAppend(t *testing.T) {
	a := startAgent(t, "--user", "65534:65534")
	ctx := testCtx(t)
	p := filepath.Join(a.dir, "log")
	for _, part := range []string{"one\n", "two\n"} {
		if _, err := a.writeFile(t, &agentv1.WriteFileHeader{Path: []byte(p), WriteMode: berthv1.WriteMode_WRITE_MODE_APPEND, Mode: proto.Uint32(0o600)}, []byte(part)); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := os.ReadFile(p); string(got) != "one\ntwo\n" {
		t.Errorf("appended file = %q, want %q", got, "one\ntwo\n")
	}
	q := filepath.Join(a.dir, "log2")
	if _, err := a.files.Rename(ctx, &agentv1.RenameRequest{FromPath: []byte(p), ToPath: []byte(q)}); err != nil {
		t.Fatal(err)
	}
	// A replace keeps the replaced file's mode when none is given.
	if _, err := a.writeFile(t, &agentv1.WriteFileHeader{Path: []byte(q)}, []byte("new")); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(q)
	if err != nil || fi.Mode() != 0o600 {
		t.Errorf("replaced file mode %v (%v), want -rw-------", fi.Mode(), err)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Errorf("renamed-from path still exists: %v", err)
	}
	// Replace renames over a symlink: the link is replaced, its target kept.
	target := filepath.Join(a.dir, "target")
	os.WriteFile(target, []byte("keep"), 0o644)
	link := filepath.Join(a.dir, "link")
	os.Symlink("target", link)
	if _, err := a.writeFile(t, &agentv1.WriteFileHeader{Path: []byte(link)}, []byte("replaced")); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(target); string(got) != "keep" {
		t.Errorf("symlink target = %q after a replace of the link, want %q", got, "keep")
	}
	if fi, _ := os.Lstat(link); fi == nil || !fi.Mode().IsRegular() {
		t.Errorf("link after a replace = %v, want a regular file", fi)
	}
}

// TestWriteAbortedStoresNothing cancels a write mid-stream: no file, no
// temporary file, and no directory it created may remain.
func TestWriteAbortedStoresNothing(t *testing.T) {
	a := startAgent(t, "--user", "65534:65534")
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := a.files.WriteFile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(a.dir, "new", "dirs", "f")
	stream.Send(&agentv1.WriteFileRequest{Part: &agentv1.WriteFileRequest_Header{Header: &agentv1.WriteFileHeader{Path: []byte(path), CreateParents: true}}})
	stream.Send(&agentv1.WriteFileRequest{Part: &agentv1.WriteFileRequest_Chunk{Chunk: make([]byte, 1<<20)}})
	// Wait until the agent has created the file in its staged parents
	// (".new.berth-*.tmp/dirs/f"), then cancel.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if staged, _ := filepath.Glob(filepath.Join(a.dir, ".new.berth-*.tmp", "dirs", "f")); len(staged) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the agent did not start the write within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	for {
		entries, _ := os.ReadDir(a.dir)
		if len(entries) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a canceled write %s still holds %v", a.dir, entries)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRootWorkloadHasNoCapabilities runs the agent as root with its
// capabilities and root as the workload user: file operations must not use
// CAP_DAC_OVERRIDE, which the workload's own processes do not have.
func TestRootWorkloadHasNoCapabilities(t *testing.T) {
	a := startAgent(t)
	other := filepath.Join(a.dir, "other")
	if err := os.WriteFile(other, []byte("1000's"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(other, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	_, err := a.readFile(t, &agentv1.ReadFileRequest{Path: []byte(other)})
	wantStatus(t, err, codes.PermissionDenied, "PERMISSION_DENIED", other)
}

// TestWriteCreateParentsWithOwner writes with create_parents and an owner
// other than the workload user (root without capabilities, as in a
// sandbox): the file and its new parents appear together, owned as asked;
// a write that fails leaves none of them. A file where a directory is
// needed is NOT_A_DIRECTORY with and without create_parents, and for
// MakeDir.
func TestWriteCreateParentsWithOwner(t *testing.T) {
	a := startAgent(t, "--user", "0:0")
	path := filepath.Join(a.dir, "o", "p", "q.txt")
	h := &agentv1.WriteFileHeader{Path: []byte(path), Uid: proto.Uint32(1234), Gid: proto.Uint32(2345), CreateParents: true, Mode: proto.Uint32(0o4750)}
	if _, err := a.writeFile(t, h, []byte("q")); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	for _, p := range []string{path, filepath.Dir(path), filepath.Dir(filepath.Dir(path))} {
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		wantMode := uint32(0o755)
		if p == path {
			wantMode = 0o4750
		}
		if st.Uid != 1234 || st.Gid != 2345 || st.Mode&0o7777 != wantMode {
			t.Errorf("%s: %d:%d mode %o, want 1234:2345 mode %o", p, st.Uid, st.Gid, st.Mode&0o7777, wantMode)
		}
	}
	if entries, _ := os.ReadDir(a.dir); len(entries) != 1 {
		t.Errorf("%s holds %v, want only o", a.dir, entries)
	}
	// A failed write (fewer bytes than declared) leaves nothing.
	h = &agentv1.WriteFileHeader{Path: []byte(filepath.Join(a.dir, "x", "y", "z")), Uid: proto.Uint32(1234), Gid: proto.Uint32(2345), CreateParents: true, SizeBytes: proto.Uint64(5)}
	_, err := a.writeFile(t, h, []byte("abc"))
	wantStatus(t, err, codes.InvalidArgument, "INVALID_ARGUMENT", "")
	if entries, _ := os.ReadDir(a.dir); len(entries) != 1 {
		t.Errorf("%s holds %v after a failed write, want only o", a.dir, entries)
	}

	file := filepath.Join(a.dir, "f")
	os.WriteFile(file, []byte("a file"), 0o644)
	for _, parents := range []bool{false, true} {
		_, err := a.writeFile(t, &agentv1.WriteFileHeader{Path: []byte(filepath.Join(file, "g")), CreateParents: parents}, []byte("x"))
		wantStatus(t, err, codes.FailedPrecondition, "NOT_A_DIRECTORY", "")
		_, err = a.writeFile(t, &agentv1.WriteFileHeader{Path: []byte(filepath.Join(file, "g", "h")), CreateParents: parents}, []byte("x"))
		wantStatus(t, err, codes.FailedPrecondition, "NOT_A_DIRECTORY", "")
		_, err = a.files.MakeDir(testCtx(t), &agentv1.MakeDirRequest{Path: []byte(filepath.Join(file, "g")), Parents: parents})
		wantStatus(t, err, codes.FailedPrecondition, "NOT_A_DIRECTORY", "")
	}
}

// TestAgentOwnDirectoryRefused: no file call reads, writes, renames or
// removes anything in the directory of the agent's socket (/.berth-run in
// a sandbox), by its path or through a symbolic link; the socket stays.
// Removing it made the sandbox unreachable to the next berthd.
func TestAgentOwnDirectoryRefused(t *testing.T) {
	a := startAgent(t)
	ctx := testCtx(t)
	sock := filepath.Join(a.run, "a.sock")
	link := filepath.Join(a.dir, "run-link")
	if err := os.Symlink(a.run, link); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a.dir, "f"), []byte("x"), 0o666); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{sock, filepath.Join(link, "a.sock"), a.run, link} {
		if p != link { // removing the link removes only the link
			_, err := a.files.Remove(ctx, &agentv1.RemoveRequest{Path: []byte(p), Recursive: true})
			wantStatus(t, err, codes.PermissionDenied, "PERMISSION_DENIED", p)
		}
		read, err := a.files.ReadFile(ctx, &agentv1.ReadFileRequest{Path: []byte(filepath.Join(p, "secret"))})
		if err == nil {
			_, err = read.Recv()
		}
		wantStatus(t, err, codes.PermissionDenied, "PERMISSION_DENIED", filepath.Join(p, "secret"))
	}
	parent := filepath.Dir(a.run)
	_, err := a.files.Remove(ctx, &agentv1.RemoveRequest{Path: []byte(parent), Recursive: true})
	wantStatus(t, err, codes.PermissionDenied, "PERMISSION_DENIED", parent)
	_, err = a.files.Rename(ctx, &agentv1.RenameRequest{FromPath: []byte(parent), ToPath: []byte(parent + "-moved")})
	wantStatus(t, err, codes.PermissionDenied, "PERMISSION_DENIED", parent)
	_, err = a.files.Rename(ctx, &agentv1.RenameRequest{FromPath: []byte(sock), ToPath: []byte(filepath.Join(a.dir, "stolen"))})
	wantStatus(t, err, codes.PermissionDenied, "PERMISSION_DENIED", sock)
	_, err = a.files.Rename(ctx, &agentv1.RenameRequest{FromPath: []byte(filepath.Join(a.dir, "f")), ToPath: []byte(filepath.Join(link, "a.sock")), Overwrite: true})
	wantStatus(t, err, codes.PermissionDenied, "PERMISSION_DENIED", filepath.Join(link, "a.sock"))
	_, err = a.files.MakeDir(ctx, &agentv1.MakeDirRequest{Path: []byte(filepath.Join(link, "d"))})
	wantStatus(t, err, codes.PermissionDenied, "PERMISSION_DENIED", filepath.Join(link, "d"))
	_, err = a.writeFile(t, &agentv1.WriteFileHeader{Path: []byte(filepath.Join(a.run, "x"))}, []byte("x"))
	wantStatus(t, err, codes.PermissionDenied, "PERMISSION_DENIED", filepath.Join(a.run, "x"))
	if st, err := os.Lstat(sock); err != nil || st.Mode().Type() != os.ModeSocket {
		t.Errorf("the agent's socket after the calls: %v, %v", st, err)
	}
	// The link itself is the workload's.
	if _, err := a.files.Remove(ctx, &agentv1.RemoveRequest{Path: []byte(link)}); err != nil {
		t.Errorf("remove a link to the agent's directory: %v", err)
	}
	if _, err := os.Lstat(a.run); err != nil {
		t.Errorf("the agent's directory after its link was removed: %v", err)
	}
}
