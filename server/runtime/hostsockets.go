package runtime

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	procinfo "github.com/prometheus/procfs"
)

// hostSockets returns the paths of the unix sockets bound on the host
// that the sentry of gVisor sandbox id (host pid sentry) holds: under
// runsc --host-uds=all a socket the workload binds on a file system of
// the gofer's is bound on the host by the gofer (in its own network
// namespace) and handed to the sentry, and runsc cannot checkpoint such
// an endpoint ("Cannot save endpoint with bound host socket") — and this
// runsc ends the sandbox when a checkpoint fails. They are the rows with a
// path of unix(7)'s table in the gofer's network namespace
// (/proc/<gofer>/net/unix) whose socket the sentry holds open
// (/proc/<sentry>/fd). The paths are as the gofer sees them: the
// sandbox's own. The gofer is the runsc-gofer process whose --bundle is
// the task's bundle directory (named by the sandbox's id). Errors: /proc's;
// no gofer found.
func hostSockets(id string, sentry uint32) ([]string, error) {
	procs, err := procinfo.AllProcs()
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	gofer := -1
	for _, p := range procs {
		if cmd, err := p.CmdLine(); err == nil && goferOf(cmd, id) {
			gofer = p.PID
			break
		}
	}
	if gofer < 0 {
		return nil, fmt.Errorf("no runsc gofer of sandbox %s runs", id)
	}
	sp, err := procinfo.NewProc(int(sentry))
	if err != nil {
		return nil, fmt.Errorf("sentry of sandbox %s: %w", id, err)
	}
	targets, err := sp.FileDescriptorTargets()
	if err != nil {
		return nil, fmt.Errorf("descriptors of the sentry of sandbox %s: %w", id, err)
	}
	held := map[uint64]bool{}
	for _, t := range targets {
		if n, ok := strings.CutPrefix(t, "socket:["); ok {
			if inode, err := strconv.ParseUint(strings.TrimSuffix(n, "]"), 10, 64); err == nil {
				held[inode] = true
			}
		}
	}
	fs, err := procinfo.NewFS(filepath.Join("/proc", strconv.Itoa(gofer)))
	if err != nil {
		return nil, fmt.Errorf("gofer of sandbox %s: %w", id, err)
	}
	table, err := fs.NetUNIX()
	if err != nil {
		return nil, fmt.Errorf("unix sockets of the gofer of sandbox %s: %w", id, err)
	}
	var paths []string
	for _, row := range table.Rows {
		if row.Path != "" && !strings.HasPrefix(row.Path, "@") && held[row.Inode] {
			paths = append(paths, row.Path)
		}
	}
	return paths, nil
}

// goferOf reports whether cmd, a process's command line, is runsc's gofer
// of the task of sandbox id: runsc-gofer, its --bundle naming the
// directory of the task (containerd's runc shim names it by the id).
func goferOf(cmd []string, id string) bool {
	if len(cmd) == 0 || filepath.Base(cmd[0]) != "runsc-gofer" {
		return false
	}
	for i, arg := range cmd {
		bundle, ok := strings.CutPrefix(arg, "--bundle=")
		if !ok && arg == "--bundle" && i+1 < len(cmd) {
			bundle, ok = cmd[i+1], true
		}
		if ok && filepath.Base(bundle) == id {
			return true
		}
	}
	return false
}
