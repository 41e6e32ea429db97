package agentconn

import (
	"fmt"

	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
)

// Files returns a FileService client for the agent listening on
// socketPath, on the same connection as Get's.
func (p *Pool) Files(socketPath string) (agentv1.FileServiceClient, error) {
	if _, err := p.Get(socketPath); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.conns[socketPath]
	if !ok {
		// Forgotten between the two locks: the sandbox is being deleted.
		return nil, fmt.Errorf("connection to agent %s closed", socketPath)
	}
	return agentv1.NewFileServiceClient(c.cc), nil
}
