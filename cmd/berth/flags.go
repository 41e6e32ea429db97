package main

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"google.golang.org/protobuf/types/known/durationpb"

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
	timeout time.Duration
	execID  string
	shell   string
	bash    bool
	noStdin bool
	// TTY mode is not implemented yet; the flags exist to say so.
	interactive, tty bool
}

// register adds the flags to fs; berth run has no --id, its sandbox being
// new.
func (f *processFlags) register(fs *pflag.FlagSet, withExecID bool) {
	fs.StringArrayVarP(&f.env, "env", "e", nil, "set an environment variable of the command, KEY=VALUE (repeatable)")
	fs.StringVarP(&f.cwd, "cwd", "w", "", "working directory inside the sandbox (default the sandbox's, /workspace)")
	fs.DurationVar(&f.timeout, "timeout", 0, "kill the command's process group after this long (default and bounds: berthd's)")
	if withExecID {
		fs.StringVar(&f.execID, "id", "", "exec id; starting an id that exists follows that exec instead of running anew")
	}
	fs.StringVar(&f.shell, "shell", "", "run this command string with /bin/sh -c instead of COMMAND ARG...")
	fs.BoolVar(&f.bash, "bash", false, "run --shell's command string with bash instead of /bin/sh")
	fs.BoolVar(&f.noStdin, "no-stdin", false, "do not forward standard input; the command reads /dev/null")
	fs.BoolVarP(&f.interactive, "interactive", "i", false, "not supported yet")
	fs.BoolVarP(&f.tty, "tty", "t", false, "not supported yet")
	_ = fs.MarkHidden("interactive")
	_ = fs.MarkHidden("tty")
}

// spec builds the process to run from the flags and the command line after
// the sandbox id.
func (f *processFlags) spec(command []string) (*berthv1.ProcessSpec, error) {
	if f.interactive || f.tty {
		return nil, errors.New("-i/-t: terminal sessions are not supported yet; standard input is forwarded when it is not a terminal")
	}
	switch {
	case f.shell != "" && len(command) > 0:
		return nil, fmt.Errorf("give either --shell or COMMAND, not both (COMMAND is %q)", command)
	case f.shell == "" && len(command) == 0:
		return nil, errors.New("no command: give COMMAND [ARG...] or --shell")
	case f.bash && f.shell == "":
		return nil, errors.New("--bash needs --shell")
	case f.timeout < 0:
		return nil, fmt.Errorf("--timeout %v: must not be negative", f.timeout)
	}
	env, err := parseKV("env", f.env)
	if err != nil {
		return nil, err
	}
	spec := &berthv1.ProcessSpec{Argv: command, ShellCommand: f.shell, Cwd: f.cwd, Env: env}
	if f.bash {
		spec.Shell = berthv1.Shell_SHELL_BASH
	}
	if f.timeout > 0 {
		spec.Timeout = durationpb.New(f.timeout)
	}
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
// --no-stdin, when it is not a terminal (a pipe, a file, /dev/null).
func forwardStdin(noStdin, stdinIsTerminal bool) bool {
	return !noStdin && !stdinIsTerminal
}
