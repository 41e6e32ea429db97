// Package quiesce is what berthd and berth-agent agree on for a memory
// checkpoint of a gVisor sandbox (HibernateSandbox). gVisor's runsc cannot
// save a socket backed by a host socket ("Cannot save endpoint with bound
// host socket"), and the agent's listener in the sandbox's run directory is
// one (runsc --host-uds=all), as is every connection berthd made to it. So
// berthd asks the agent to close them first and to listen again after the
// restore:
//
//  1. berthd calls the agent's Quiesce with a fresh random wake token and
//     its proof of the sandbox's secret (agentproof.ProveQuiesce); the
//     agent answers, stops serving — it closes its listener (removing the
//     socket file) and every connection — and then writes Mark in its
//     socket's directory (mode 0600): agentproof.ProveQuiet of the token,
//     the agent's word that it is quiet;
//  2. berthd waits (bounded) for a Mark that holds that proof, then
//     checkpoints the task;
//  3. after the restore berthd writes agentproof.ProveWake of the token
//     into Wake in that directory; the agent, which looks for it every
//     WakePoll while quiet, removes Mark and Wake, listens on its socket
//     path again and serves as before: the same boot id, the same exec
//     records, the processes it supervised.
//
// A fork with memory (ForkSandbox under gVisor) restores one checkpoint
// into each child as well: there berthd writes into the child's Wake a
// random nonce followed by agentproof.ProveForkWake of the token and that
// nonce, and the restored agent, once it checked the proof, serves as the
// child: under agentproof.ForkSecret of the secret, the token and the
// nonce (each child its own, which berthd derives alike) and a new boot
// id, with the parent's exec records and processes.
//
// Nothing in the sandbox can take part: the workload can reach the agent's
// socket and write the run directory, but knows neither the secret nor the
// token, so it can neither quiesce the agent, nor pass itself off as a
// quiet agent, nor wake a quiet one. A Wake that proves nothing is removed
// and ignored; so is a Mark (before, any file there was taken for the
// agent's word, and berthd checkpointed an agent that still had its host
// sockets open, or was not asked at all). (Before, berthd sent
// the agent SIGUSR1 and SIGUSR2, which any process of the sandbox could
// send its PID 1 too: the agent ignores both now.) An agent that knows
// nothing of Quiesce answers UNIMPLEMENTED, and berthd hibernates the
// sandbox without its memory.
package quiesce

import (
	"fmt"
	"io"
	"os"
	"syscall"
	"time"
)

const (
	// Mark is the file the agent writes in its socket's directory once
	// nothing of it is connected to the host: agentproof.ProveQuiet of
	// the wake token, raw bytes.
	Mark = "agent.quiet"
	// Wake is the file berthd writes in the agent's socket's directory
	// after the restore: agentproof.ProveWake of the token, raw bytes
	// (32), or in a fork's child the nonce and agentproof.ProveForkWake
	// (agentproof.ForkWakeBytes).
	Wake = "agent.wake"
	// WakePoll is how often a quiet agent looks for Wake: a restored
	// sandbox answers this much later at most.
	WakePoll = 10 * time.Millisecond
)

// maxProofBytes bounds what ReadProof reads: a proof is 32 bytes.
const maxProofBytes = 64

// ReadProof returns the content of the Mark or Wake file at path, at most
// maxProofBytes, without following a symlink there or blocking on a FIFO
// (the workload can write the directory): an error for anything but a
// regular file.
func ReadProof(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file (%v)", err)
	}
	return io.ReadAll(io.LimitReader(f, maxProofBytes))
}
