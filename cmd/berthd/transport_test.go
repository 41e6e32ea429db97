package main

import (
	"testing"
	"time"

	"github.com/berth-sandbox/berth/server"
)

func TestTransportFlagsCheck(t *testing.T) {
	ok := func() transportFlags {
		return transportFlags{headerBytes: 16 << 10, streams: 1024, maxConns: 2048, maxPerPeer: 256,
			cfg: server.TransportConfig{HandshakeTimeout: 10 * time.Second, MaxConnectionIdle: 2 * time.Minute, StreamStall: time.Minute, MaxRawStreamsPerPrincipal: 16}}
	}
	for _, c := range []struct {
		name   string
		change func(*transportFlags)
		valid  bool
	}{
		{"defaults", func(*transportFlags) {}, true},
		{"no caps", func(f *transportFlags) { f.maxConns, f.maxPerPeer = 0, 0 }, true},
		{"header list under 1 KiB", func(f *transportFlags) { f.headerBytes = 512 }, false},
		{"header list over 16 MiB", func(f *transportFlags) { f.headerBytes = 16<<20 + 1 }, false},
		{"no streams", func(f *transportFlags) { f.streams = 0 }, false},
		{"zero handshake timeout", func(f *transportFlags) { f.cfg.HandshakeTimeout = 0 }, false},
		{"negative idle", func(f *transportFlags) { f.cfg.MaxConnectionIdle = -time.Second }, false},
		{"negative connections", func(f *transportFlags) { f.maxConns = -1 }, false},
		{"negative per peer", func(f *transportFlags) { f.maxPerPeer = -1 }, false},
		{"zero stream stall", func(f *transportFlags) { f.cfg.StreamStall = 0 }, false},
		{"no raw streams", func(f *transportFlags) { f.cfg.MaxRawStreamsPerPrincipal = 0 }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := ok()
			c.change(&f)
			err := f.check()
			if (err == nil) != c.valid {
				t.Errorf("check() = %v, want valid %v", err, c.valid)
			}
			if err == nil && (f.cfg.MaxHeaderListBytes != uint32(f.headerBytes) || f.cfg.MaxConcurrentStreams != uint32(f.streams)) {
				t.Errorf("check() filled cfg %+v from %d and %d", f.cfg, f.headerBytes, f.streams)
			}
		})
	}
}
