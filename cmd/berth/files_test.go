package main

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/types/known/timestamppb"

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
