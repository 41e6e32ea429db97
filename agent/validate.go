package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/berth-sandbox/berth/internal/bounds"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/textsafe"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// plan is a validated start: everything needed to run the process, with
// defaults applied.
type plan struct {
	argv        []string // argv[0] is not yet resolved in PATH
	prog        string   // the program to run, when not argv[0] looked up in PATH
	env         []string // KEY=value, the base environment plus the start's
	dir         string   // absolute working directory, checked to exist
	stdin       bool
	timeout     time.Duration
	stdoutLimit uint64 // bytes; 0: no cap
	stderrLimit uint64 // bytes; 0: no cap
	// block keeps output no reader has read: the writer waits instead of
	// the ring shedding it (DETACHED_OUTPUT_BLOCK).
	block bool
	// tty is true when the process runs on a pseudo-terminal of ttyRows x
	// ttyCols cells.
	tty              bool
	ttyRows, ttyCols uint16
	// uid and gid are the user the process runs as (process.user, else
	// the workload user).
	uid, gid uint32
}

// maxExecIDLen is the longest exec id, as in berth.v1.ExecStart.exec_id.
const maxExecIDLen = 128

// validateExecID checks an exec id: 1 to 128 characters from [A-Za-z0-9._-]
// (berth.v1.ExecStart.exec_id).
func validateExecID(id string) error {
	if id == "" {
		return rpcstatus.InvalidArgument("exec_id", "is empty; berthd names every exec")
	}
	if len(id) > maxExecIDLen {
		return rpcstatus.InvalidArgument("exec_id", fmt.Sprintf("%s is %d characters long, more than %d", textsafe.Quote(id), len(id), maxExecIDLen))
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return rpcstatus.InvalidArgument("exec_id", fmt.Sprintf("%s has %q at offset %d; allowed are [A-Za-z0-9._-]", textsafe.Quote(id), c, i))
		}
	}
	return nil
}

// planStart validates spec and what to do with output no reader reads
// (detached), and resolves defaults, before anything runs. Its errors name
// the offending field: INVALID_ARGUMENT for a malformed spec,
// FAILED_PRECONDITION with reason CWD_INVALID for a working directory that
// does not exist or is not a directory (stat(2)). Output caps are taken as
// given: zero means none (a streaming reader has no ceiling). A
// background start without a timeout gets none (Config.DefaultTimeout is
// for a caller waiting on the result): it runs until it exits, is
// signalled, or the sandbox ends.
func (s *Server) planStart(spec *berthv1.ProcessSpec, detached berthv1.DetachedOutput, background bool) (*plan, error) {
	if spec == nil {
		return nil, rpcstatus.InvalidArgument("process", "is missing")
	}
	p := &plan{stdin: spec.GetStdin()}
	argv, cmd := spec.GetArgv(), spec.GetShellCommand()
	switch {
	case len(argv) == 0 && cmd == "":
		return nil, rpcstatus.InvalidArgument("process.argv", "is empty and process.shell_command is empty; set exactly one")
	case len(argv) > 0 && cmd != "":
		return nil, rpcstatus.InvalidArgument("process.argv", fmt.Sprintf("is set (%d elements) together with process.shell_command; set exactly one", len(argv)))
	case len(argv) > 0:
		for i, a := range argv {
			if at := strings.IndexByte(a, 0); at >= 0 {
				return nil, rpcstatus.InvalidArgument(fmt.Sprintf("process.argv[%d]", i), fmt.Sprintf("%s contains a NUL byte at offset %d", textsafe.Quote(a), at))
			}
		}
		if argv[0] == "" {
			return nil, rpcstatus.InvalidArgument("process.argv[0]", "is empty; it names the program to run")
		}
		p.argv = argv
	default:
		if at := strings.IndexByte(cmd, 0); at >= 0 {
			return nil, rpcstatus.InvalidArgument("process.shell_command", fmt.Sprintf("contains a NUL byte at offset %d", at))
		}
		switch sh := spec.GetShell(); sh {
		case berthv1.Shell_SHELL_UNSPECIFIED, berthv1.Shell_SHELL_SH:
			// argv[0] "sh", as `sh -c` gives it: its messages say "sh: ...".
			p.argv, p.prog = []string{"sh", "-c", cmd}, "/bin/sh"
		case berthv1.Shell_SHELL_BASH:
			p.argv = []string{"bash", "-c", cmd}
		default:
			return nil, rpcstatus.InvalidArgument("process.shell", fmt.Sprintf("%d is not a known Shell value", sh))
		}
	}

	p.uid, p.gid = s.cfg.UID, s.cfg.GID
	if u := spec.GetUser(); u != "" {
		var err error
		if p.uid, p.gid, err = resolveUser(passwdFile, u); err != nil {
			return nil, err
		}
	}
	base := s.cfg.Env
	if s.cfg.LoginEnv {
		base = s.loginEnv(base, p.uid)
	}
	env, err := mergeEnv(base, spec.GetEnv())
	if err != nil {
		return nil, err
	}
	p.env = env

	if p.dir, err = s.checkCwd(spec.GetCwd()); err != nil {
		return nil, err
	}

	if !background {
		p.timeout = s.cfg.DefaultTimeout
	}
	switch d, err := bounds.Duration("process.timeout", spec.GetTimeout(), s.cfg.MinTimeout, s.cfg.MaxTimeout); {
	case err != nil:
		return nil, err
	case d != 0:
		p.timeout = d
	}
	p.stdoutLimit = spec.GetStdoutLimitBytes()
	p.stderrLimit = spec.GetStderrLimitBytes()
	switch detached {
	case berthv1.DetachedOutput_DETACHED_OUTPUT_UNSPECIFIED, berthv1.DetachedOutput_DETACHED_OUTPUT_DROP_OLDEST:
	case berthv1.DetachedOutput_DETACHED_OUTPUT_BLOCK:
		p.block = true
	default:
		return nil, rpcstatus.InvalidArgument("detached_output", fmt.Sprintf("%d is not a known DetachedOutput value", detached))
	}
	if tty := spec.GetTty(); tty != nil {
		p.tty = true
		if p.ttyRows, p.ttyCols, err = ttySize("process.tty", tty.GetRows(), tty.GetCols()); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// ttySize checks a terminal size: rows and cols from 1 to 65535
// (struct winsize holds 16 bits; tty_ioctl(4)). field prefixes the field
// names in errors.
func ttySize(field string, rows, cols uint32) (uint16, uint16, error) {
	for _, f := range []struct {
		name string
		v    uint32
	}{{"rows", rows}, {"cols", cols}} {
		if f.v < 1 || f.v > 65535 {
			return 0, 0, rpcstatus.InvalidArgument(field+"."+f.name, fmt.Sprintf("%d is outside 1 to 65535", f.v))
		}
	}
	return uint16(rows), uint16(cols), nil
}

// checkCwd returns the working directory for cwd: the default one when cwd
// is empty, else cwd, which must be absolute and an existing directory.
func (s *Server) checkCwd(cwd string) (string, error) {
	dir := cwd
	what := textsafe.Quote(cwd)
	if cwd == "" {
		dir = s.workDir
		what = fmt.Sprintf("is empty and the default working directory %q", dir)
	} else {
		if strings.IndexByte(cwd, 0) >= 0 {
			return "", rpcstatus.InvalidArgument("process.cwd", fmt.Sprintf("%s contains a NUL byte", textsafe.Quote(cwd)))
		}
		if !filepath.IsAbs(cwd) {
			return "", rpcstatus.InvalidArgument("process.cwd", fmt.Sprintf("%s is not an absolute path", textsafe.Quote(cwd)))
		}
	}
	fi, err := os.Stat(dir)
	var why string
	switch {
	case errors.Is(err, fs.ErrNotExist):
		why = "does not exist"
	case err != nil:
		why = "cannot be used: " + err.Error()
	case !fi.IsDir():
		why = "is not a directory"
	default:
		return dir, nil
	}
	return "", rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonCwdInvalid,
		fmt.Sprintf("process.cwd: %s %s", what, why),
		map[string]string{"field": "process.cwd", "cwd": dir})
}

// mergeEnv returns base with add applied on top: keys of add replace the
// same keys of base, in place; new keys follow in sorted order. Keys must be
// non-empty and hold neither '=' nor NUL; values must not hold NUL. Error
// messages never quote a value: values may be secrets.
func mergeEnv(base []string, add map[string]string) ([]string, error) {
	keys := make([]string, 0, len(add))
	for k := range add {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		switch {
		case k == "":
			return nil, rpcstatus.InvalidArgument("process.env", "has an empty key")
		case strings.IndexByte(k, '=') >= 0:
			return nil, rpcstatus.InvalidArgument("process.env", fmt.Sprintf("key %s contains '='", textsafe.Quote(k)))
		case strings.IndexByte(k, 0) >= 0:
			return nil, rpcstatus.InvalidArgument("process.env", fmt.Sprintf("key %s contains a NUL byte", textsafe.Quote(k)))
		}
		if at := strings.IndexByte(add[k], 0); at >= 0 {
			return nil, rpcstatus.InvalidArgument("process.env["+k+"]", fmt.Sprintf("value contains a NUL byte at offset %d", at))
		}
	}
	env := make([]string, 0, len(base)+len(add))
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := add[k]; !ok {
			env = append(env, kv)
		}
	}
	for _, k := range keys {
		env = append(env, k+"="+add[k])
	}
	return env, nil
}

// envPath returns the value of PATH in env, or the default search path of
// execvp(3) implementations on Linux when it is unset.
func envPath(env []string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], "PATH="); ok {
			return v
		}
	}
	return "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
}

// parseSignal parses an ExecSignal.signal: a name with or without "SIG",
// in any case ("TERM", "sigterm"), or a decimal number ("15"), as listed in
// signal(7). Signal 0 is refused: it delivers nothing.
func parseSignal(name string) (syscall.Signal, error) {
	return parseSignalField("signal.signal", name)
}

// parseSignalField is parseSignal with field naming the request field in
// errors.
func parseSignalField(field, name string) (syscall.Signal, error) {
	if name == "" {
		return 0, rpcstatus.InvalidArgument(field, "is empty; want a name like \"TERM\" or a number like \"15\"")
	}
	if n, err := strconv.Atoi(name); err == nil {
		if n < 1 || n > 64 {
			return 0, rpcstatus.InvalidArgument(field, fmt.Sprintf("%s is not a signal number (1-64, signal(7))", textsafe.Quote(name)))
		}
		return syscall.Signal(n), nil
	}
	up := strings.ToUpper(name)
	if !strings.HasPrefix(up, "SIG") {
		up = "SIG" + up
	}
	sig := unix.SignalNum(up)
	if sig == 0 {
		return 0, rpcstatus.InvalidArgument(field, fmt.Sprintf("%s is not a signal name (signal(7))", textsafe.Quote(name)))
	}
	return sig, nil
}
