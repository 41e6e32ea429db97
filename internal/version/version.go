// Package version is berth's release version, shared by berthd, berth-agent
// and the berth CLI so that one build reports one version everywhere (a
// berthd and an agent of different versions report version skew).
package version

import "runtime/debug"

// Version is set at build time:
//
//	go build -ldflags "-X github.com/berth-sandbox/berth/internal/version.Version=v0.3.0"
//
// (the Makefile passes `git describe --tags --always --dirty`; the
// Dockerfile its VERSION build argument). Use Get, which falls back to what
// Go recorded.
var Version = ""

// Get returns Version when set; else the main module's version that Go
// recorded in the binary (a tagged module version when built with go
// install, or a pseudo-version from VCS data when built with -buildvcs);
// else "dev".
func Get() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			return v
		}
	}
	return "dev"
}
