package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/term"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// parseKV parses repeated KEY=VALUE flag values into a map. The value is
// everything after the first '=' and may be empty or hold more '='; a later
// value for the same key replaces an earlier one, as in env(1). flag names
// the flag in errors.
func parseKV(flag string, pairs []string) (map[string]string, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(pairs))
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--%s %q: want KEY=VALUE", flag, p)
		}
		m[k] = v
	}
	return m, nil
}

// processFlags are the flags that describe the process of berth exec and
// berth run.
type processFlags struct {
	env     []string
	cwd     string
	user    string
	timeout time.Duration
	execID  string
	shell   string
	bash    bool
	noStdin bool
	// outputLimit caps each output stream, in bytes; 0: no cap (Exec's
	// stdout_limit_bytes and stderr_limit_bytes).
	outputLimit uint64
	// detachOnHangup leaves a -t command running when berth goes away.
	detachOnHangup bool
	// interactive forwards stdin even from a terminal; tty runs the command
	// on a terminal; detach starts it in the background (berth exec only).
	interactive, tty, detach bool
	// keepOutput makes a detached command wait for a reader rather than
	// lose output (DETACHED_OUTPUT_BLOCK).
	keepOutput bool
	// session runs --shell's command in this shell session (berth exec
	// only).
	session string
}

// register adds the flags to fs; berth run has no --id, its sandbox being
// new.
func (f *processFlags) register(fs *pflag.FlagSet, withExecID bool) {
	fs.StringArrayVarP(&f.env, "env", "e", nil, "set an environment variable of the command, KEY=VALUE (repeatable)")
	fs.StringVarP(&f.user, "user", "u", "", `run as this user: "uid", "uid:gid" or a name from the sandbox's /etc/passwd (default: the sandbox's user)`)
	fs.StringVarP(&f.cwd, "cwd", "w", "", "working directory inside the sandbox (default the sandbox's, /workspace)")
	fs.DurationVar(&f.timeout, "timeout", 0, "kill the command's process group after this long (default and bounds: berthd's)")
	if withExecID {
		fs.StringVar(&f.execID, "id", "", "exec id; starting an id that exists follows that exec instead of running anew")
	}
	fs.StringVar(&f.shell, "shell", "", "run this command string with /bin/sh -c instead of COMMAND ARG...")
	fs.BoolVar(&f.bash, "bash", false, "run --shell's command string with bash instead of /bin/sh")
	fs.BoolVar(&f.noStdin, "no-stdin", false, "do not forward standard input; the command reads /dev/null")
	fs.Uint64Var(&f.outputLimit, "output-limit", 0, "keep at most this many `bytes` of stdout and of stderr each; beyond it output is counted and discarded, and berth says so (default 0: no cap, every byte is shown; berth streams, so no berthd maximum applies)")
	fs.BoolVarP(&f.interactive, "interactive", "i", false, "forward standard input also when it is a terminal")
	fs.BoolVar(&f.detachOnHangup, "detach-on-hangup", false, "with -t, leave the command running when berth's terminal hangs up or berth dies (default: the command's process group gets SIGHUP, as over ssh)")
	fs.BoolVarP(&f.tty, "tty", "t", false, "run the command on a terminal of berth's terminal's size (24x80 when there is none); with -i, berth's terminal is put in raw mode")
	if withExecID {
		fs.BoolVarP(&f.detach, "detach", "d", false, "start the command in the background, print its exec id and exit")
		fs.StringVar(&f.session, "session", "", "run --shell's command string in this shell session (berth session create): its cwd, environment and shell variables carry over")
		fs.BoolVar(&f.keepOutput, "keep-output", false, "while no one is attached, make the command's writes wait once its output buffer is full, instead of dropping the oldest output")
	}
}

// execOptions are the client options of an exec from the flags: its id;
// with --keep-output, writes wait for a reader; with -t, berthd hangs the
// command up (SIGHUP to its process group) when berth goes away, unless
// --detach-on-hangup.
func (f *processFlags) execOptions() []client.ExecOption {
	opts := []client.ExecOption{client.WithExecID(f.execID)}
	if f.keepOutput {
		opts = append(opts, client.WithDetachedOutput(berthv1.DetachedOutput_DETACHED_OUTPUT_BLOCK))
	}
	if f.tty && !f.detachOnHangup {
		opts = append(opts, client.WithHangupOnDisconnect())
	}
	return opts
}

// spec builds the process to run from the flags and the command line after
// the sandbox id.
func (f *processFlags) spec(command []string) (*berthv1.ProcessSpec, error) {
	switch {
	case f.detach && f.interactive:
		return nil, errors.New("--detach and -i: a detached command's stdin cannot be forwarded")
	case f.interactive && f.noStdin:
		return nil, errors.New("-i and --no-stdin contradict each other")
	case f.shell != "" && len(command) > 0:
		return nil, fmt.Errorf("give either --shell or COMMAND, not both (COMMAND is %q)", command)
	case f.shell == "" && len(command) == 0:
		return nil, errors.New("no command: give COMMAND [ARG...] or --shell")
	case f.bash && f.shell == "":
		return nil, errors.New("--bash needs --shell")
	case f.timeout < 0:
		return nil, fmt.Errorf("--timeout %v: must not be negative", f.timeout)
	case f.session != "" && f.shell == "":
		return nil, errors.New("--session needs --shell: a session runs command strings in its shell")
	case f.session != "" && (f.bash || f.tty || f.interactive || f.user != "" || f.cwd != "" || len(f.env) > 0):
		return nil, errors.New("--session takes its shell, user, cwd and environment from the session and reads no stdin: drop --bash, -t, -i, --user, --cwd and --env")
	}
	if f.session != "" {
		// A session's commands read /dev/null: berthd refuses stdin.
		f.noStdin = true
	}
	env, err := parseKV("env", f.env)
	if err != nil {
		return nil, err
	}
	spec := &berthv1.ProcessSpec{Argv: command, ShellCommand: f.shell, Cwd: f.cwd, Env: env, User: f.user, SessionId: f.session}
	if f.bash {
		spec.Shell = berthv1.Shell_SHELL_BASH
	}
	if f.timeout > 0 {
		spec.Timeout = durationpb.New(f.timeout)
	}
	spec.StdoutLimitBytes, spec.StderrLimitBytes = f.outputLimit, f.outputLimit
	return spec, nil
}

// splitExecArgs splits berth exec's positional arguments into the sandbox id
// and the command. Flags end at the sandbox id, so a "--" after it is still
// in args and is dropped; dashAt is cobra's ArgsLenAtDash, the number of
// arguments before a "--" that the flag parser consumed, or -1.
func splitExecArgs(args []string, dashAt int) (sandboxID string, command []string) {
	sandboxID, command = args[0], args[1:]
	if dashAt < 0 && len(command) > 0 && command[0] == "--" {
		command = command[1:]
	}
	return sandboxID, command
}

// forwardStdin says whether berth forwards its standard input: unless
// --no-stdin or --detach, with -i, or else when it is not a terminal (a
// pipe, a file, /dev/null).
func (f *processFlags) forwardStdin(stdinIsTerminal bool) bool {
	return !f.noStdin && !f.detach && (f.interactive || !stdinIsTerminal)
}

// setup completes spec for berth's own stdin and stdout: it returns the
// reader to forward (nil for none) and, with -t, berth's terminal, after
// giving spec its size and berth's TERM.
func (f *processFlags) setup(spec *berthv1.ProcessSpec, stdin, stdout *os.File) (io.Reader, *terminal) {
	var in io.Reader
	if f.forwardStdin(term.IsTerminal(int(stdin.Fd()))) {
		spec.Stdin = true
		in = stdin
	}
	if !f.tty {
		return in, nil
	}
	t := newTerminal(stdin, stdout, in != nil)
	spec.Tty = t.startSize()
	if v := os.Getenv("TERM"); v != "" && spec.GetEnv()["TERM"] == "" {
		if spec.Env == nil {
			spec.Env = make(map[string]string)
		}
		spec.Env["TERM"] = v
	}
	return in, t
}
