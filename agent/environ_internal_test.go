package agent

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestLookupUID(t *testing.T) {
	passwd := filepath.Join(t.TempDir(), "passwd")
	os.WriteFile(passwd, []byte("# comment\nroot:x:0:0:root:/root:/bin/bash\nbroken:line\ndev:x:1000:1000:Dev,,,:/home/dev:/bin/zsh\nbare:x:1001:1001::::\n"), 0o644)
	for _, tt := range []struct {
		uid  uint32
		want *passwdEntry
	}{
		{0, &passwdEntry{"root", "/root", "/bin/bash", 0, 0}},
		{1000, &passwdEntry{"dev", "/home/dev", "/bin/zsh", 1000, 1000}},
		{1001, &passwdEntry{"bare", "/", "/bin/sh", 1001, 1001}},
		{4242, nil},
	} {
		got, err := lookupUID(passwd, tt.uid)
		if err != nil || (got == nil) != (tt.want == nil) || got != nil && *got != *tt.want {
			t.Errorf("lookupUID(%d) = %+v, %v; want %+v", tt.uid, got, err, tt.want)
		}
	}
	if _, err := lookupUID(filepath.Join(t.TempDir(), "none"), 0); !os.IsNotExist(err) {
		t.Errorf("lookupUID of a missing file: %v, want not-exist", err)
	}
}

func TestNameHost(t *testing.T) {
	dir := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	for _, tt := range []struct{ before, want string }{
		{"", "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tsb-1\n"},
		{"127.0.0.1 localhost", "127.0.0.1 localhost\n127.0.1.1\tsb-1\n"},
		{"127.0.0.1 localhost\n10.0.0.2 SB-1 other # mine\n", "127.0.0.1 localhost\n10.0.0.2 SB-1 other # mine\n"},
		{"127.0.0.1 localhost # sb-1\n", "127.0.0.1 localhost # sb-1\n127.0.1.1\tsb-1\n"},
	} {
		hosts := filepath.Join(dir, "hosts")
		os.Remove(hosts)
		if tt.before != "" {
			os.WriteFile(hosts, []byte(tt.before), 0o644)
		}
		nameHost(log, hosts, "sb-1")
		nameHost(log, hosts, "sb-1") // a restarted agent adds nothing more
		if got, _ := os.ReadFile(hosts); string(got) != tt.want {
			t.Errorf("hosts from %q = %q, want %q", tt.before, got, tt.want)
		}
	}
	// A symlink is not followed.
	target := filepath.Join(dir, "target")
	os.WriteFile(target, []byte("x"), 0o644)
	link := filepath.Join(dir, "link")
	os.Symlink(target, link)
	nameHost(log, link, "sb-1")
	if got, _ := os.ReadFile(target); string(got) != "x" {
		t.Errorf("nameHost wrote through a symlink: %q", got)
	}
}

func TestLoginEnv(t *testing.T) {
	s := &Server{cfg: Config{UID: 0}, log: slog.New(slog.DiscardHandler)}
	got := s.loginEnv([]string{"HOME=/from-runc", "LANG=C.UTF-8", "USER=custom"}, 0)
	// The host's /etc/passwd has root.
	for _, want := range []string{"HOME=/root", "USER=custom", "LOGNAME=root", "LANG=C.UTF-8", "PATH=" + defaultPath} {
		if !slices.Contains(got, want) {
			t.Errorf("loginEnv = %q, want %s in it", got, want)
		}
	}
	s.cfg.KeepHome = true
	if got := s.loginEnv([]string{"HOME=/mine", "PATH=/bin"}, 0); !slices.Contains(got, "HOME=/mine") || !slices.Contains(got, "PATH=/bin") || slices.Contains(got, "PATH="+defaultPath) {
		t.Errorf("loginEnv with KeepHome = %q, want HOME and PATH kept", got)
	}
	s.cfg.KeepHome = false
	if got := s.loginEnv(nil, 4_000_000); !slices.Contains(got, "HOME=/") || slices.ContainsFunc(got, func(kv string) bool { return kv[:5] == "USER=" }) {
		t.Errorf("loginEnv of a user without an entry = %q, want HOME=/ and no USER", got)
	}
}

// TestResolveUser: process.user ("berth exec -u") by number or by name in
// the sandbox's /etc/passwd, with the group defaulting to the user's.
func TestResolveUser(t *testing.T) {
	passwd := filepath.Join(t.TempDir(), "passwd")
	os.WriteFile(passwd, []byte("root:x:0:0:root:/root:/bin/bash\ndev:x:1000:100:Dev:/home/dev:/bin/sh\n"), 0o644)
	for _, tt := range []struct {
		in       string
		uid, gid uint32
		wantErr  string
	}{
		{in: "0", uid: 0, gid: 0},
		{in: "1000", uid: 1000, gid: 100},
		{in: "1000:7", uid: 1000, gid: 7},
		{in: "4242", uid: 4242, gid: 4242},
		{in: "dev", uid: 1000, gid: 100},
		{in: "dev:0", uid: 1000, gid: 0},
		{in: "root", uid: 0, gid: 0},
		{in: "nobody", wantErr: "no such user"},
		{in: "dev:staff", wantErr: "the group must be a number"},
		{in: "4294967295", wantErr: "no such user"},
		{in: ":5", wantErr: "want"},
	} {
		uid, gid, err := resolveUser(passwd, tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "process.user") {
				t.Errorf("resolveUser(%q) = %d, %d, %v; want an error naming process.user: %s", tt.in, uid, gid, err, tt.wantErr)
			}
			continue
		}
		if err != nil || uid != tt.uid || gid != tt.gid {
			t.Errorf("resolveUser(%q) = %d, %d, %v; want %d, %d", tt.in, uid, gid, err, tt.uid, tt.gid)
		}
	}
}

// TestPasswdCache checks that an unchanged passwd file is not read again
// (the same entry comes back), and that every change counts at the next
// lookup: a line added in place (new size and times), a same-size rewrite
// (new times), the file replaced by rename (new inode), and a symlink in
// its place (refused, as without the cache).
func TestPasswdCache(t *testing.T) {
	dir := t.TempDir()
	passwd := filepath.Join(dir, "passwd")
	write := func(content string) {
		t.Helper()
		if err := os.WriteFile(passwd, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want := func(uid uint32, name string) *passwdEntry {
		t.Helper()
		e, err := lookupUID(passwd, uid)
		if err != nil || (e == nil) != (name == "") || e != nil && e.name != name {
			t.Fatalf("lookupUID(%d) = %+v, %v; want %q", uid, e, err, name)
		}
		return e
	}
	write("root:x:0:0:root:/root:/bin/sh\n")
	// Just written: read at every lookup.
	if first := want(0, "root"); want(0, "root") == first {
		t.Error("a file changed a moment ago was answered from the cache")
	}
	// Settled (passwdSettle 0 stands for a file older than a second).
	defer func(d time.Duration) { passwdSettle = d }(passwdSettle)
	passwdSettle = 0
	first := want(0, "root")
	if again := want(0, "root"); again != first {
		t.Error("an unchanged file was read again (a new entry came back)")
	}
	want(1000, "")

	write("root:x:0:0:root:/root:/bin/sh\ndev:x:1000:1000::/home/dev:/bin/sh\n")
	want(1000, "dev")

	// Same size, new times.
	write("root:x:0:0:root:/root:/bin/sh\nabc:x:1000:1000::/home/dev:/bin/sh\n")
	want(1000, "abc")

	// Replaced by rename: another inode.
	next := filepath.Join(dir, "passwd.new")
	os.WriteFile(next, []byte("root:x:0:0:root:/root:/bin/sh\nxyz:x:1000:1000::/home/dev:/bin/sh\n"), 0o644)
	if err := os.Rename(next, passwd); err != nil {
		t.Fatal(err)
	}
	want(1000, "xyz")

	// A symlink is refused, not answered from the cache.
	os.Rename(passwd, next)
	os.Symlink(next, passwd)
	if e, err := lookupUID(passwd, 1000); err == nil || e != nil {
		t.Errorf("lookupUID through a symlink = %+v, %v; want an error", e, err)
	}
}
