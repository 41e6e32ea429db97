// Package validate checks what several services' requests share — sandbox
// and exec ids, labels, image references, process specs and paths — before
// anything reserves or starts, and refuses bad input with
// *apierr.Invalid naming the request field.
package validate

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/berth-sandbox/berth/server/apierr"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/berth-sandbox/berth/internal/bounds"
	"github.com/berth-sandbox/berth/internal/sandboxid"
	"github.com/berth-sandbox/berth/internal/textsafe"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/runtime"
)

// maxLabelBytes bounds a label's key plus value, as containerd does
// (containerd/labels.Validate: 4096 bytes).
const maxLabelBytes = 4096

// maxLabelsBytes bounds all of a sandbox's labels, keys and values
// together: they are returned with the sandbox by GetSandbox and
// ListSandboxes, whose default page of 100 must stay within gRPC's 4 MiB
// message limit.
const maxLabelsBytes = 16 << 10

func SandboxID(field, id string) error {
	if id == "" {
		return apierr.InvalidArgument(field, "is empty")
	}
	if !sandboxid.Valid(id) {
		return apierr.InvalidArgument(field, fmt.Sprintf("%s must be 1 to 63 characters from [a-z0-9-] starting with a letter or digit", textsafe.Quote(id)))
	}
	return nil
}

func ExecID(field, id string) error {
	if !sandboxid.ValidExec(id) {
		return apierr.InvalidArgument(field, fmt.Sprintf("%s must be 1 to 128 characters from [A-Za-z0-9._-]", textsafe.Quote(id)))
	}
	return nil
}

// Labels checks a sandbox's labels (or a label selector) against
// the label rule: a key is 1 or more bytes of printable ASCII without
// spaces (0x21 to 0x7E) outside the reserved prefix berth.dev/; a value is
// printable text: valid UTF-8 of letters, marks, numbers, punctuation,
// symbols and the ASCII space (unicode.IsPrint), so no control characters
// (NUL, ESC, newlines) and no format characters such as the bidirectional
// overrides that disguise what is shown; key plus value at most 4096 bytes,
// all labels at most 16 KiB.
func Labels(field string, labels map[string]string) error {
	total := 0
	for k, v := range labels {
		total += len(k) + len(v)
		switch {
		case k == "":
			return apierr.InvalidArgument(field, "a label key is empty")
		case !printableASCII(k):
			return apierr.InvalidArgument(field, fmt.Sprintf("label key %s must be printable ASCII without spaces", textsafe.Quote(k)))
		case strings.HasPrefix(k, runtime.LabelPrefix):
			return apierr.InvalidArgument(field, fmt.Sprintf("label key %s uses the reserved prefix %q", textsafe.Quote(k), runtime.LabelPrefix))
		case strings.HasPrefix(k, runtime.ContainerdLabelPrefix):
			// containerd acts on its own labels (garbage-collection
			// references and roots): a caller's must not keep or free
			// another sandbox's snapshot.
			return apierr.InvalidArgument(field, fmt.Sprintf("label key %s uses containerd's reserved prefix %q", textsafe.Quote(k), runtime.ContainerdLabelPrefix))
		case len(k)+len(v) > maxLabelBytes:
			return apierr.InvalidArgument(field, fmt.Sprintf("label %s is %d bytes with its value; the limit is %d", textsafe.Quote(k), len(k)+len(v), maxLabelBytes))
		case !printableText(v):
			return apierr.InvalidArgument(field, fmt.Sprintf("the value of label %s must be printable text (no control or format characters): %s", textsafe.Quote(k), textsafe.Quote(v)))
		}
	}
	if total > maxLabelsBytes {
		return apierr.InvalidArgument(field, fmt.Sprintf("%d labels take %d bytes, keys and values; the limit is %d in all", len(labels), total, maxLabelsBytes))
	}
	return nil
}

// printableASCII reports whether s is bytes 0x21 to 0x7E only.
func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// printableText reports whether s is valid UTF-8 of printable characters
// (unicode.IsPrint: no control or format characters; the only space is
// U+0020).
func printableText(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// maxImageRefBytes bounds an image reference: a registry name (at most 255
// bytes by the distribution reference grammar), a tag (128) and a digest.
const maxImageRefBytes = 512

// ImageRef checks an image reference a request names: 1 to
// maxImageRefBytes bytes of printable ASCII without spaces, as the
// distribution reference grammar and containerd's names allow.
func ImageRef(field, ref string) error {
	switch {
	case ref == "":
		return apierr.InvalidArgument(field, "is empty")
	case len(ref) > maxImageRefBytes:
		return apierr.InvalidArgument(field, fmt.Sprintf("%s is %d bytes; the limit is %d", textsafe.Quote(ref), len(ref), maxImageRefBytes))
	case !printableASCII(ref):
		return apierr.InvalidArgument(field, fmt.Sprintf("%s must be printable ASCII without spaces", textsafe.Quote(ref)))
	}
	return nil
}

// reservedDirs are the sandbox paths of the agent's own mounts: no
// process may run in them, and no workload directory may be there.
var reservedDirs = []string{runtime.AgentPath, runtime.RunDir}

// ReservedDir returns the reserved directory (see reservedDirs, and the
// kernel's file systems when kernel is true) that the clean absolute path
// dir is or lies in, or "".
func ReservedDir(dir string, kernel bool) string {
	dirs := reservedDirs
	if kernel {
		dirs = append([]string{"/proc", "/sys", "/dev"}, dirs...)
	}
	for _, p := range dirs {
		if dir == p || strings.HasPrefix(dir, p+"/") {
			return p
		}
	}
	return ""
}

// Bounds of a process's strings. execve(2) takes each argument and
// environment string up to MAX_ARG_STRLEN (128 KiB with its NUL) and all
// of them up to a quarter of the stack limit (2 MiB with the usual 8 MiB);
// a path is at most PATH_MAX (4096) bytes.
// MaxPathBytes is PATH_MAX: the longest path, in bytes.
const MaxPathBytes = 4096

const (
	maxArgBytes     = 128<<10 - 1
	maxArgvEntries  = 4096
	maxProcessBytes = 1 << 20 // argv, shell_command and env, keys and values
	maxUserBytes    = 256     // "uid:gid" or a user name from /etc/passwd
	// minExecTimeout and maxExecTimeout bound process.timeout: the
	// agent's bounds (agent.Config MinTimeout, MaxTimeout), which berthd
	// leaves at their defaults.
	minExecTimeout = time.Second
	maxExecTimeout = 24 * time.Hour
	// defaultExecTimeout is the agent's default timeout (agent.Config
	// DefaultTimeout) of a start that asks for none.
	defaultExecTimeout = 30 * time.Minute
)

// WithCallerDeadline returns spec with its timeout cut to the time left
// before ctx's deadline (the caller's gRPC deadline, grpc-timeout), when
// that is sooner than the timeout the command would have: a caller that
// uses its deadline as the command's timeout gets the command ended as its
// own timeout ends it (SIGTERM, then SIGKILL; result timed_out), instead of
// a process that outlives the call. Never under minExecTimeout. A caller
// without a deadline, and a lost connection, change nothing: the command
// runs on to be attached again.
func WithCallerDeadline(ctx context.Context, spec *berthv1.ProcessSpec) *berthv1.ProcessSpec {
	deadline, ok := ctx.Deadline()
	if !ok {
		return spec
	}
	current := defaultExecTimeout
	if spec.GetTimeout() != nil {
		current = spec.GetTimeout().AsDuration()
	}
	left := max(time.Until(deadline), minExecTimeout)
	if left >= current {
		return spec
	}
	spec = proto.CloneOf(spec)
	spec.Timeout = durationpb.New(left)
	return spec
}

var (
	// A process's NUL bytes are left to the agent, whose refusals quote
	// the argument or key and name process.env[KEY] for a value (the exec
	// contract's validation cases).
	procText = bounds.Text{MaxBytes: maxArgBytes}
	procPath = bounds.Text{MaxBytes: MaxPathBytes}
	// EnvText and PathText check a sandbox's env and paths, NUL included.
	EnvText  = bounds.Text{MaxBytes: maxArgBytes, NoNUL: true}
	PathText = bounds.Text{MaxBytes: MaxPathBytes, NoNUL: true}
	userText = bounds.Text{MaxBytes: maxUserBytes, NoNUL: true}
)

// Process checks the sizes, strings and timeout of a process spec
// before anything reserves or starts: each argument, the shell command,
// env keys and values at most maxArgBytes of UTF-8, at most
// maxArgvEntries arguments and maxProcessBytes in all, cwd a path outside
// the agent's mounts, user at most maxUserBytes, timeout from 1 s to 24 h
// (zero: the default). field names the spec ("process" or
// "start.process"). The agent checks what needs the sandbox: that cwd
// exists, that user names a user.
func Process(field string, p *berthv1.ProcessSpec) error {
	argv := p.GetArgv()
	if len(argv) > maxArgvEntries {
		return apierr.InvalidArgument(field+".argv", fmt.Sprintf("has %d elements; the limit is %d", len(argv), maxArgvEntries))
	}
	total := len(p.GetShellCommand())
	for i, a := range argv {
		if err := procText.String(fmt.Sprintf("%s.argv[%d]", field, i), a); err != nil {
			return err
		}
		total += len(a) + 1
	}
	if err := procText.String(field+".shell_command", p.GetShellCommand()); err != nil {
		return err
	}
	for k, v := range p.GetEnv() {
		// A key's refusal names the map (a key that is not text makes
		// no field name); a value's names its entry, as the agent's do.
		if err := procText.String(field+".env", k); err != nil {
			return err
		}
		if err := procText.String(field+".env["+k+"]", v); err != nil {
			return err
		}
		total += len(k) + len(v) + 2
	}
	if total > maxProcessBytes {
		f := field + ".env"
		if len(p.GetEnv()) == 0 {
			f = field + ".argv"
		}
		return apierr.InvalidArgument(f, fmt.Sprintf("argv, shell_command and env take %d bytes together; the limit is %d", total, maxProcessBytes))
	}
	if err := procPath.String(field+".cwd", p.GetCwd()); err != nil {
		return err
	}
	if err := execCwd(field+".cwd", p.GetCwd()); err != nil {
		return err
	}
	if err := userText.String(field+".user", p.GetUser()); err != nil {
		return err
	}
	if _, err := bounds.Duration(field+".timeout", p.GetTimeout(), minExecTimeout, maxExecTimeout); err != nil {
		return err
	}
	return nil
}

// execCwd refuses a process's working directory inside the agent's
// own mounts (after cleaning: "/x/../.berth-run" is refused too). The
// agent checks the rest: absolute, existing, a directory.
func execCwd(field, cwd string) error {
	if cwd == "" || !filepath.IsAbs(cwd) {
		return nil
	}
	if p := ReservedDir(filepath.Clean(cwd), false); p != "" {
		return apierr.InvalidArgument(field, fmt.Sprintf("%s is inside %s, the agent's own directory", textsafe.Quote(cwd), p))
	}
	return nil
}
