package launcher

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"unsafe"
)

// reapArg, as the launcher's second argument, makes it a reaping launcher
// (ReapingLauncher): it starts processes as its own children and reports
// their exits.
const reapArg = "reap"

// Frames a reaping launcher sends, each frameSize bytes: kind (1 byte), pid
// (4), then for frameAnswer the errno (4) and stage (1) of Launcher's
// answer, for frameExit the wait status (4), a byte of padding and the
// rusage as the kernel wrote it (the agent runs the same binary, so the
// same layout; the native launcher's struct rusage is the same 144 bytes
// on amd64).
const (
	frameAnswer = 1
	frameExit   = 2
)

var frameSize = 10 + int(unsafe.Sizeof(syscall.Rusage{}))

// serveReaping is the reaping launcher where the native one cannot run (its
// C twin is c/launcher.c's serve_reaping): as serve, but each process is its
// own child, which it reaps (reapChildren) and whose wait status and rusage
// it sends after the process's answer. It returns the exit code; the
// processes still running then are re-parented to the agent.
func serveReaping(nofile string) int {
	score := prepare(nofile)
	// mu orders the frames: a start and its answer are one step, and a
	// child's reaping and its exit frame another, so a pid's exit frame is
	// sent before the kernel may give its pid to the next start.
	var mu sync.Mutex
	started := make(chan struct{}, 1)
	go reapChildren(&mu, started)
	frame := make([]byte, frameSize)
	for {
		req, fds, err := readRequest()
		if errors.Is(err, io.EOF) {
			return 0
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "berth-agent launcher: %v\n", err)
			return 1
		}
		mu.Lock()
		pid, errno, stage := spawn(req, fds, score, 0)
		for _, fd := range fds {
			syscall.Close(fd)
		}
		clear(frame)
		frame[0] = frameAnswer
		binary.LittleEndian.PutUint32(frame[1:5], uint32(pid))
		binary.LittleEndian.PutUint32(frame[5:9], uint32(errno))
		frame[9] = stage
		err = writeFrame(frame)
		mu.Unlock()
		if pid > 0 {
			select {
			case started <- struct{}{}:
			default: // the reaper has a wake-up pending already
			}
		}
		if err != nil {
			return 0
		}
	}
}

// reapChildren waits for the launcher's children to exit and, for each,
// reaps it and sends its exit frame under mu. With no child it waits for
// the next start on started.
func reapChildren(mu *sync.Mutex, started <-chan struct{}) {
	frame := make([]byte, frameSize)
	for {
		// WNOWAIT: the child stays a zombie, its pid taken, until it is
		// reaped under mu.
		var info [128]byte // siginfo_t
		_, _, e := syscall.Syscall6(syscall.SYS_WAITID, pAll, 0, uintptr(unsafe.Pointer(&info[0])), syscall.WEXITED|syscall.WNOWAIT, 0, 0)
		switch e {
		case 0:
		case syscall.EINTR:
			continue
		case syscall.ECHILD:
			<-started
			continue
		default:
			fmt.Fprintf(os.Stderr, "berth-agent launcher: waitid: %v\n", e)
			<-started
			continue
		}
		// si_pid follows si_signo, si_errno, si_code and the padding that
		// aligns the union (siginfo_t on 64-bit Linux).
		pid := int(int32(binary.LittleEndian.Uint32(info[16:20])))
		mu.Lock()
		var ws syscall.WaitStatus
		var ru syscall.Rusage
		got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, &ru)
		for errors.Is(err, syscall.EINTR) {
			got, err = syscall.Wait4(pid, &ws, syscall.WNOHANG, &ru)
		}
		if err == nil && got == pid {
			clear(frame)
			frame[0] = frameExit
			binary.LittleEndian.PutUint32(frame[1:5], uint32(pid))
			binary.LittleEndian.PutUint32(frame[5:9], uint32(ws))
			copy(frame[10:], unsafe.Slice((*byte)(unsafe.Pointer(&ru)), unsafe.Sizeof(ru)))
			err = writeFrame(frame)
		}
		mu.Unlock()
		if err != nil && !errors.Is(err, syscall.ECHILD) {
			// The agent is gone: the main loop sees EOF and leaves.
			return
		}
	}
}

// pAll is waitid(2)'s P_ALL idtype: wait for any child.
const pAll = 0

// writeFrame writes one frame to the socket.
func writeFrame(b []byte) error {
	for len(b) > 0 {
		n, err := syscall.Write(socketFD, b)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}
