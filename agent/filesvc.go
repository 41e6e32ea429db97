package agent

import (
	"net"
	"path/filepath"

	"github.com/berth-sandbox/berth/agent/files"
)

// fileService returns the FileService served next to AgentService, acting
// as the workload user. The directory of the agent's socket (addr, when
// it is a unix socket's) is the agent's own: file calls do not touch it.
func (s *Server) fileService(addr net.Addr) *files.Service {
	cfg := s.cfg.Files
	cfg.UID, cfg.GID, cfg.Logger = s.cfg.UID, s.cfg.GID, s.log
	if ua, ok := addr.(*net.UnixAddr); ok && filepath.IsAbs(ua.Name) {
		cfg.AgentDir = filepath.Dir(ua.Name)
	}
	return files.New(cfg)
}
