package agentconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"

	"github.com/berth-sandbox/berth/internal/agentproof"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
)

// ErrUnverified is wrapped by the error of a dial or an Info call whose
// other end is not the sandbox's agent: the listener is not the sandbox's
// init process, or it did not prove the sandbox's secret.
var ErrUnverified = errors.New("not the sandbox's agent")

// Verifier says what the agent behind a socket must prove. berthd gives it
// from the sandbox's record in containerd.
type Verifier interface {
	// Peer checks the credentials (SO_PEERCRED: the pid, uid and gid of
	// the process that called listen(2)) of the listener at socketPath
	// when a connection is made. An error refuses the connection.
	Peer(ctx context.Context, socketPath string, cred *unix.Ucred) error
	// Secret returns the secret the sandbox's agent proves in Info; nil
	// when it has none (a sandbox created before agents had secrets).
	Secret(ctx context.Context, socketPath string) ([]byte, error)
	// Refused is told when a listener failed a check, so that cached
	// facts about the sandbox are looked up anew next time.
	Refused(socketPath string)
}

// refusals remembers the last verification failure per socket path, so
// that a request that timed out waiting for a connection gRPC kept
// refusing can say why.
type refusals struct {
	mu   sync.Mutex
	last map[string]error
}

func (r *refusals) set(path string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		delete(r.last, path)
		return
	}
	r.last[path] = err
}

func (r *refusals) get(path string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last[path]
}

// Refusal returns why the last connection or Info answer at socketPath
// was refused (wrapping ErrUnverified), or nil when the last one passed.
func (p *Pool) Refusal(socketPath string) error { return p.refused.get(socketPath) }

// peerCred returns the SO_PEERCRED credentials of a unix connection.
func peerCred(conn net.Conn) (*unix.Ucred, error) {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return nil, fmt.Errorf("not a unix connection: %T", conn)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, credErr
}

// verifyPeer checks the listener of a new connection to path with the
// Verifier; a refusal wraps ErrUnverified and is kept for Refusal.
func (p *Pool) verifyPeer(ctx context.Context, path string, conn net.Conn) error {
	if p.verifier == nil {
		return nil
	}
	cred, err := peerCred(conn)
	if err == nil {
		err = p.verifier.Peer(ctx, path, cred)
	}
	if err != nil {
		err = fmt.Errorf("%w: %v", ErrUnverified, err)
		p.refused.set(path, err)
		p.verifier.Refused(path)
	}
	return err
}

// proveInfo is the unary interceptor of an agent connection: every Info
// call carries a fresh challenge, and an answer without the proof of the
// sandbox's secret fails with ErrUnverified and drops the connection. An
// answer that proved it is remembered for its connection (Proven).
func (p *Pool) proveInfo(path string) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if _, ok := req.(*agentv1.InfoRequest); !ok {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		if p.verifier == nil {
			was, dials := p.current(path)
			err := invoker(ctx, method, req, reply, cc, opts...)
			if err == nil {
				p.noteProof(path, was, dials, reply.(*agentv1.InfoResponse).GetBootId())
			}
			return err
		}
		secret, err := p.verifier.Secret(ctx, path)
		if err != nil {
			return fmt.Errorf("look up the agent secret: %w", err)
		}
		was, dials := p.current(path)
		if secret == nil {
			err := invoker(ctx, method, req, reply, cc, opts...)
			if err == nil {
				p.refused.set(path, nil)
				p.noteProof(path, was, dials, reply.(*agentv1.InfoResponse).GetBootId())
			}
			return err
		}
		challenge := agentproof.NewChallenge()
		if err := invoker(ctx, method, &agentv1.InfoRequest{Challenge: challenge}, reply, cc, opts...); err != nil {
			return err
		}
		if err := agentproof.Verify(secret, challenge, reply.(*agentv1.InfoResponse).GetProof()); err != nil {
			err = fmt.Errorf("%w: the listener on its socket answered without proving the sandbox's secret", ErrUnverified)
			p.refused.set(path, err)
			p.verifier.Refused(path)
			// The connection is the impostor's: the next request dials
			// anew (the real agent may be back by then).
			go p.Forget(path)
			return err
		}
		p.refused.set(path, nil)
		p.noteProof(path, was, dials, reply.(*agentv1.InfoResponse).GetBootId())
		return nil
	}
}
