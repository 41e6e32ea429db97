package server

import (
	"crypto/rand"
	"fmt"
	"regexp"
	"strings"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/server/runtime"
)

var (
	// sandboxIDPattern keeps ids usable as hostnames (RFC 1123 labels),
	// container ids and short socket paths.
	sandboxIDPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
	execIDPattern    = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)
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
	if !sandboxIDPattern.MatchString(id) {
		return rpcstatus.InvalidArgument(field, fmt.Sprintf("%q must be 1 to 63 characters from [a-z0-9-] starting with a letter or digit", id))
	}
	return nil
}

func validateExecID(field, id string) error {
	if !execIDPattern.MatchString(id) {
		return rpcstatus.InvalidArgument(field, fmt.Sprintf("%q must be 1 to 128 characters from [A-Za-z0-9._-]", id))
	}
	return nil
}

func validateLabels(field string, labels map[string]string) error {
	total := 0
	for k, v := range labels {
		total += len(k) + len(v)
		switch {
		case k == "":
			return rpcstatus.InvalidArgument(field, "a label key is empty")
		case strings.HasPrefix(k, runtime.LabelPrefix):
			return rpcstatus.InvalidArgument(field, fmt.Sprintf("label key %q uses the reserved prefix %q", k, runtime.LabelPrefix))
		case len(k)+len(v) > maxLabelBytes:
			return rpcstatus.InvalidArgument(field, fmt.Sprintf("label %q is %d bytes with its value; the limit is %d", k, len(k)+len(v), maxLabelBytes))
		}
	}
	if total > maxLabelsBytes {
		return rpcstatus.InvalidArgument(field, fmt.Sprintf("%d labels take %d bytes, keys and values; the limit is %d in all", len(labels), total, maxLabelsBytes))
	}
	return nil
}

// idAlphabet is lowercase letters and digits without look-alikes (0/o, 1/l).
const idAlphabet = "abcdefghijkmnpqrstuvwxyz23456789"

// newID returns prefix followed by n random characters from idAlphabet:
// 32^n possibilities (n=10 gives 50 bits).
func newID(prefix string, n int) string {
	b := make([]byte, n)
	rand.Read(b)
	for i := range b {
		b[i] = idAlphabet[int(b[i])%len(idAlphabet)]
	}
	return prefix + string(b)
}
