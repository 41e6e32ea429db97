// Command mkimage packs a root filesystem directory into an OCI image archive
// that containerd can import (ctr images import, berth image import). It is a
// development tool used by scripts/base-image.sh:
//
//	go run ./internal/cmd/mkimage --rootfs build/rootfs --ref berth.dev/base:latest --out build/base.oci.tar
//
// Every entry is owned by 0:0 in the image unless a --chown PATH=UID:GID
// flag names it.
//
// The archive is written to a temporary file next to --out and renamed into
// place, so an interrupted run never leaves a truncated archive behind. On
// success it prints the archive path, the reference and the manifest digest.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/berth-sandbox/berth/internal/ociarchive"
)

func main() {
	rootfs := flag.String("rootfs", "", "root filesystem directory to pack (required)")
	ref := flag.String("ref", "", `image reference, e.g. "berth.dev/base:latest" (required)`)
	out := flag.String("out", "", "archive file to write (required)")
	cmd := flag.String("cmd", "", `default command, space separated, e.g. "/bin/sh" (optional)`)
	owners := map[string]ociarchive.Owner{}
	flag.Func("chown", "set the owner `PATH=UID:GID` of one entry, PATH relative to the rootfs (repeatable; others are 0:0)", func(v string) error {
		path, ids, ok := strings.Cut(v, "=")
		var o ociarchive.Owner
		if !ok {
			return fmt.Errorf("want PATH=UID:GID, got %q", v)
		}
		if _, err := fmt.Sscanf(ids, "%d:%d", &o.UID, &o.GID); err != nil {
			return fmt.Errorf("want PATH=UID:GID, got %q", v)
		}
		owners[path] = o
		return nil
	})
	flag.Parse()
	if *rootfs == "" || *ref == "" || *out == "" || flag.NArg() != 0 {
		flag.Usage()
		os.Exit(2)
	}
	opts := ociarchive.Options{Ref: *ref, Cmd: strings.Fields(*cmd), Owners: owners}
	if err := run(*rootfs, *out, opts); err != nil {
		fmt.Fprintf(os.Stderr, "mkimage: %v\n", err)
		os.Exit(1)
	}
}

func run(rootfs, out string, opts ociarchive.Options) error {
	f, err := os.CreateTemp(filepath.Dir(out), filepath.Base(out)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // fails harmlessly after the rename
	desc, err := ociarchive.Write(f, rootfs, opts)
	if err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), out); err != nil {
		return err
	}
	fmt.Printf("%s %s %s\n", out, opts.Ref, desc.Digest)
	return nil
}
