// Package procfs reads what berthd needs of a host process from /proc
// (proc(5)).
package procfs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// StartTimeField is the field of Stat holding the process's start time, in
// clock ticks since boot (proc(5): starttime).
const StartTimeField = 22

// Stat returns the fields of /proc/<pid>/stat numbered as proc(5) numbers
// them (fields[1] is the pid; fields[2], the command name, is left empty),
// so that fields[StartTimeField] is the start time. It fails for pid 0, a
// process that is gone, and a line too short.
func Stat(pid uint32) ([]string, error) {
	if pid == 0 {
		return nil, errors.New("no pid")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	// The command name, field 2, is in parentheses and may hold spaces and
	// parentheses itself: fields are counted after its last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	fields := append([]string{"", strconv.FormatUint(uint64(pid), 10), ""}, strings.Fields(string(b[i+1:]))...)
	if len(fields) <= StartTimeField {
		return nil, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(fields)-1)
	}
	return fields, nil
}
