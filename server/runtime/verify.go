package runtime

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/agentproof"
)

// labelAgentSecret holds the hex secret given to the sandbox's agent
// (agentproof.EnvSecret). Reserved labels are never returned to callers.
const labelAgentSecret = LabelPrefix + "agent-secret"

// secrets caches sandboxes' agent secrets by id: they never change for a
// sandbox, and an Info call must not cost a containerd round trip.
type secrets struct {
	mu sync.Mutex
	m  map[string][]byte
}

func (s *secrets) get(id string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.m[id]
	return b, ok
}

func (s *secrets) set(id string, b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = make(map[string][]byte)
	}
	s.m[id] = b
}

func (s *secrets) drop(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, id)
}

// sandboxOfSocket returns the sandbox id whose agent socket is path.
func (r *Runtime) sandboxOfSocket(path string) (string, error) {
	id := filepath.Base(filepath.Dir(filepath.Dir(path)))
	if path != r.SocketPath(id) || strings.ContainsRune(id, '/') {
		return "", fmt.Errorf("%s is not a sandbox's agent socket", path)
	}
	return id, nil
}

// AgentVerifier checks, for berthd's agent connections
// (agentconn.Verifier), that a socket's listener is the sandbox's agent.
type AgentVerifier struct{ r *Runtime }

// AgentVerifier returns the verifier of r's sandboxes' agents.
func (r *Runtime) AgentVerifier() AgentVerifier { return AgentVerifier{r} }

// Peer checks that the listener is the sandbox's init process — its task's
// pid as containerd reports it — for runc sandboxes. Under gVisor every
// socket a sandbox creates is listened on by its gofer process on the
// host, so the pid tells nothing there; the agent's proof of its secret
// (Secret) decides alone.
func (v AgentVerifier) Peer(ctx context.Context, path string, cred *unix.Ucred) error {
	id, err := v.r.sandboxOfSocket(path)
	if err != nil {
		return err
	}
	container, err := v.r.client.LoadContainer(ctx, id)
	if err != nil {
		return v.r.containerError(id, err)
	}
	labels, err := container.Labels(ctx)
	if err != nil {
		return v.r.containerError(id, err)
	}
	if labels[labelRuntime] == RuntimeGVisor {
		return nil
	}
	task, err := container.Task(ctx, nil)
	if err != nil {
		return fmt.Errorf("load task %s: %w", id, err)
	}
	if pid := task.Pid(); cred.Pid != int32(pid) {
		return fmt.Errorf("the listener on sandbox %s's agent socket is host pid %d, not the sandbox's init (pid %d)", id, cred.Pid, pid)
	}
	return nil
}

// Secret returns the sandbox's agent secret, nil for a sandbox created
// without one.
func (v AgentVerifier) Secret(ctx context.Context, path string) ([]byte, error) {
	id, err := v.r.sandboxOfSocket(path)
	if err != nil {
		return nil, err
	}
	return v.r.agentSecret(ctx, id)
}

// agentSecret returns sandbox id's agent secret, nil for a sandbox created
// without one.
func (r *Runtime) agentSecret(ctx context.Context, id string) ([]byte, error) {
	if b, ok := r.secrets.get(id); ok {
		return b, nil
	}
	container, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return nil, r.containerError(id, err)
	}
	labels, err := container.Labels(ctx)
	if err != nil {
		return nil, r.containerError(id, err)
	}
	var secret []byte
	if h := labels[labelAgentSecret]; h != "" {
		if secret, err = agentproof.ParseSecret(h); err != nil {
			return nil, fmt.Errorf("sandbox %s: %w", id, err)
		}
	}
	r.secrets.set(id, secret)
	return secret, nil
}

// Refused drops what is cached about the sandbox of path.
func (v AgentVerifier) Refused(path string) {
	if id, err := v.r.sandboxOfSocket(path); err == nil {
		v.r.secrets.drop(id)
	}
}

// writeSecret puts the sandbox's hex secret in its run directory for the
// agent to read at start, owned by the sandbox's root (host id base) and
// readable by it alone.
func (r *Runtime) writeSecret(id, hexSecret string, base uint32) error {
	if err := writeRunFile(filepath.Join(r.hostDir(id), "run", agentproof.SecretFile), []byte(hexSecret), base); err != nil {
		return fmt.Errorf("write the agent secret: %w", err)
	}
	return nil
}

// writeRunFile writes data to a new file at path in a sandbox's run
// directory (replacing what is there, never through a symlink the
// workload put there), mode 0400, owned by the sandbox's root (host id
// base).
func writeRunFile(path string, data []byte, base uint32) error {
	os.Remove(path)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o400)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chown(int(base), int(base))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
