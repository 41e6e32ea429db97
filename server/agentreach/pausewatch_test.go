package agentreach

import "testing"

// TestPauseWatch: a watcher's channel is closed by the next change of the
// sandbox's state, and a forgotten sandbox keeps no channel.
func TestPauseWatch(t *testing.T) {
	var p pauses
	paused, ch := p.watch("s1")
	if paused {
		t.Fatal("a sandbox never paused reads as paused")
	}
	select {
	case <-ch:
		t.Fatal("channel closed before any change")
	default:
	}
	p.set("s1", true)
	select {
	case <-ch:
	default:
		t.Fatal("pausing did not wake the watcher")
	}
	paused, ch = p.watch("s1")
	if !paused {
		t.Fatal("a paused sandbox reads as running")
	}
	p.set("s1", false)
	select {
	case <-ch:
	default:
		t.Fatal("resuming did not wake the watcher")
	}
	if len(p.changed) != 0 {
		t.Errorf("%d channels kept after the last change", len(p.changed))
	}
}
