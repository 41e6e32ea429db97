package cluster

import (
	"fmt"
	"os"
	"strings"

	"github.com/berth-sandbox/berth/internal/procfs"
)

// Holder names the berthd process that holds a node's registration, so
// that a berthd finding its node id registered under a live lease can
// tell an earlier process of the same node that died (its lease lives on
// for the lease time: revoke it) from another berthd that runs under
// the same id (refuse to start: NodeIDInUseError).
type Holder struct {
	// Host identifies the host: its machine id (/etc/machine-id, else
	// /var/lib/dbus/machine-id; machine-id(5)), or its host name when it
	// has none.
	Host string `json:"host"`
	// HostName is the host's name (for people).
	HostName string `json:"host_name,omitempty"`
	// StateDir is the berthd's state directory.
	StateDir string `json:"state_dir"`
	// Process is the berthd process, "<pid>:<start time>"
	// (procfs.ProcessID).
	Process string `json:"process"`
}

// ThisHolder returns this process as the Holder of a registration, with
// its state directory stateDir.
func ThisHolder(stateDir string) Holder {
	name, _ := os.Hostname()
	host := name
	for _, f := range []string{"/etc/machine-id", "/var/lib/dbus/machine-id"} {
		if b, err := os.ReadFile(f); err == nil && strings.TrimSpace(string(b)) != "" {
			host = strings.TrimSpace(string(b))
			break
		}
	}
	return Holder{Host: host, HostName: name, StateDir: stateDir, Process: procfs.ProcessID(os.Getpid())}
}

// String describes h for an error or a log line.
func (h Holder) String() string {
	return fmt.Sprintf("berthd process %s with state directory %s on host %s (machine id %s)", h.Process, h.StateDir, h.HostName, h.Host)
}

// earlierSelf reports whether other — the holder of a live registration of
// this node's id — is an earlier process of the node h is (same host, same
// state directory) that no longer runs, or h itself: then its lease is
// revoked (deadSelf). Anything else is another berthd under the same id. A record
// without a holder (a berthd before it was recorded) counts as an earlier
// self, as it did before.
func (h Holder) earlierSelf(other Holder) bool {
	if other == (Holder{}) || other.Process == h.Process && other.Host == h.Host {
		return true
	}
	return other.Host == h.Host && other.StateDir == h.StateDir && !procfs.Running(other.Process)
}

// deadSelf reports whether other, the holder of a live registration of
// this node's id, is an earlier process of this node (same host, same
// state directory) that no longer runs: its lease serves no one and is
// revoked rather than waited for. A record without a holder is not (the
// berthd that wrote it may still run), nor one of this process (its
// lease ends on its own).
func (h Holder) deadSelf(other Holder) bool {
	return other != (Holder{}) && other.Process != h.Process && h.earlierSelf(other)
}

// NodeIDInUseError is a berthd's refusal to register: another berthd, Holder,
// holds a live registration of the node id, at Address.
type NodeIDInUseError struct {
	NodeID  string
	Address string
	Holder  Holder
}

func (e *NodeIDInUseError) Error() string {
	return fmt.Sprintf("node id %s is registered in the fleet by another live berthd: %s, at %s; "+
		"two berthds under one id would take each other's sandboxes for their own: give this berthd its own --node-id, "+
		"or stop that berthd first", e.NodeID, e.Holder, e.Address)
}
