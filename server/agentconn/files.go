package agentconn

import agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"

// Files returns a FileService client for the agent listening on
// socketPath, on the same connection as Get's.
func (p *Pool) Files(socketPath string) (agentv1.FileServiceClient, error) {
	if _, err := p.Get(socketPath); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return agentv1.NewFileServiceClient(p.conns[socketPath]), nil
}
