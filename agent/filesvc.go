package agent

import "github.com/berth-sandbox/berth/agent/files"

// fileService returns the FileService served next to AgentService, acting
// as the workload user.
func (s *Server) fileService() *files.Service {
	cfg := s.cfg.Files
	cfg.UID, cfg.GID, cfg.Logger = s.cfg.UID, s.cfg.GID, s.log
	return files.New(cfg)
}
