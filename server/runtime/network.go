package runtime

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Label keys of a sandbox's network. A sandbox of network mode NONE has
// none of them.
const (
	labelNetwork         = LabelPrefix + "network"             // "egress"
	labelNetworkAllow    = LabelPrefix + "network-allow"       // JSON array of normalized entries
	labelNetworkMaxConns = LabelPrefix + "network-max-conns"   // decimal
	labelNetworkEgress   = LabelPrefix + "network-egress-bps"  // bytes per second, decimal
	labelNetworkIngress  = LabelPrefix + "network-ingress-bps" // bytes per second, decimal
)

// MaxNetworkAllowLabelBytes bounds the JSON allow-list kept in a label
// (containerd limits a label to 4096 bytes with its key).
const MaxNetworkAllowLabelBytes = 4000

// NetworkSpec is a sandbox's network. The zero value is mode NONE: the
// runtime's own empty network namespace (only lo).
type NetworkSpec struct {
	// Egress is network mode EGRESS.
	Egress bool
	// Allow is the normalized allow-list (package network) and
	// MaxConnections its connection cap, as recorded.
	Allow          []string
	MaxConnections uint32
	// EgressBytesPerSecond and IngressBytesPerSecond cap its bandwidth;
	// zero: no cap.
	EgressBytesPerSecond, IngressBytesPerSecond uint64
	// NetNS is the path of the network namespace the container joins, and
	// ResolvConf a host file bind-mounted read-only at /etc/resolv.conf
	// (network.Attachment). Set for EGRESS at create; not recorded.
	NetNS, ResolvConf string
}

// AllowJSON returns the label value of an allow-list.
func AllowJSON(allow []string) string {
	if allow == nil {
		allow = []string{}
	}
	b, _ := json.Marshal(allow)
	return string(b)
}

// Equal reports whether n and o record the same network.
func (n NetworkSpec) Equal(o NetworkSpec) bool {
	return n.Egress == o.Egress && slices.Equal(n.Allow, o.Allow) && n.MaxConnections == o.MaxConnections &&
		n.EgressBytesPerSecond == o.EgressBytesPerSecond && n.IngressBytesPerSecond == o.IngressBytesPerSecond
}

func (n NetworkSpec) digestFields(field func(name, value string)) {
	if !n.Egress {
		return // digests of sandboxes without a network stay as they were
	}
	field("network", "egress")
	field("network.allow", AllowJSON(n.Allow))
	field("network.max_connections", strconv.FormatUint(uint64(n.MaxConnections), 10))
	field("network.egress_bytes_per_second", strconv.FormatUint(n.EgressBytesPerSecond, 10))
	field("network.ingress_bytes_per_second", strconv.FormatUint(n.IngressBytesPerSecond, 10))
}

func (n NetworkSpec) addLabels(labels map[string]string) {
	if !n.Egress {
		return
	}
	labels[labelNetwork] = "egress"
	labels[labelNetworkAllow] = AllowJSON(n.Allow)
	if n.MaxConnections > 0 {
		labels[labelNetworkMaxConns] = strconv.FormatUint(uint64(n.MaxConnections), 10)
	}
	if n.EgressBytesPerSecond > 0 {
		labels[labelNetworkEgress] = strconv.FormatUint(n.EgressBytesPerSecond, 10)
	}
	if n.IngressBytesPerSecond > 0 {
		labels[labelNetworkIngress] = strconv.FormatUint(n.IngressBytesPerSecond, 10)
	}
}

func decodeNetwork(labels map[string]string) NetworkSpec {
	var n NetworkSpec
	if labels[labelNetwork] != "egress" {
		return n
	}
	n.Egress = true
	_ = json.Unmarshal([]byte(labels[labelNetworkAllow]), &n.Allow)
	if v, err := strconv.ParseUint(labels[labelNetworkMaxConns], 10, 32); err == nil {
		n.MaxConnections = uint32(v)
	}
	n.EgressBytesPerSecond, _ = strconv.ParseUint(labels[labelNetworkEgress], 10, 64)
	n.IngressBytesPerSecond, _ = strconv.ParseUint(labels[labelNetworkIngress], 10, 64)
	return n
}

// specOpts joins the container to its network namespace and mounts its
// resolv.conf; nothing for mode NONE (containerd's default spec makes a
// fresh namespace, in which runc brings lo up).
func (n NetworkSpec) specOpts() []oci.SpecOpts {
	if n.NetNS == "" {
		return nil
	}
	opts := []oci.SpecOpts{oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: n.NetNS})}
	if n.ResolvConf != "" {
		opts = append(opts, oci.WithMounts([]specs.Mount{{Destination: "/etc/resolv.conf", Type: "bind", Source: n.ResolvConf,
			Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}}}))
	}
	return opts
}

// withSysBind replaces the spec's sysfs mount at /sys with a read-only
// bind of the host's /sys: a sandbox in a user namespace of its own that
// joins a network namespace berthd made (owned by the host's user
// namespace) may not mount sysfs (EPERM), as rootless runtimes find too.
func withSysBind(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	for i, m := range s.Mounts {
		if m.Destination == "/sys" {
			s.Mounts[i] = specs.Mount{Destination: "/sys", Type: "bind", Source: "/sys", Options: []string{"rbind", "ro", "nosuid", "noexec", "nodev"}}
		}
	}
	return nil
}

// withoutNetSysctls drops the spec's net.* sysctls, which a sandbox in a
// user namespace of its own cannot write in a network namespace berthd
// made.
func withoutNetSysctls(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	if s.Linux != nil {
		for k := range s.Linux.Sysctl {
			if strings.HasPrefix(k, "net.") {
				delete(s.Linux.Sysctl, k)
			}
		}
	}
	return nil
}
