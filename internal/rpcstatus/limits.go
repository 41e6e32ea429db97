package rpcstatus

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
)

// Reason tokens of a sandbox's own limits: RESOURCE_EXHAUSTED, a capacity
// fact of the sandbox rather than a fault of berth. Nothing was started or
// done; the same request may work once something in the sandbox ends. Each
// error carrying one names the limit in ErrorInfo metadata "limit" and,
// when a call failed, its errno in "errno".
const (
	// ReasonPidsLimit: a fork failed with EAGAIN: the sandbox's pids limit
	// (resources.pids_limit) is reached.
	ReasonPidsLimit = "PIDS_LIMIT_REACHED"
	// ReasonMemoryLimit: the agent could not allocate (ENOMEM), or the
	// kernel's OOM killer killed the launcher starting a process (no
	// errno; package agent's startProcess): the sandbox's memory limit is
	// reached.
	ReasonMemoryLimit = "MEMORY_LIMIT_REACHED"
	// ReasonDescriptorLimit: the agent could not open a file descriptor
	// (EMFILE, ENFILE): its open-file limit is reached, as by many execs
	// with open pipes at once.
	ReasonDescriptorLimit = "DESCRIPTOR_LIMIT_REACHED"
)

// SandboxLimit returns a RESOURCE_EXHAUSTED status for err when it is one
// of the errnos of a sandbox's limits (EAGAIN from fork or clone, ENOMEM,
// EMFILE, ENFILE), with the message "<what>: <err> (<the limit>)", and nil
// otherwise. meta is copied and may be nil.
func SandboxLimit(what string, err error, meta map[string]string) error {
	var errno unix.Errno
	if !errors.As(err, &errno) {
		return nil
	}
	var reason, limit, why string
	switch errno {
	case unix.EAGAIN:
		reason, limit, why = ReasonPidsLimit, "pids", "the sandbox's pids limit is reached"
	case unix.ENOMEM:
		reason, limit, why = ReasonMemoryLimit, "memory", "the sandbox's memory limit is reached"
	case unix.EMFILE, unix.ENFILE:
		reason, limit, why = ReasonDescriptorLimit, "descriptors", "the agent's open-file limit is reached"
	default:
		return nil
	}
	m := make(map[string]string, len(meta)+2)
	for k, v := range meta {
		m[k] = v
	}
	m["limit"], m["errno"] = limit, unix.ErrnoName(errno)
	return Error(codes.ResourceExhausted, reason, fmt.Sprintf("%s: %v (%s)", what, err, why), m)
}
