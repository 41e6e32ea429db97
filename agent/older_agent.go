//go:build berth_older_agent

package agent

import (
	"slices"

	"google.golang.org/grpc"
)

// olderAgentLacks are the methods a test build of an older agent (build tag
// berth_older_agent) does not serve, as an agent released before them
// would not: gRPC answers them UNIMPLEMENTED, and berthd reports
// AGENT_TOO_OLD (integration TestAgentTooOld).
var olderAgentLacks = []string{"WriteStdin", "ResizeExec", "WatchFiles"}

func init() {
	d := *agentServiceDesc
	lacks := func(name string) bool { return slices.Contains(olderAgentLacks, name) }
	d.Methods = slices.DeleteFunc(slices.Clone(d.Methods), func(m grpc.MethodDesc) bool { return lacks(m.MethodName) })
	d.Streams = slices.DeleteFunc(slices.Clone(d.Streams), func(s grpc.StreamDesc) bool { return lacks(s.StreamName) })
	agentServiceDesc = &d
}
