package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/agent/files"
	"github.com/berth-sandbox/berth/internal/agentproof"
	"github.com/berth-sandbox/berth/internal/quiesce"
	"github.com/berth-sandbox/berth/internal/wire"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
)

// agentServiceDesc is the AgentService the agent serves: all of it, but
// for a test build of an older agent (older_agent.go).
var agentServiceDesc = &agentv1.AgentService_ServiceDesc

var _ agentv1.AgentServiceServer = (*Server)(nil)

// streamWorkers is how many goroutines of the agent's gRPC server serve
// streams and stay for the next: more than the 10 Runs at once each
// sandbox of the concurrent benchmark gets. An idle worker keeps its grown
// stack until the garbage collector shrinks it, as any goroutine's.
const streamWorkers = 16

// grpcServer returns a gRPC server of AgentService and fileSvc. Serve
// makes one per listener: a stopped grpc.Server does not serve again.
func (s *Server) grpcServer(fileSvc *files.Service) *grpc.Server {
	// berthd may ping idle connections to detect a dead sandbox early.
	// Streams run on streamWorkers goroutines kept between streams (one
	// more for each stream beyond them): a goroutine per stream grew its
	// stack again through the handler's depth at every exec (issue 23).
	gs := grpc.NewServer(append(append(wire.ServerOptions(), s.cfg.ServerOptions...),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.NumStreamWorkers(streamWorkers))...)
	gs.RegisterService(agentServiceDesc, s)
	agentv1.RegisterFileServiceServer(gs, fileSvc)
	return gs
}

// Quiesce makes the serving loop close the listener and every connection
// (this one too, once answered) until berthd proves the restore (quiet):
// see package internal/quiesce. Only berthd can ask: the request proves
// the sandbox's secret, which no process of the workload knows.
func (s *Server) Quiesce(_ context.Context, req *agentv1.QuiesceRequest) (*agentv1.QuiesceResponse, error) {
	token := req.GetWakeToken()
	if len(token) != agentproof.TokenBytes {
		return nil, status.Errorf(codes.InvalidArgument, "wake_token: %d bytes, want %d", len(token), agentproof.TokenBytes)
	}
	secret := s.ident.Load().secret
	if len(secret) == 0 {
		return nil, status.Error(codes.FailedPrecondition, "this agent was given no secret: nothing proves that berthd asks it to quiesce")
	}
	if err := agentproof.VerifyAsk(agentproof.ProveQuiesce(secret, token), req.GetProof()); err != nil {
		s.log.Warn("a Quiesce that does not prove the sandbox's secret was refused (not berthd's)")
		return nil, status.Error(codes.PermissionDenied, "proof: does not prove the sandbox's secret")
	}
	if !s.relistens.Load() {
		return nil, status.Error(codes.FailedPrecondition, "this agent serves a listener it cannot make again (Serve, not ListenAndServe): it cannot quiesce")
	}
	select {
	case s.quiesces <- quiesceProofs{wake: agentproof.ProveWake(secret, token), quiet: agentproof.ProveQuiet(secret, token), secret: secret, token: token}:
	default:
		return nil, status.Error(codes.FailedPrecondition, "the agent is quiescing already")
	}
	return &agentv1.QuiesceResponse{}, nil
}

// quiesceProofs are what a Quiesce's token proves: wake, what berthd's
// quiesce.Wake must hold; quiet, what the agent writes into quiesce.Mark;
// with the secret and token they were made of, from which a fork wake is
// checked and a fork child's secret derived (forkWake).
type quiesceProofs struct{ wake, quiet, secret, token []byte }

// identity is what tells one agent from another: the secret its Info
// proves and its boot id.
type identity struct {
	secret []byte
	bootID string
}

// forkWake checks a Wake file's content against a fork wake
// (agentproof.ProveForkWake: the nonce, then the proof) and returns the
// identity of the fork's child this restored agent now is: the child's
// secret (agentproof.ForkSecret) and a new random boot id. ok is false for
// anything else.
func (p quiesceProofs) forkWake(content []byte) (_ identity, ok bool) {
	if len(content) != agentproof.ForkWakeBytes {
		return identity{}, false
	}
	nonce, proof := content[:agentproof.ForkNonceBytes], content[agentproof.ForkNonceBytes:]
	if agentproof.VerifyAsk(agentproof.ProveForkWake(p.secret, p.token, nonce), proof) != nil {
		return identity{}, false
	}
	id := make([]byte, 16)
	rand.Read(id) // never fails (crypto/rand)
	return identity{secret: agentproof.ForkSecret(p.secret, p.token, nonce), bootID: hex.EncodeToString(id)}, true
}

// quiet holds the agent with no socket open to the host — its listener
// at addr and its connections are closed already — until a quiesce.Wake
// file beside addr holds proofs.wake (berthd restored the sandbox's
// memory) or ctx ends; a Wake holding anything else is removed and
// ignored. A Wake holding a fork wake instead (forkWake: berthd restored
// this memory into a fork's child) makes the agent that child's: it serves
// on under the child's secret and a new boot id, with the same exec
// records and processes. It first writes proofs.quiet into quiesce.Mark beside addr
// (aside, then renamed: berthd never reads half of it), telling berthd
// that the sandbox may be checkpointed, and removes it before it listens
// again. It returns the new listener (nil when ctx ended) or why none
// could be made.
func (s *Server) quiet(ctx context.Context, proofs quiesceProofs, addr string, relisten func() (net.Listener, error)) (net.Listener, error) {
	dir := filepath.Dir(addr)
	mark, wakeFile := filepath.Join(dir, quiesce.Mark), filepath.Join(dir, quiesce.Wake)
	wake := proofs.wake
	// A Wake left from before proves nothing now (the token is new).
	os.Remove(wakeFile)
	if err := writeMark(mark, proofs.quiet); err != nil {
		// berthd waits for the mark in vain and keeps no memory.
		s.log.Error("quiesced, but the mark for berthd cannot be made", "path", mark, "err", err)
	}
	s.log.Info("berth-agent quiesced for a checkpoint: listener and connections closed", "mark", mark)
	tick := time.NewTicker(quiesce.WakePoll)
	defer tick.Stop()
	for woken := false; !woken; {
		select {
		case <-ctx.Done():
			os.Remove(mark)
			return nil, nil
		case <-tick.C:
		}
		proof, err := quiesce.ReadProof(wakeFile)
		switch {
		case errors.Is(err, os.ErrNotExist):
			continue
		case err == nil && agentproof.VerifyAsk(wake, proof) == nil:
			woken = true
		case err == nil && len(proof) == agentproof.ForkWakeBytes:
			child, ok := proofs.forkWake(proof)
			if !ok {
				s.log.Warn("a fork wake file that does not prove berthd's restore was removed", "path", wakeFile)
				break
			}
			woken = true
			s.log.Info("berth-agent restored into a fork's child: serving under the child's secret and a new boot id", "parent_boot_id", s.ident.Load().bootID, "boot_id", child.bootID)
			s.ident.Store(&child)
		default:
			s.log.Warn("a wake file that does not prove berthd's restore was removed", "path", wakeFile, "err", err)
		}
		if err := os.Remove(wakeFile); err != nil && !os.IsNotExist(err) {
			s.log.Warn("remove the wake file", "path", wakeFile, "err", err)
		}
	}
	if err := os.Remove(mark); err != nil && !os.IsNotExist(err) {
		s.log.Warn("remove the quiesce mark", "path", mark, "err", err)
	}
	l, err := relisten()
	if err != nil {
		return nil, fmt.Errorf("listen again after a checkpoint: %w", err)
	}
	s.log.Info("berth-agent serving again after a checkpoint", "addr", l.Addr().String(), "boot_id", s.ident.Load().bootID)
	return l, nil
}

// writeMark writes proof into the quiesce mark at path: into a file
// beside it made anew (O_EXCL, never following a symlink the workload put
// there), then renamed over path.
func writeMark(path string, proof []byte) error {
	tmp := path + ".agent"
	os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(proof)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}
