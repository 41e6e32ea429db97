package files

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// asUser runs fn with the file-system identity of the workload user and
// returns its error. When the agent's own uid and gid are the workload
// user's and it has no effective capabilities (a sandbox's agent today) it
// simply calls fn.
//
// Otherwise fn runs on a fresh goroutine locked to its OS thread, after
// that thread alone switched identity: setgroups(2) to no supplementary
// groups, setfsgid(2) and setfsuid(2) to the workload user. Go's syscall
// package would apply setgroups to every thread; golang.org/x/sys/unix
// makes the raw per-thread calls. The kernel then checks permissions as the
// workload user and new files and directories get its uid and gid; when
// fsuid goes from 0 to another uid the kernel also clears the file-system
// capabilities (CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER, ...) from the
// thread's effective set (capabilities(7)), so fn cannot bypass the user's
// permissions. Last, the thread clears its effective capability set
// (capset(2) acts on the calling thread), so that a workload user who is
// root is held to root's permissions without CAP_DAC_OVERRIDE and the like,
// as the workload's own processes are. The goroutine exits without unlocking the thread, and the Go
// runtime then ends the thread (runtime.LockOSThread): the identity never
// leaks to other goroutines and needs no restoring.
//
// fn must do its work on the calling goroutine: descriptors it opens may be
// used from anywhere afterwards (permissions are checked at open), but
// path-based calls must happen inside fn. The switch needs CAP_SETUID and
// CAP_SETGID; without them asUser fails with a *userError and fn does not
// run.
func (s *Service) asUser(fn func() error) error {
	if !s.switchUser && !s.dropCaps {
		return fn()
	}
	done := make(chan error, 1)
	go func() {
		// Deliberately never unlocked: see above.
		runtime.LockOSThread()
		if err := s.becomeUser(); err != nil {
			done <- err
			return
		}
		done <- fn()
	}()
	return <-done
}

// becomeUser gives the calling thread the workload user's identity and no
// effective capabilities, and checks that the kernel applied them:
// setfsuid(2) and setfsgid(2) report no error when they refuse.
func (s *Service) becomeUser() error {
	if s.switchUser {
		if err := s.switchIDs(); err != nil {
			return err
		}
	}
	if s.dropCaps {
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			return &userError{s.cfg.UID, s.cfg.GID, fmt.Errorf("capget: %w", err)}
		}
		data[0].Effective, data[1].Effective = 0, 0
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			return &userError{s.cfg.UID, s.cfg.GID, fmt.Errorf("capset: %w", err)}
		}
	}
	return nil
}

// hasEffectiveCaps reports whether the calling thread (the agent, at New)
// has any effective capability.
func hasEffectiveCaps() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return true // unknown: isolate to be safe
	}
	return data[0].Effective != 0 || data[1].Effective != 0
}

// switchIDs switches the calling thread's supplementary groups, fsgid and
// fsuid to the workload user's.
func (s *Service) switchIDs() error {
	uid, gid := int(s.cfg.UID), int(s.cfg.GID)
	if err := unix.Setgroups(nil); err != nil {
		return &userError{s.cfg.UID, s.cfg.GID, fmt.Errorf("setgroups: %w", err)}
	}
	unix.SetfsgidRetGid(gid)
	unix.SetfsuidRetUid(uid)
	// An invalid id (-1) changes nothing and returns the current one.
	if got, _ := unix.SetfsgidRetGid(-1); got != gid {
		return &userError{s.cfg.UID, s.cfg.GID, fmt.Errorf("setfsgid(%d) left fsgid %d", gid, got)}
	}
	if got, _ := unix.SetfsuidRetUid(-1); got != uid {
		return &userError{s.cfg.UID, s.cfg.GID, fmt.Errorf("setfsuid(%d) left fsuid %d", uid, got)}
	}
	return nil
}
