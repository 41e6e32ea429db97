// Command berthd is the berth control service: it serves the berth.v1 gRPC
// API and runs sandboxes in containerd. docs/configuration.md lists its flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/berth-sandbox/berth/internal/logs"
	"github.com/berth-sandbox/berth/internal/telemetry"
	"github.com/berth-sandbox/berth/server"
	"github.com/berth-sandbox/berth/server/auth"
	"github.com/berth-sandbox/berth/server/cluster"
	"github.com/berth-sandbox/berth/server/metrics"
	"github.com/berth-sandbox/berth/server/network"
	"github.com/berth-sandbox/berth/server/runtime"
	"google.golang.org/grpc"
)

func main() {
	var (
		rtCfg      runtime.Config
		svcCfg     server.Config
		listens    []string
		fleetFlags clusterFlags
		authCfg    auth.Config
		socket     socketFlags
		logLevel   slog.Level
		version    bool
		readyLimit time.Duration
		metricsAt  string
		pprofOn    bool
		otlpAt     string
		transport  transportFlags
	)
	flag.StringVar(&rtCfg.Address, "containerd-address", "/run/containerd/containerd.sock", "containerd socket path")
	flag.StringVar(&rtCfg.Namespace, "namespace", "berth", "containerd namespace for berth's containers and images")
	flag.StringVar(&rtCfg.Snapshotter, "snapshotter", "overlayfs", "containerd snapshotter for sandboxes' file systems; disk quotas need btrfs (see scripts/btrfs-quota.sh)")
	flag.StringVar(&rtCfg.StateDir, "state-dir", "/run/berth", "host directory for per-sandbox agent sockets and logs (keep it short: socket paths max 107 bytes)")
	flag.DurationVar(&rtCfg.CreateWorkLimit, "create-work-limit", 10*time.Minute, "longest a create's data work may take (unpacking its image, a chowned copy with --root-id-mapping chowned) within the caller's deadline; past it the create fails UNAVAILABLE and a retry with the same sandbox_id goes on from the work done")
	flag.DurationVar(&rtCfg.CallBudget, "containerd-budget", 10*time.Second, "how long a containerd request that should answer at once (records, tasks) may take before it fails with UNAVAILABLE CONTAINERD_UNAVAILABLE")
	flag.StringVar(&rtCfg.AgentBinary, "agent-binary", "/usr/local/lib/berth/berth-agent", "host path of the static berth-agent binary")
	flag.Func("listen", "listen `address` (gRPC, Connect and gRPC-Web: docs/http.md): unix:///path or host:port (TCP needs --tls-cert and --tls-key, or --insecure-tcp); repeatable, e.g. a unix socket for local callers and TCP for the fleet (default unix:///run/berth/berthd.sock)", func(v string) error {
		listens = append(listens, v)
		return nil
	})
	flag.StringVar(&authCfg.TokenFile, "token-file", "", "bearer token file: lines \"sha256:<hex of SHA-256(token)> PRINCIPAL\"; re-read on SIGHUP")
	flag.StringVar(&authCfg.TLSCertFile, "tls-cert", "", "PEM certificate (chain) to serve TCP with; re-read on SIGHUP")
	flag.StringVar(&authCfg.TLSKeyFile, "tls-key", "", "PEM private key of --tls-cert; re-read on SIGHUP")
	flag.StringVar(&authCfg.ClientCAFile, "tls-client-ca", "", "PEM CA bundle: client certificates it signed authenticate callers (mTLS), the common name being the principal; re-read on SIGHUP")
	flag.BoolVar(&authCfg.InsecureTCP, "insecure-tcp", false, "serve TCP without TLS: tokens and data cross the network in plaintext (behind a TLS-terminating proxy only)")
	flag.Func("admin", "`PRINCIPAL` that sees and acts on every sandbox and may import, pull and delete images (repeatable; unix:uid:0 always is one)", func(v string) error {
		authCfg.Admins = append(authCfg.Admins, v)
		return nil
	})
	flag.Func("node-principal", "`PRINCIPAL` of another berthd node, which may forward sandbox and file calls on behalf of a caller named in the berth-forwarded-principal metadata, and nothing else; the caller is an admin only with its own token in berth-forwarded-token (repeatable)", func(v string) error {
		authCfg.Nodes = append(authCfg.Nodes, v)
		return nil
	})
	flag.Func("socket-mode", "permission `bits` of the unix socket, octal (default 0600: root only; every uid that connects is its own principal)", socket.setMode)
	flag.Func("socket-group", "`group` (name or gid) owning the unix socket", socket.setGroup)
	flag.Uint64Var(&svcCfg.DefaultPidsLimit, "default-pids-limit", 512, "pids limit of a sandbox whose request sets none")
	flag.Uint64Var(&svcCfg.MaxPidsLimit, "max-pids-limit", 32768, "largest pids limit a request may set")
	flag.DurationVar(&readyLimit, "agent-ready-timeout", 30*time.Second, "how long CreateSandbox waits for the agent to answer")
	flag.DurationVar(&svcCfg.ConnectBudget, "connect-budget", 3*time.Second, "how long a request waits for a sandbox's agent to answer before failing with SANDBOX_UNREACHABLE")
	flag.DurationVar(&svcCfg.AgentBusyLimit, "agent-busy-limit", 30*time.Second, "how long a request waits for an agent that keeps working but has not answered it yet, before SANDBOX_UNREACHABLE (cause AGENT_BUSY)")
	flag.IntVar(&svcCfg.MaxSandboxes, "max-sandboxes", 0, "most sandboxes the server holds, running or stopped; 0: no cap (beyond it: FLEET_BUSY)")
	flag.IntVar(&svcCfg.MaxExecsPerSandbox, "max-execs-per-sandbox", 0, "most execs running at once in one sandbox; 0: no cap")
	flag.IntVar(&svcCfg.MaxExecs, "max-execs", 0, "most execs running at once in all sandboxes; 0: no cap")
	flag.Uint64Var(&svcCfg.MemoryBudgetBytes, "memory-budget-bytes", 0, "most memory in `bytes` promised to sandboxes (sum of their memory_bytes); 0: no cap (the default, but on a node of a fleet, where it is the host's memory)")
	flag.Float64Var(&svcCfg.DiskOvercommit, "disk-overcommit", 1, "how many times the btrfs pool's size the sandboxes' disk quotas may sum to (beyond it: FLEET_BUSY); 1: quotas fit in the pool; -1: no check")
	flag.IntVar(&svcCfg.MaxSandboxesPerPrincipal, "max-sandboxes-per-principal", 0, "most sandboxes one principal holds, running or stopped; 0: no cap")
	flag.Uint64Var(&svcCfg.MaxMemoryBytesPerPrincipal, "max-memory-bytes-per-principal", 0, "most memory in `bytes` promised to one principal's sandboxes; 0: no cap")
	flag.Uint64Var(&svcCfg.MaxDiskBytesPerPrincipal, "max-disk-bytes-per-principal", 0, "most disk quota in `bytes` promised to one principal's sandboxes; 0: no cap")
	flag.IntVar(&svcCfg.MaxSnapshotsPerPrincipal, "max-snapshots-per-principal", 16, "most stored snapshots one principal may hold (each keeps disk no sandbox quota counts); 0: no cap")
	flag.DurationVar(&svcCfg.BusyRetryDelay, "busy-retry-delay", time.Second, "retry delay a FLEET_BUSY error suggests")
	flag.IntVar(&svcCfg.TaskRestartLimit, "task-restart-limit", 5, "restarts of a sandbox's dead task within --task-restart-window; 0: never restart")
	flag.DurationVar(&svcCfg.TaskRestartWindow, "task-restart-window", 10*time.Minute, "window of --task-restart-limit")
	flag.StringVar(&svcCfg.JournalDir, "journal-dir", "", "directory for the per-sandbox runtime journals that tell stale exec ids from unknown ones (default <state-dir>/journal)")
	flag.Uint64Var(&svcCfg.MaxCPUMillis, "max-cpu-millis", 0, "largest CPU cap a request may set, in thousandths of a CPU (default: the host's CPUs x 1000)")
	flag.Uint64Var(&svcCfg.MaxMemoryBytes, "max-memory-bytes", 0, "largest memory cap a request may set, in bytes (default: the host's physical memory)")
	flag.Int64Var(&svcCfg.DefaultCPUMillis, "default-cpu-millis", 1000, "CPU cap of a sandbox whose request sets none, in thousandths of a CPU; -1: no cap")
	flag.Int64Var(&svcCfg.DefaultMemoryBytes, "default-memory-bytes", 1<<30, "memory cap of a sandbox whose request sets none, in `bytes`; -1: no cap")
	flag.Uint64Var(&svcCfg.DefaultOpenFiles, "default-open-files", 1024, "RLIMIT_NOFILE of a sandbox's processes when its request sets none")
	flag.Uint64Var(&svcCfg.MaxOpenFiles, "max-open-files", 1<<20, "largest RLIMIT_NOFILE a request may set")
	flag.BoolVar(&svcCfg.AllowHostUsers, "allow-host-users", false, "let a request run its sandbox in the host's user namespace (host_users); by default every sandbox gets a user namespace and id range of its own")
	flag.Func("userns-first-id", "first host `id` of the ranges of 65536 ids given to sandboxes' user namespaces (default 1073741824)", func(v string) error {
		n, err := strconv.ParseUint(v, 10, 32)
		rtCfg.IDFirst = uint32(n)
		return err
	})
	flag.Func("userns-ranges", "how many id ranges there are from --userns-first-id: sandboxes with a user namespace at once (default 16384)", func(v string) error {
		n, err := strconv.ParseUint(v, 10, 32)
		rtCfg.IDRanges = uint32(n)
		return err
	})
	flag.Func("root-id-mapping", "how sandboxes with user namespaces get their image's files under their ids: \"auto\" (an idmapped mount where the kernel and snapshotter can, a chowned copy elsewhere), \"idmapped\" (refuse to start without) or \"chowned\" (a copy per sandbox; time and disk grow with the image) (default auto)", func(v string) error {
		switch v {
		case "auto":
			rtCfg.RootIDMapping = runtime.RootIDMappingAuto
		case runtime.RootFSIDMapped, runtime.RootFSChowned:
			rtCfg.RootIDMapping = v
		default:
			return fmt.Errorf("want auto, %s or %s", runtime.RootFSIDMapped, runtime.RootFSChowned)
		}
		return nil
	})
	flag.Func("cpuset", "\"auto\": pin each sandbox whose CPU cap is below the host's CPUs to ceil(cpu_millis/1000) CPUs, the least loaded, so nproc shows its share; \"off\": every sandbox may run on every CPU, its CPU cap alone limiting it (default auto; where berthd cannot pin — in a container, without a writable cpuset cgroup — it warns once and runs as off; docs/default-limits.md)", func(v string) error {
		if v != runtime.CPUSetAuto && v != runtime.CPUSetOff {
			return fmt.Errorf("want %s or %s", runtime.CPUSetAuto, runtime.CPUSetOff)
		}
		rtCfg.CPUSet = v
		return nil
	})
	flag.Func("cpu-weight", "\"auto\": weigh the sandboxes' parent cgroup (/<namespace> in the cpu hierarchy) as the sum of its sandboxes' weights, 1024 per CPU of each one's cap, at most 1024 per CPU they may run on (as the kubelet weighs pods), so that under contention they are not weighed as one host process; \"off\": leave it at the kernel's default, one task's weight for all sandboxes together (default auto; where berthd cannot weigh it — in a container, without a writable cpu cgroup — it warns once and runs as off; docs/default-limits.md)", func(v string) error {
		if v != runtime.CPUWeightAuto && v != runtime.CPUWeightOff {
			return fmt.Errorf("want %s or %s", runtime.CPUWeightAuto, runtime.CPUWeightOff)
		}
		rtCfg.CPUWeight = v
		return nil
	})
	flag.Uint64Var(&rtCfg.MaxImageStoreBytes, "max-image-store-bytes", 0, "most `bytes` containerd's content store may hold for berthd's namespace (every image's blobs); an import or pull past it fails RESOURCE_EXHAUSTED NO_SPACE; 0: no bound")
	flag.StringVar(&rtCfg.GVisorBinary, "gvisor-binary", "", "runsc wrapper (scripts/runsc-berth) the runc shim runs for sandboxes with runtime \"gvisor\"; empty: such sandboxes are refused")
	flag.Uint64Var(&svcCfg.MaxSandboxOpenFiles, "max-sandbox-open-files", 1<<20, "largest pids_limit x open_files_limit of a sandbox: its worst case of open files, kept well under the host's fs.file-max")
	flag.Uint64Var(&svcCfg.DefaultDiskBytes, "default-disk-bytes", 0, "disk quota of a sandbox whose request sets none, in `bytes`; 0: none (default: 10 GiB when the snapshotter enforces disk quotas, else none)")
	flag.Uint64Var(&svcCfg.MaxDiskBytes, "max-disk-bytes", 0, "largest disk quota a request may set, in `bytes` (default: no bound)")
	flag.DurationVar(&svcCfg.DefaultIdleTimeout, "default-idle-timeout", 30*time.Minute, "idle timeout of a sandbox whose request sets none")
	flag.DurationVar(&svcCfg.MaxIdleTimeout, "max-idle-timeout", 24*time.Hour, "largest idle timeout or KeepAlive hold a request may set")
	flag.DurationVar(&svcCfg.DefaultMaxLifetime, "default-max-lifetime", 24*time.Hour, "maximum lifetime of a sandbox whose request sets none")
	flag.DurationVar(&svcCfg.MaxLifetime, "max-lifetime", 7*24*time.Hour, "largest maximum lifetime a request may set")
	flag.DurationVar(&svcCfg.Reaper.Interval, "reap-interval", time.Second, "how often idle timeouts and lifetimes are checked")
	flag.Int64Var(&svcCfg.MaxAgentLogBytes, "max-agent-log-bytes", 4<<20, "largest a sandbox's agent log grows, in `bytes`; then its newest half is kept as agent.log.1 and it starts anew")
	flag.Func("pull-registry", "`REGISTRY` PullImage may reach, as references write it (registry.example.com, localhost:5000; repeatable); \"*\" is every registry not on this host, the default; a registry on this host is reached only when named", func(v string) error {
		svcCfg.PullRegistries = append(svcCfg.PullRegistries, v)
		return nil
	})
	flag.DurationVar(&svcCfg.PullResolveTimeout, "pull-resolve-timeout", 10*time.Second, "how long PullImage may take to reach the registry before it fails with UNAVAILABLE")
	flag.Func("warm-pool", "keep `IMAGE=N` sandboxes of IMAGE pre-created for fast creates (repeatable)", func(v string) error {
		image, n, err := parseWarmPool(v)
		if err != nil {
			return err
		}
		if svcCfg.WarmPool == nil {
			svcCfg.WarmPool = map[string]int{}
		}
		svcCfg.WarmPool[image] = n
		return nil
	})
	// Off: members count against no principal's caps yet (a tenant
	// could hold more than its caps allow: docs/state.md), so a host
	// turns them on where that is acceptable.
	flag.IntVar(&svcCfg.ForkStandby, "fork-standby", 1, "after a sandbox's fork, keep the children of its next fork made ahead (standby members, their agents running; counted against the parent's owner's caps, giving way to any sandbox refused for room): as many as its largest fork had, at most `N`; 0 disables them")
	flag.DurationVar(&svcCfg.ForkStandbyIdle, "fork-standby-idle", 10*time.Minute, "remove a sandbox's standby members this long after its last fork")
	flag.DurationVar(&rtCfg.ExecHeartbeat, "exec-heartbeat-interval", 15*time.Second, "silence on an exec stream before the agent sends a heartbeat (given to new sandboxes' agents)")
	flag.DurationVar(&rtCfg.ExecRetention, "exec-retention", 10*time.Minute, "how long a finished exec stays attachable and listed (given to new sandboxes' agents)")
	flag.Uint64Var(&rtCfg.ExecRingBytes, "exec-ring-bytes", 8<<20, "output events retained per exec for re-attaching, in `bytes`; an attached reader this far behind makes the exec's output wait (given to new sandboxes' agents)")
	flag.Uint64Var(&rtCfg.ExecRetainedBytes, "exec-retained-bytes", 0, "output all execs of a sandbox retain together, in `bytes` (0: an eighth of the sandbox's memory, 4 MiB to 256 MiB; given to new sandboxes' agents)")
	flag.Uint64Var(&rtCfg.WorkloadNofile, "workload-nofile", 0, "soft RLIMIT_NOFILE of the processes run in sandboxes, at most the container's hard limit (0: the agent's default, 1024; given to new sandboxes' agents)")
	flag.Uint64Var(&svcCfg.RunMaxOutputBytes, "run-max-output-bytes", 64<<20, "largest stdout_limit_bytes + stderr_limit_bytes of a Run, in `bytes` (Run's defaults are 2 MiB + 1 MiB)")
	flag.Uint64Var(&svcCfg.RunBufferBytes, "run-buffer-bytes", 1<<30, "memory berthd may hold for the output of all Runs in progress, in `bytes`: each holds 64 KiB a stream from its start and more as its output grows; a Run that does not get its first 64 KiB fails with FLEET_BUSY")
	flag.DurationVar(&svcCfg.RunBufferWait, "run-buffer-wait", 30*time.Second, "how long a Run's output may wait for room in --run-buffer-bytes (its process held meanwhile) before the Run fails with OUTPUT_LOST")
	flag.TextVar(&logLevel, "log-level", slog.LevelInfo, "log level: DEBUG (adds a line per RPC), INFO, WARN or ERROR")
	flag.StringVar(&otlpAt, "otlp-endpoint", "", "export OpenTelemetry traces of berthd and its agents over OTLP/gRPC to this URL (http://host:4317 plaintext, https://... TLS); empty: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or $OTEL_EXPORTER_OTLP_ENDPOINT, else no tracing")
	flag.StringVar(&metricsAt, "metrics-listen", "", "serve Prometheus /metrics (and with --pprof /debug/pprof/) over HTTP on this host:port (e.g. 127.0.0.1:9464); empty: off")
	flag.StringVar(&healthAt, "health-listen", "", "also serve only the gRPC health service (grpc.health.v1) in plaintext on this host:port, for probes that speak no TLS (Kubernetes' grpc probes): SERVING from when berthd serves its API until it stops; empty: off")
	flag.BoolVar(&pprofOn, "pprof", false, "also serve Go's profiles under /debug/pprof/ on --metrics-listen, without credentials: whoever reaches it sees berthd's command line (its token file and TLS key paths), stacks, heap and CPU profiles")
	transport.register()
	fleetFlags.register()
	var netCfg network.Config
	var netSubnet, netDir string
	var netOff bool
	flag.BoolVar(&netOff, "no-network", false, "run without the sandbox network: sandboxes of network mode EGRESS are refused (NETWORK_UNAVAILABLE)")
	flag.StringVar(&netCfg.Bridge, "network-bridge", network.DefaultBridge, "host bridge of EGRESS sandboxes; also names berth's nftables tables (berth-BRIDGE) and CNI network; 1-15 characters")
	flag.StringVar(&netSubnet, "network-subnet", network.DefaultSubnet, "IPv4 network of EGRESS sandboxes; its first address is the bridge's (gateway and DNS resolver)")
	flag.StringVar(&netDir, "network-state-dir", "", "directory of the network's state: records, network namespaces, address leases (default <state-dir>/net)")
	flag.Func("network-dns", "upstream DNS resolver `HOST:PORT` that berth's resolver asks for allow-listed names (repeatable; default: the nameservers of /etc/resolv.conf)", func(v string) error {
		if _, err := netip.ParseAddrPort(v); err != nil {
			return fmt.Errorf("want IP:PORT: %w", err)
		}
		netCfg.DNSUpstreams = append(netCfg.DNSUpstreams, v)
		return nil
	})
	flag.Func("network-deny", "IPv4 `CIDR` EGRESS sandboxes never reach unless an allow entry lies inside it, beyond link-local (cloud metadata), loopback, multicast and their own network (repeatable)", func(v string) error {
		p, err := netip.ParsePrefix(v)
		if err != nil || !p.Addr().Is4() {
			return fmt.Errorf("want an IPv4 CIDR like 10.0.0.0/8")
		}
		netCfg.Deny = append(netCfg.Deny, p.Masked())
		return nil
	})
	flag.Func("cni-plugin-dir", "`directory` of the CNI plugins bridge, host-local and loopback (repeatable; default /usr/lib/cni, /opt/cni/bin)", func(v string) error {
		netCfg.PluginDirs = append(netCfg.PluginDirs, v)
		return nil
	})
	flag.BoolVar(&version, "version", false, "print the version and exit")
	flag.Parse()
	if version {
		fmt.Println(server.Version)
		return
	}
	svcCfg.AgentReadyTimeout = readyLimit
	diskDefaultSet := false
	flag.Visit(func(f *flag.Flag) { diskDefaultSet = diskDefaultSet || f.Name == "default-disk-bytes" })
	if err := checkLimits(svcCfg); err != nil {
		fmt.Fprintln(os.Stderr, "berthd:", err)
		os.Exit(2)
	}
	if err := transport.check(); err != nil {
		fmt.Fprintln(os.Stderr, "berthd:", err)
		os.Exit(2)
	}
	if pprofOn && metricsAt == "" {
		fmt.Fprintln(os.Stderr, "berthd: --pprof serves on --metrics-listen, which is not set")
		os.Exit(2)
	}
	if svcCfg.TaskRestartLimit == 0 {
		svcCfg.TaskRestartLimit = -1 // server.Config's "never"
	}
	if svcCfg.JournalDir == "" {
		svcCfg.JournalDir = filepath.Join(rtCfg.StateDir, "journal")
	}
	if len(listens) == 0 {
		listens = []string{"unix:///run/berth/berthd.sock"}
	}
	log := logs.New(os.Stderr, logLevel)
	if p, err := netip.ParsePrefix(netSubnet); err != nil {
		fmt.Fprintln(os.Stderr, "berthd: --network-subnet:", err)
		os.Exit(2)
	} else {
		netCfg.Subnet = p
	}
	netCfg.StateDir = netDir
	if netCfg.StateDir == "" {
		netCfg.StateDir = filepath.Join(rtCfg.StateDir, "net")
	}
	if !fleetFlags.gateway { // a gateway runs no sandboxes
		switch mgr, err := network.New(netCfg, log); {
		case netOff:
			svcCfg.NetworkUnavailable = "berthd runs with --no-network"
		case err != nil:
			log.Error("no sandbox network: EGRESS sandboxes are refused", slog.Any("error", err))
			svcCfg.NetworkUnavailable = err.Error()
		default:
			svcCfg.Network = mgr
		}
	}
	err := fleetFlags.check(listens)
	if fleetFlags.enabled() {
		authCfg.UnixHost = fleetFlags.nodeID
	}
	memoryBudgetSet := false
	flag.Visit(func(f *flag.Flag) { memoryBudgetSet = memoryBudgetSet || f.Name == "memory-budget-bytes" })
	if fleetFlags.enabled() && !fleetFlags.gateway && !memoryBudgetSet {
		// Placement weighs memory promised against the budget: without
		// one a node promised more than its host has stays "least
		// loaded" (issue 22: 30 GiB promised on a 23 GiB host).
		svcCfg.MemoryBudgetBytes = server.HostMemoryBytes()
		log.Info("memory budget of this fleet node: the host's memory (--memory-budget-bytes sets another; 0 for no cap)", slog.Uint64("memory_budget_bytes", svcCfg.MemoryBudgetBytes))
	}
	var authn *auth.Authenticator
	if err == nil {
		authn, err = auth.New(authCfg, log)
	}
	anyUnix, anyTCP := false, false
	for _, l := range listens {
		_, unix := server.UnixPath(l)
		anyUnix, anyTCP = anyUnix || unix, anyTCP || !unix
	}
	for _, l := range listens {
		if err == nil {
			err = checkListen(authn, l, socket, anyUnix, anyTCP)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "berthd:", err)
		os.Exit(2)
	}
	tracer, err := telemetry.Start(context.Background(), otlpAt, "berthd", server.Version)
	if err != nil {
		fmt.Fprintln(os.Stderr, "berthd: --otlp-endpoint:", err)
		os.Exit(2)
	}
	if tracer != nil {
		rtCfg.TraceAgents, svcCfg.Tracer = true, tracer
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			tracer.Shutdown(ctx)
		}()
	}
	transport.checkFiles(log, len(listens))
	if fleetFlags.gateway {
		err = runGateway(log, &fleetFlags, rtCfg.StateDir, svcCfg.ConnectBudget, svcCfg.BusyRetryDelay, listens, authn, socket, transport)
	} else {
		err = run(log, rtCfg, svcCfg, &fleetFlags, listens, metricsAt, pprofOn, authn, socket, transport, diskDefaultSet)
	}
	if err != nil {
		log.Error("berthd failed", slog.Any("error", err))
		os.Exit(1)
	}
}

// run re-adopts the namespace's sandboxes, then serves until SIGTERM or
// SIGINT and stops gracefully. Sandboxes keep running, to be re-adopted by
// the next berthd. SIGHUP re-reads the token file and the TLS material,
// and in a fleet the peer and etcd TLS files and the peer token file.
// With cluster flags the berthd is a node of a fleet: it registers under a
// lease once it serves (so that no node routes to it before it accepts),
// routes calls for other nodes' sandboxes, and revokes its lease when it
// stops. Without an answer from etcd it serves the sandboxes it holds and
// registers when etcd answers.
//
// Disk quotas: with a snapshotter that enforces them and no
// --default-disk-bytes, sandboxes get defaultDiskBytes. Without one, a
// configured default or maximum makes berthd refuse to start (the operator
// asked for a limit it cannot keep); with neither, it starts and warns that
// the disk of sandboxes is unlimited, and requests naming a quota are refused.
func run(log *slog.Logger, rtCfg runtime.Config, svcCfg server.Config, cf *clusterFlags, listens []string, metricsAt string, pprofOn bool, authn *auth.Authenticator, socket socketFlags, transport transportFlags, diskDefaultSet bool) error {
	hup := &reloads{list: []reloader{{"tokens and TLS", authn.Reload}}}
	ctx, stop := signals(log, hup)
	defer stop()
	defer transport.releaseMemory(ctx, log)()

	connectCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	rt, err := runtime.New(connectCtx, rtCfg)
	cancel()
	if err != nil {
		return err
	}
	defer rt.Close()
	if err := rt.IDMapped(); err != nil {
		log.Warn("sandboxes' roots are chowned copies of their image, not idmapped mounts: creating one takes time and disk in proportion to the image", slog.Any("reason", err))
	} else {
		log.Info("sandboxes' roots are idmapped mounts of their snapshot: no copy of the image")
	}
	if err := rt.CPUSetUnavailable(); err != nil {
		log.Warn("sandboxes are NOT pinned to CPUs (--cpuset auto): nproc in a sandbox shows every CPU berthd may use, not its CPU cap; the cap itself holds", slog.Any("reason", err))
	}
	if err := rt.CPUWeightUnavailable(); err != nil {
		log.Warn("the sandboxes' parent cgroup is NOT weighed (--cpu-weight auto): under CPU contention all sandboxes together get the share of one host process", slog.Any("reason", err))
	}
	if err := rt.DiskQuota(); err != nil {
		if !diskDefaultSet && svcCfg.MaxDiskBytes == 0 {
			log.Warn("sandboxes' disk use is NOT limited: any sandbox can fill the host's disk; requests with resources.disk_bytes are refused", slog.Any("reason", err))
		}
	} else if err := rt.PoolMetadata(); err != nil {
		log.Warn("deleting a sandbox may NOT free a full disk pool", slog.Any("reason", err))
	}
	if rt.DiskQuota() == nil && !diskDefaultSet {
		svcCfg.DefaultDiskBytes = defaultDiskBytes
		if max := svcCfg.MaxDiskBytes; max > 0 {
			svcCfg.DefaultDiskBytes = min(defaultDiskBytes, max)
		}
	}
	var m *metrics.Metrics
	if metricsAt != "" {
		m = metrics.New()
		svcCfg.Observer = m
	}
	var (
		fl     *fleet
		member *cluster.Member
	)
	if cf.enabled() {
		// Before anything reads the fleet's records: under another id the
		// node's sandboxes would look like another node's.
		if err := cluster.BindNodeID(rtCfg.StateDir, cf.nodeID); err != nil {
			return err
		}
		if fl, err = cf.open(ctx, log, rtCfg.StateDir, svcCfg.ConnectBudget); err != nil {
			return err
		}
		defer fl.Close()
		hup.add(fl.reloads...)
		if member, err = cf.member(fl, rtCfg.StateDir, log); err != nil {
			return err
		}
		svcCfg.NodeID, svcCfg.Placements = cf.nodeID, member
	}
	svc := server.New(svcCfg, rt, log)
	defer svc.Close()
	// Re-adopt what an earlier berthd left running before serving.
	if err := svc.Start(ctx); err != nil {
		return err
	}
	opts := []server.GRPCOption{server.WithAuthenticator(authn), server.WithTransport(transport.cfg)}
	var join func(context.Context) error
	if member != nil {
		defer member.Close()
		join = func(ctx context.Context) error {
			if err := member.Start(ctx, svc.ClusterLocal()); err != nil {
				return err
			}
			select {
			case err := <-member.Refused():
				return err
			case <-ctx.Done():
				return nil
			}
		}
		router := cluster.NewRouter(cluster.RouterConfig{Member: member, Directory: fl.directory, Peers: fl.peers, Version: server.Version, BusyRetryDelay: svcCfg.BusyRetryDelay, EtcdBudget: cf.etcdBudget, ListBudget: cf.listBudget, Log: log})
		opts = append(opts, server.WithCluster(router, fl.nodes))
	}
	srvOpts := m.ServerOptions()
	if svcCfg.Tracer != nil {
		srvOpts = append(srvOpts, grpc.StatsHandler(telemetry.ServerHandler()))
	}
	opts = append(opts, server.WithServerOptions(srvOpts...))
	srv := server.NewGRPCServer(svc, log, opts...)
	if m != nil {
		m.SetSource(svc)
		if member != nil {
			m.SetFleetConflicts(func() int { return len(member.Conflicts()) })
		}
		m.InitializeGRPC(srv)
		stopMetrics, err := serveMetrics(metricsAt, m.Handler(pprofOn), log)
		if err != nil {
			return err
		}
		defer stopMetrics()
	}
	return serve(ctx, log, srv, listens, transport.listenOptions(log, socket), transport.serveConfig(authn, log), join, slog.String("containerd", rtCfg.Address), slog.String("namespace", rt.Namespace()), slog.String("version", server.Version),
		slog.String("snapshotter", rtCfg.Snapshotter), slog.Uint64("default_disk_bytes", svcCfg.DefaultDiskBytes), slog.Uint64("max_disk_bytes", svcCfg.MaxDiskBytes),
		slog.String("node_id", svcCfg.NodeID), slog.String("cpuset", rt.CPUSet()), slog.String("cpu_weight", rt.CPUWeight()))
}

// runGateway serves a fleet's API without containerd: every call goes to
// the node that holds its sandbox.
func runGateway(log *slog.Logger, cf *clusterFlags, stateDir string, connectBudget, busyRetryDelay time.Duration, listens []string, authn *auth.Authenticator, socket socketFlags, transport transportFlags) error {
	hup := &reloads{list: []reloader{{"tokens and TLS", authn.Reload}}}
	ctx, stop := signals(log, hup)
	defer stop()
	defer transport.releaseMemory(ctx, log)()
	fl, err := cf.open(ctx, log, stateDir, connectBudget)
	if err != nil {
		return err
	}
	defer fl.Close()
	hup.add(fl.reloads...)
	router := cluster.NewRouter(cluster.RouterConfig{Directory: fl.directory, Peers: fl.peers, Version: server.Version, BusyRetryDelay: busyRetryDelay, EtcdBudget: cf.etcdBudget, ListBudget: cf.listBudget, Log: log})
	srv := server.NewGatewayServer(log, server.WithAuthenticator(authn), server.WithCluster(router, fl.nodes), server.WithTransport(transport.cfg))
	return serve(ctx, log, srv, listens, transport.listenOptions(log, socket), transport.serveConfig(authn, log), nil, slog.String("version", server.Version), slog.Bool("gateway", true))
}

// signals returns a context that ends at SIGTERM or SIGINT, and runs
// hup's reloads at each SIGHUP until stop.
func signals(log *slog.Logger, hup *reloads) (context.Context, func()) {
	ctx, stopSignals := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	hups := make(chan os.Signal, 1)
	signal.Notify(hups, syscall.SIGHUP)
	reloaded := make(chan struct{})
	hupCtx, hupStop := context.WithCancel(ctx)
	go func() {
		defer close(reloaded)
		for {
			select {
			case <-hups:
				hup.run(log)
			case <-hupCtx.Done():
				return
			}
		}
	}()
	return ctx, func() {
		hupStop()
		<-reloaded
		signal.Stop(hups)
		stopSignals()
	}
}

// serve serves srv on every listen address until ctx ends, then stops
// gracefully (at most 10 s: exec streams can be long; sandboxes and execs
// live on). Once every address is served it runs join (when not nil) on
// a goroutine until ctx ends: an error from it (the fleet refused the
// node's registration) stops the server and is returned.
func serve(ctx context.Context, log *slog.Logger, srv *grpc.Server, listens []string, listenOpts []server.ListenOption, serveCfg serveConfig, join func(context.Context) error, attrs ...any) error {
	served := make(chan error, len(listens))
	for _, addr := range listens {
		lis, err := server.Listen(addr, listenOpts...)
		if err != nil {
			srv.Stop()
			return err
		}
		cfg := serveCfg.forListen(addr)
		go func() { served <- server.Serve(srv, lis, cfg) }()
	}
	stopHealth, err := serveHealth(healthAt, log)
	if err != nil {
		srv.Stop()
		return err
	}
	defer stopHealth()
	log.Info("berthd serving", append([]any{slog.Any("listen", listens)}, attrs...)...)
	joined := make(chan error, 1)
	if join != nil {
		joinCtx, stopJoin := context.WithCancel(ctx)
		go func() { joined <- join(joinCtx) }()
		// join has returned when serve does: what it started is the
		// caller's to stop.
		defer func() {
			stopJoin()
			if joined != nil {
				<-joined
			}
		}()
	}
	for done := false; !done; {
		select {
		case err := <-served:
			srv.Stop()
			return fmt.Errorf("serve: %w", err)
		case err := <-joined:
			joined = nil
			if err != nil {
				srv.Stop()
				return err
			}
		case <-ctx.Done():
			done = true
		}
	}
	log.Info("berthd stopping")
	stopHealth()
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		srv.Stop()
	}
	// Serve returns nil once stopped.
	for range listens {
		if err := <-served; err != nil {
			return err
		}
	}
	return nil
}

// socketFlags are --socket-mode and --socket-group.
type socketFlags struct {
	mode    os.FileMode
	modeSet bool
	gid     int
	gidSet  bool
}

func (f *socketFlags) setMode(v string) error {
	m, err := strconv.ParseUint(v, 8, 32)
	if err != nil || m > 0o777 {
		return fmt.Errorf("%q is not octal permission bits like 0660", v)
	}
	f.mode, f.modeSet = os.FileMode(m), true
	return nil
}

func (f *socketFlags) setGroup(v string) error {
	gid, err := strconv.Atoi(v)
	if err != nil {
		g, lerr := user.LookupGroup(v)
		if lerr != nil {
			return fmt.Errorf("group %q: %w", v, lerr)
		}
		gid, _ = strconv.Atoi(g.Gid)
	}
	if gid < 0 {
		return fmt.Errorf("group %q: must be a name or a gid of 0 or more", v)
	}
	f.gid, f.gidSet = gid, true
	return nil
}

func (f socketFlags) options() []server.ListenOption {
	var opts []server.ListenOption
	if f.modeSet {
		opts = append(opts, server.WithSocketMode(f.mode))
	}
	if f.gidSet {
		opts = append(opts, server.WithSocketGroup(f.gid))
	}
	return opts
}

// checkListen refuses flags that do not fit the listen addresses: TCP
// without TLS or --insecure-tcp, socket flags without a unix socket, TLS
// without TCP.
func checkListen(authn *auth.Authenticator, listen string, socket socketFlags, anyUnix, anyTCP bool) error {
	if _, unix := server.UnixPath(listen); unix {
		if authn.ServesTLS() && !anyTCP {
			return fmt.Errorf("--tls-cert: --listen %s is a unix socket, which callers reach without TLS (their uid is their principal)", listen)
		}
		return authn.CheckListen("unix", listen)
	}
	if (socket.modeSet || socket.gidSet) && !anyUnix {
		return fmt.Errorf("--socket-mode and --socket-group apply to a unix socket; --listen %s is TCP", listen)
	}
	return authn.CheckListen("tcp", listen)
}

// serveMetrics serves h over HTTP on addr in the background until the
// returned stop is called. A failure to serve after the start is logged:
// metrics are not worth stopping berthd for.
func serveMetrics(addr string, h http.Handler, log *slog.Logger) (stop func(), err error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-listen: %w", err)
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := hs.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics listener failed", slog.String("listen", addr), slog.Any("error", err))
		}
	}()
	log.Info("metrics serving", slog.String("listen", lis.Addr().String()))
	return func() { hs.Close(); <-done }, nil
}

// defaultDiskBytes is the disk quota of sandboxes whose request sets none,
// when the snapshotter enforces quotas and --default-disk-bytes is not
// given: 10 GiB, as hosted sandboxes commonly get.
const defaultDiskBytes = 10 << 30

// checkLimits rejects capacity and timing flags that have no meaning, before
// server.Config's defaults would quietly replace a zero.
func checkLimits(c server.Config) error {
	for name, d := range map[string]time.Duration{"--connect-budget": c.ConnectBudget, "--busy-retry-delay": c.BusyRetryDelay, "--task-restart-window": c.TaskRestartWindow, "--run-buffer-wait": c.RunBufferWait} {
		if d <= 0 {
			return fmt.Errorf("%s %v: must be positive", name, d)
		}
	}
	if c.DiskOvercommit == 0 || math.IsNaN(c.DiskOvercommit) || (c.DiskOvercommit < 0 && c.DiskOvercommit != -1) {
		return fmt.Errorf("--disk-overcommit %v: must be positive, or -1 for no check", c.DiskOvercommit)
	}
	for name, n := range map[string]int{"--max-sandboxes": c.MaxSandboxes, "--max-execs-per-sandbox": c.MaxExecsPerSandbox, "--max-execs": c.MaxExecs,
		"--max-sandboxes-per-principal": c.MaxSandboxesPerPrincipal} {
		if n < 0 {
			return fmt.Errorf("%s %d: must be 0 (no cap) or more", name, n)
		}
	}
	for name, n := range map[string]int64{"--default-cpu-millis": c.DefaultCPUMillis, "--default-memory-bytes": c.DefaultMemoryBytes} {
		if n == 0 || n < -1 {
			return fmt.Errorf("%s %d: must be positive, or -1 for no cap", name, n)
		}
	}
	for name, n := range map[string]uint64{"--default-pids-limit": c.DefaultPidsLimit, "--default-open-files": c.DefaultOpenFiles, "--max-open-files": c.MaxOpenFiles, "--max-sandbox-open-files": c.MaxSandboxOpenFiles} {
		if n == 0 {
			return fmt.Errorf("%s: must be positive", name)
		}
	}
	if c.DefaultPidsLimit > c.MaxPidsLimit {
		return fmt.Errorf("--default-pids-limit %d exceeds --max-pids-limit %d", c.DefaultPidsLimit, c.MaxPidsLimit)
	}
	if c.DefaultOpenFiles > c.MaxOpenFiles {
		return fmt.Errorf("--default-open-files %d exceeds --max-open-files %d", c.DefaultOpenFiles, c.MaxOpenFiles)
	}
	if c.DefaultPidsLimit*c.DefaultOpenFiles > c.MaxSandboxOpenFiles {
		return fmt.Errorf("--default-pids-limit %d x --default-open-files %d exceeds --max-sandbox-open-files %d: default sandboxes could not be created",
			c.DefaultPidsLimit, c.DefaultOpenFiles, c.MaxSandboxOpenFiles)
	}
	if c.MaxMemoryBytes > 0 && c.DefaultMemoryBytes > 0 && uint64(c.DefaultMemoryBytes) > c.MaxMemoryBytes {
		return fmt.Errorf("--default-memory-bytes %d exceeds --max-memory-bytes %d", c.DefaultMemoryBytes, c.MaxMemoryBytes)
	}
	if c.MaxCPUMillis > 0 && c.DefaultCPUMillis > 0 && uint64(c.DefaultCPUMillis) > c.MaxCPUMillis {
		return fmt.Errorf("--default-cpu-millis %d exceeds --max-cpu-millis %d", c.DefaultCPUMillis, c.MaxCPUMillis)

	}
	if c.MaxDiskBytes > 0 && c.DefaultDiskBytes > c.MaxDiskBytes {
		return fmt.Errorf("--default-disk-bytes %d exceeds --max-disk-bytes %d", c.DefaultDiskBytes, c.MaxDiskBytes)
	}
	if c.TaskRestartLimit < 0 {
		return fmt.Errorf("--task-restart-limit %d: must be 0 (never restart) or more", c.TaskRestartLimit)
	}
	return nil
}

// parseWarmPool parses "IMAGE=N" with N from 1 to 64.
func parseWarmPool(v string) (string, int, error) {
	i := strings.LastIndex(v, "=")
	if i <= 0 {
		return "", 0, fmt.Errorf("%q is not IMAGE=N", v)
	}
	n, err := strconv.Atoi(v[i+1:])
	if err != nil || n < 1 || n > 64 {
		return "", 0, fmt.Errorf("%q: N must be a number from 1 to 64", v)
	}
	return v[:i], n, nil
}
