package agentconn

import (
	"context"
	"os"
	"path/filepath"

	"github.com/fsnotify/fsnotify"
)

// ResetBackoff makes the connection to the agent at socketPath, if any,
// reconnect now instead of after its backoff: call it when a new agent is
// known to be starting there (a restarted sandbox task).
func (p *Pool) ResetBackoff(socketPath string) {
	p.mu.Lock()
	cc, ok := p.conns[socketPath]
	p.mu.Unlock()
	if ok {
		cc.cc.ResetConnectBackoff()
	}
}

// ResetWhenListening calls ResetBackoff for socketPath as soon as the
// socket appears in its directory (fsnotify's Create: inotify(7)'s
// IN_CREATE when the agent binds it), or at once when it is there already, so that a new agent is
// reached as it starts listening rather than at the connection's next
// backoff step (10 ms, then 16, 26, 42, ... apart: up to half of a
// sandbox's start on a small host). It returns when ctx ends or the
// socket has appeared; where inotify cannot watch the directory (a
// gVisor sandbox's socket, made by its gofer, may never show there) the
// backoff alone reaches the agent, as before.
func (p *Pool) ResetWhenListening(ctx context.Context, socketPath string) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return
	}
	defer w.Close()
	if err := w.Add(filepath.Dir(socketPath)); err != nil {
		return
	}
	if _, err := os.Lstat(socketPath); err == nil {
		p.ResetBackoff(socketPath)
		return
	}
	for {
		select {
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			if ev.Name == socketPath && ev.Has(fsnotify.Create) {
				p.ResetBackoff(socketPath)
				return
			}
		case _, ok := <-w.Errors:
			if !ok {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}
