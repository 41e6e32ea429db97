package agent

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/berth-sandbox/berth/agent/files"
	"github.com/berth-sandbox/berth/internal/quiesce"
	"github.com/berth-sandbox/berth/internal/wire"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
)

// The signals of Config.Quiesce (package internal/quiesce).
const (
	quiesceClose  = quiesce.Close
	quiesceListen = quiesce.Listen
)

// agentServiceDesc is the AgentService the agent serves: all of it, but
// for a test build of an older agent (older_agent.go).
var agentServiceDesc = &agentv1.AgentService_ServiceDesc

var _ agentv1.AgentServiceServer = (*Server)(nil)

// grpcServer returns a gRPC server of AgentService and fileSvc. Serve
// makes one per listener: a stopped grpc.Server does not serve again.
func (s *Server) grpcServer(fileSvc *files.Service) *grpc.Server {
	// berthd may ping idle connections to detect a dead sandbox early.
	gs := grpc.NewServer(append(append(wire.ServerOptions(), s.cfg.ServerOptions...), grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}))...)
	gs.RegisterService(agentServiceDesc, s)
	agentv1.RegisterFileServiceServer(gs, fileSvc)
	return gs
}

// quiet holds the agent with no socket open to the host — its listener
// at addr and its connections are closed already — until quiesce brings
// quiesceListen (berthd restored the sandbox's memory) or ctx ends. It
// first creates quiesce.Mark beside addr, telling berthd that the
// sandbox may be checkpointed, and removes it before it listens again.
// It returns the new listener (nil when ctx ended) or why none could be
// made.
func (s *Server) quiet(ctx context.Context, signals <-chan os.Signal, addr string, relisten func() (net.Listener, error)) (net.Listener, error) {
	mark := filepath.Join(filepath.Dir(addr), quiesce.Mark)
	if f, err := os.OpenFile(mark, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600); err != nil {
		// berthd waits for the mark in vain and keeps no memory.
		s.log.Error("quiesced, but the mark for berthd cannot be made", "path", mark, "err", err)
	} else {
		f.Close()
	}
	s.log.Info("berth-agent quiesced for a checkpoint: listener and connections closed", "mark", mark)
	for {
		select {
		case <-ctx.Done():
			os.Remove(mark)
			return nil, nil
		case sig := <-signals:
			if sig != quiesceListen {
				continue
			}
		}
		break
	}
	if err := os.Remove(mark); err != nil && !os.IsNotExist(err) {
		s.log.Warn("remove the quiesce mark", "path", mark, "err", err)
	}
	l, err := relisten()
	if err != nil {
		return nil, fmt.Errorf("listen again after a checkpoint: %w", err)
	}
	s.log.Info("berth-agent serving again after a checkpoint", "addr", l.Addr().String(), "boot_id", s.bootID)
	return l, nil
}
