package agentconn

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
