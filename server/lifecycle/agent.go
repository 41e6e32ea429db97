package lifecycle

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/internal/procfs"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	"github.com/berth-sandbox/berth/server/agentconn"
	"github.com/berth-sandbox/berth/server/apierr"
)

// waitAgent waits until the agent of sandbox id answers Info, the task
// exits, or Config.AgentReadyTimeout passes.
func (m *Manager) waitAgent(ctx context.Context, id string) (*agentv1.InfoResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.AgentReadyTimeout)
	defer cancel()
	exited, err := m.rt.WaitExit(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("watch task of %s: %w", id, err)
	}
	agent, err := m.agents.Get(m.rt.SocketPath(id))
	if err != nil {
		return nil, err
	}
	type answer struct {
		info *agentv1.InfoResponse
		err  error
	}
	answered := make(chan answer, 1)
	infoCtx, cancelInfo := context.WithCancel(ctx)
	defer cancelInfo()
	go m.agents.ResetWhenListening(infoCtx, m.rt.SocketPath(id))
	go func() {
		info, err := agentconn.WaitReady(infoCtx, agent)
		answered <- answer{info, err}
	}()
	// WaitReady waits through failed connection attempts; one that failed
	// for want of berthd's own descriptors will not heal while it waits.
	began := time.Now()
	dialCheck := time.NewTicker(100 * time.Millisecond)
	defer dialCheck.Stop()
	for {
		select {
		case <-dialCheck.C:
			if err := m.reach.DialFailure(id, time.Since(began)); err != nil {
				cancelInfo()
				<-answered
				return nil, err
			}
			continue
		case a := <-answered:
			if a.err != nil {
				return nil, fmt.Errorf("%w: agent of sandbox %s did not answer within %v: %v%s", apierr.ErrUnreachable, id, m.cfg.AgentReadyTimeout, a.err, m.logTail(id))
			}
			m.reach.CheckSkew(id, a.info)
			return a.info, nil
		case st := <-exited:
			cancel()
			<-answered
			return nil, fmt.Errorf("%w: the task of sandbox %s exited with status %d before the agent answered%s", apierr.ErrUnreachable, id, st.ExitCode(), m.logTail(id))
		}
	}
}

// logTail returns the last lines of the agent's log as "; agent log: ...",
// or "" when there is none. The agent logs no env values or file contents.
func (m *Manager) logTail(id string) string {
	b := m.rt.LogTail(id, 1024)
	if len(b) == 0 {
		return ""
	}
	return "; agent log: " + strings.TrimSpace(string(b))
}

// trimAgentLogs bounds every sandbox's agent log to Config.MaxAgentLogBytes
// (runtime.TrimLog), every Config.AgentLogCheck, until ctx ends.
func (m *Manager) trimAgentLogs(ctx context.Context) {
	t := time.NewTicker(m.cfg.AgentLogCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ids, err := m.rt.HostDirs()
		if err != nil {
			m.log.Warn("list sandbox directories to bound agent logs", slog.Any("error", err))
			continue
		}
		for _, id := range ids {
			if _, err := m.rt.TrimLog(id, m.cfg.MaxAgentLogBytes); err != nil {
				m.log.Warn("bound agent log", slog.String("sandbox_id", id), slog.Any("error", err))
			}
		}
	}
}

// sandboxCreated records the runtime of a sandbox whose agent just answered
// for the first time: from then on berthd restarts its task when it dies.
func (m *Manager) sandboxCreated(id string, boot, version string) {
	m.restarts.created(id)
	sb, err := m.rt.Get(m.bgCtx, id)
	if err != nil || !sb.Running {
		return
	}
	rt := apierr.Runtime{BootID: boot, TaskPID: sb.TaskPID, AgentVersion: version}
	rt.StartedAt, _ = procfs.StartTime(sb.TaskPID)
	m.ids.Observe(id, rt)
}
