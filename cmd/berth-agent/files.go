package main

import (
	"flag"

	"github.com/berth-sandbox/berth/agent/files"
)

// registerFileFlags adds the file service's caps to fs.
func registerFileFlags(fs *flag.FlagSet, cfg *files.Config) {
	d := files.DefaultConfig()
	*cfg = d
	fs.Uint64Var(&cfg.MaxReadBytes, "max-read-bytes", d.MaxReadBytes, "largest ReadFile in `bytes`; larger reads are refused (FILE_TOO_LARGE) before any byte moves")
	fs.Uint64Var(&cfg.MaxWriteBytes, "max-write-bytes", d.MaxWriteBytes, "largest WriteFile content in `bytes` (FILE_TOO_LARGE)")
	fs.Uint64Var(&cfg.MaxArchiveBytes, "max-archive-bytes", d.MaxArchiveBytes, "largest file content in `bytes` one Upload extracts or one Download archives (FILE_TOO_LARGE)")
	fs.Uint64Var(&cfg.DiskBytes, "disk-bytes", 0, "the sandbox's disk quota in `bytes` (berthd gives it): a WriteFile or Upload whose file bytes exceed it is refused (NO_SPACE) up front or as they do; 0: none")
	fs.IntVar(&cfg.MaxListEntries, "max-list-entries", d.MaxListEntries, "most entries of one ListDir, Download or Upload (LIST_TOO_LARGE)")
}
