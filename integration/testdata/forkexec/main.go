// Command forkexec is the anchor of the exec round trip inside a sandbox:
// run there, it forks, execs and waits for a program n times with nothing
// of berth, containerd or the runtime's shim between, and prints the wall
// time of each start-to-reaped in nanoseconds, one line each.
//
//	forkexec N PROGRAM [ARG...]
//
// The start is syscall.ForkExec (clone with CLONE_VFORK|CLONE_VM, execve)
// with the caller's descriptors 0, 1 and 2, the end wait4(2) of that pid:
// what a shell or posix_spawn(3) does for one command. PROGRAM is looked up
// in PATH once, before the first start. It exits 1 when a start fails or
// the program does not exit 0.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: forkexec N PROGRAM [ARG...]")
		os.Exit(2)
	}
	n, err := strconv.Atoi(os.Args[1])
	if err != nil || n < 1 {
		fmt.Fprintf(os.Stderr, "forkexec: bad count %q\n", os.Args[1])
		os.Exit(2)
	}
	prog, err := exec.LookPath(os.Args[2])
	if err != nil {
		fmt.Fprintf(os.Stderr, "forkexec: %v\n", err)
		os.Exit(1)
	}
	attr := &syscall.ProcAttr{Env: os.Environ(), Files: []uintptr{0, 1, 2}}
	took := make([]time.Duration, n)
	for i := range took {
		start := time.Now()
		pid, err := syscall.ForkExec(prog, os.Args[2:], attr)
		if err != nil {
			fmt.Fprintf(os.Stderr, "forkexec: start %s: %v\n", prog, err)
			os.Exit(1)
		}
		var ws syscall.WaitStatus
		for {
			_, err = syscall.Wait4(pid, &ws, 0, nil)
			if err != syscall.EINTR {
				break
			}
		}
		took[i] = time.Since(start)
		if err != nil || ws.ExitStatus() != 0 {
			fmt.Fprintf(os.Stderr, "forkexec: wait for %s: %v, status %v\n", prog, err, ws)
			os.Exit(1)
		}
	}
	for _, d := range took {
		fmt.Println(d.Nanoseconds())
	}
}
