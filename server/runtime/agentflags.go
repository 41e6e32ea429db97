package runtime

import "fmt"

// AgentEventOverhead is what the agent charges one output event against
// its ring on top of the event's data, in bytes (agent.EventOverhead;
// TestAgentEventOverhead keeps the two equal). The agent refuses to start
// with a ring of this size or less, so no sandbox could be created.
const AgentEventOverhead = 160

// checkAgentFlags refuses agent settings every new sandbox's agent would
// refuse: a Config with them would make every CreateSandbox fail late,
// as UNAVAILABLE with the agent's log, instead of berthd at start.
func (c *Config) checkAgentFlags() error {
	if c.ExecRingBytes != 0 && c.ExecRingBytes <= AgentEventOverhead {
		return fmt.Errorf("exec ring bytes %d must be more than %d, what the agent charges one output event (berth-agent --ring-bytes)", c.ExecRingBytes, AgentEventOverhead)
	}
	return nil
}
