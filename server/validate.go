package server

import (
	"crypto/rand"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/sandboxid"
	"github.com/berth-sandbox/berth/internal/textsafe"
	"github.com/berth-sandbox/berth/server/runtime"
)

var (
	execIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)
)

// maxLabelBytes bounds a label's key plus value, as containerd does
// (containerd/labels.Validate: 4096 bytes).
const maxLabelBytes = 4096

// maxLabelsBytes bounds all of a sandbox's labels, keys and values
// together: they are returned with the sandbox by GetSandbox and
// ListSandboxes, whose default page of 100 must stay within gRPC's 4 MiB
// message limit.
const maxLabelsBytes = 16 << 10

func validateSandboxID(field, id string) error {
	if id == "" {
		return rpcstatus.InvalidArgument(field, "is empty")
	}
	if !sandboxid.Valid(id) {
		return rpcstatus.InvalidArgument(field, fmt.Sprintf("%s must be 1 to 63 characters from [a-z0-9-] starting with a letter or digit", textsafe.Quote(id)))
	}
	return nil
}

func validateExecID(field, id string) error {
	if !execIDPattern.MatchString(id) {
		return rpcstatus.InvalidArgument(field, fmt.Sprintf("%s must be 1 to 128 characters from [A-Za-z0-9._-]", textsafe.Quote(id)))
	}
	return nil
}

// validateLabels checks a sandbox's labels (or a label selector) against
// the label rule: a key is 1 or more bytes of printable ASCII without
// spaces (0x21 to 0x7E) outside the reserved prefix berth.dev/; a value is
// printable text: valid UTF-8 of letters, marks, numbers, punctuation,
// symbols and the ASCII space (unicode.IsPrint), so no control characters
// (NUL, ESC, newlines) and no format characters such as the bidirectional
// overrides that disguise what is shown; key plus value at most 4096 bytes,
// all labels at most 16 KiB.
func validateLabels(field string, labels map[string]string) error {
	total := 0
	for k, v := range labels {
		total += len(k) + len(v)
		switch {
		case k == "":
			return rpcstatus.InvalidArgument(field, "a label key is empty")
		case !printableASCII(k):
			return rpcstatus.InvalidArgument(field, fmt.Sprintf("label key %s must be printable ASCII without spaces", textsafe.Quote(k)))
		case strings.HasPrefix(k, runtime.LabelPrefix):
			return rpcstatus.InvalidArgument(field, fmt.Sprintf("label key %s uses the reserved prefix %q", textsafe.Quote(k), runtime.LabelPrefix))
		case strings.HasPrefix(k, runtime.ContainerdLabelPrefix):
			// containerd acts on its own labels (garbage-collection
			// references and roots): a caller's must not keep or free
			// another sandbox's snapshot.
			return rpcstatus.InvalidArgument(field, fmt.Sprintf("label key %s uses containerd's reserved prefix %q", textsafe.Quote(k), runtime.ContainerdLabelPrefix))
		case len(k)+len(v) > maxLabelBytes:
			return rpcstatus.InvalidArgument(field, fmt.Sprintf("label %s is %d bytes with its value; the limit is %d", textsafe.Quote(k), len(k)+len(v), maxLabelBytes))
		case !printableText(v):
			return rpcstatus.InvalidArgument(field, fmt.Sprintf("the value of label %s must be printable text (no control or format characters): %s", textsafe.Quote(k), textsafe.Quote(v)))
		}
	}
	if total > maxLabelsBytes {
		return rpcstatus.InvalidArgument(field, fmt.Sprintf("%d labels take %d bytes, keys and values; the limit is %d in all", len(labels), total, maxLabelsBytes))
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

// validateImageRef checks an image reference a request names: 1 to
// maxImageRefBytes bytes of printable ASCII without spaces, as the
// distribution reference grammar and containerd's names allow.
func validateImageRef(field, ref string) error {
	switch {
	case ref == "":
		return rpcstatus.InvalidArgument(field, "is empty")
	case len(ref) > maxImageRefBytes:
		return rpcstatus.InvalidArgument(field, fmt.Sprintf("%s is %d bytes; the limit is %d", textsafe.Quote(ref), len(ref), maxImageRefBytes))
	case !printableASCII(ref):
		return rpcstatus.InvalidArgument(field, fmt.Sprintf("%s must be printable ASCII without spaces", textsafe.Quote(ref)))
	}
	return nil
}

// reservedDirs are the sandbox paths of the agent's own mounts: no
// process may run in them, and no workload directory may be there.
var reservedDirs = []string{runtime.AgentPath, runtime.RunDir}

// reservedDir returns the reserved directory (see reservedDirs, and the
// kernel's file systems when kernel is true) that the clean absolute path
// dir is or lies in, or "".
func reservedDir(dir string, kernel bool) string {
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

// validateExecCwd refuses a process's working directory inside the agent's
// own mounts (after cleaning: "/x/../.berth-run" is refused too). The
// agent checks the rest: absolute, existing, a directory.
func validateExecCwd(field, cwd string) error {
	if cwd == "" || !filepath.IsAbs(cwd) {
		return nil
	}
	if p := reservedDir(filepath.Clean(cwd), false); p != "" {
		return rpcstatus.InvalidArgument(field, fmt.Sprintf("%s is inside %s, the agent's own directory", textsafe.Quote(cwd), p))
	}
	return nil
}

// newID returns prefix followed by n random characters from sandboxid.Alphabet:
// 32^n possibilities (n=10 gives 50 bits).
func newID(prefix string, n int) string {
	b := make([]byte, n)
	rand.Read(b)
	for i := range b {
		b[i] = sandboxid.Alphabet[int(b[i])%len(sandboxid.Alphabet)]
	}
	return prefix + string(b)
}
