// Package quiesce is what berthd and berth-agent agree on for a memory
// checkpoint of a gVisor sandbox (HibernateSandbox). gVisor's runsc cannot
// save a socket backed by a host socket ("Cannot save endpoint with bound
// host socket"), and the agent's listener in the sandbox's run directory is
// one (runsc --host-uds=all), as is every connection berthd made to it. So
// berthd asks the agent to close them first and to listen again after the
// restore, by signals sent to the task's PID 1 (the agent):
//
//  1. berthd sends Close; the agent stops serving — it closes its listener
//     (removing the socket file) and every connection — and then creates
//     Mark in its socket's directory (mode 0600, empty);
//  2. berthd waits for Mark (bounded), then checkpoints the task;
//  3. after the restore berthd sends Listen; the agent removes Mark,
//     listens on its socket path again and serves as before: the same boot
//     id, the same exec records, the processes it supervised.
//
// An agent that knows nothing of this ignores both signals (a Go PID 1
// that did not ask for them is not ended by them), Mark never appears, and
// berthd hibernates the sandbox without its memory.
package quiesce

import "golang.org/x/sys/unix"

const (
	// Close asks the agent to close its listener and connections.
	Close = unix.SIGUSR1
	// Listen asks an agent that closed them to listen again.
	Listen = unix.SIGUSR2
	// Mark is the file the agent creates in its socket's directory once
	// nothing of it is connected to the host.
	Mark = "agent.quiet"
)
