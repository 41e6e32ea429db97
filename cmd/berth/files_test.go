package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

func TestParseRemote(t *testing.T) {
	tests := []struct {
		arg      string
		want     remote
		isRemote bool
	}{
		{arg: "dev:/etc/passwd", want: remote{"dev", "/etc/passwd"}, isRemote: true},
		{arg: "dev:src/a", want: remote{"dev", "/workspace/src/a"}, isRemote: true},
		{arg: "dev:", want: remote{"dev", "/workspace"}, isRemote: true},
		{arg: "dev:/a/../b/", want: remote{"dev", "/b"}, isRemote: true},
		{arg: "./dev:x"},
		{arg: "/tmp/dev:x"},
		{arg: "Dev:x"}, // not a sandbox id
		{arg: "local.txt"},
		{arg: "-"},
	}
	for _, tt := range tests {
		got, ok := parseRemote(tt.arg)
		if ok != tt.isRemote || got != tt.want {
			t.Errorf("parseRemote(%q) = %v, %v, want %v, %v", tt.arg, got, ok, tt.want, tt.isRemote)
		}
	}
}

func TestWriteListing(t *testing.T) {
	mtime := timestamppb.New(timestamppb.Now().AsTime())
	entries := []*berthv1.FileInfo{
		{DisplayPath: "/w/d", Type: berthv1.FileType_FILE_TYPE_DIRECTORY, Mode: 0o755, ModifiedAt: mtime},
		{DisplayPath: `/w/d/caf\xe9`, Type: berthv1.FileType_FILE_TYPE_REGULAR, Mode: 0o4750, SizeBytes: 12, Uid: 1000, ModifiedAt: mtime},
		{DisplayPath: "/w/l", Type: berthv1.FileType_FILE_TYPE_SYMLINK, Mode: 0o777, DisplaySymlinkTarget: "d", ModifiedAt: mtime},
	}
	var short bytes.Buffer
	writeListing(&short, "/w", entries, false)
	if got, want := short.String(), "d\nd/caf\\xe9\nl\n"; got != want {
		t.Errorf("listing = %q, want %q", got, want)
	}
	var long bytes.Buffer
	writeListing(&long, "/w/", entries, true)
	for _, want := range []string{"drwxr-xr-x", "-rwsr-x---", "lrwxrwxrwx", "l -> d", " 1000 "} {
		if !bytes.Contains(long.Bytes(), []byte(want)) {
			t.Errorf("long listing lacks %q:\n%s", want, long.String())
		}
	}
}

// TestWriteListingControlCharacters lists names a sandbox chose to attack
// the terminal of whoever lists them: escape sequences, a newline that
// fakes a second entry, a C1 CSI, a right-to-left override. None reaches
// the output as is.
func TestWriteListingControlCharacters(t *testing.T) {
	mtime := timestamppb.Now()
	entries := []*berthv1.FileInfo{
		{DisplayPath: "/w/title\x1b]0;pwned\x07", Type: berthv1.FileType_FILE_TYPE_REGULAR, ModifiedAt: mtime},
		{DisplayPath: "/w/a\nfake-entry", Type: berthv1.FileType_FILE_TYPE_REGULAR, ModifiedAt: mtime},
		{DisplayPath: "/w/c1\u009b2J", Type: berthv1.FileType_FILE_TYPE_REGULAR, ModifiedAt: mtime},
		{DisplayPath: "/w/l", Type: berthv1.FileType_FILE_TYPE_SYMLINK, DisplaySymlinkTarget: "gpj.\u202eexe", ModifiedAt: mtime},
	}
	for _, long := range []bool{false, true} {
		var out bytes.Buffer
		writeListing(&out, "/w", entries, long)
		got := out.String()
		for _, bad := range []string{"\x1b", "\x07", "\u009b", "\u202e", "a\nfake"} {
			if strings.Contains(got, bad) {
				t.Errorf("listing (long %v) passes %q through:\n%q", long, bad, got)
			}
		}
		for _, want := range []string{`title\x1b]0;pwned\x07`, `a\x0afake-entry`, `c1\xc2\x9b2J`} {
			if !strings.Contains(got, want) {
				t.Errorf("listing (long %v) lacks %q:\n%q", long, want, got)
			}
		}
		if lines := strings.Count(got, "\n"); lines != len(entries) {
			t.Errorf("listing (long %v) has %d lines, want %d:\n%q", long, lines, len(entries), got)
		}
	}
}

// TestExitCodeControlCharacters prints a berthd error whose message holds
// a name from the sandbox with an escape sequence: stderr gets it escaped.
func TestExitCodeControlCharacters(t *testing.T) {
	err := &client.Error{Code: codes.NotFound, Reason: client.ReasonFileNotFound, Message: "lstat /w/x\x1b[2J\x1b[1;1H: no such file or directory",
		FieldViolations: []client.FieldViolation{{Field: "path", Description: "bad \x1b[31mred"}}}
	var stderr bytes.Buffer
	exitCode(fmt.Errorf("ls dev:/w: %w", err), &stderr)
	if got := stderr.String(); strings.Contains(got, "\x1b") || !strings.Contains(got, `/w/x\x1b[2J\x1b[1;1H`) || !strings.Contains(got, `bad \x1b[31mred`) {
		t.Errorf("stderr = %q, want the escape sequences escaped", got)
	}
}
