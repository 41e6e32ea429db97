// Package metrics is berthd's Prometheus instrumentation: the gRPC server's
// per-RPC metrics (go-grpc-middleware's prometheus provider), berth's own
// counters and histograms, gauges read from the service when scraped, and
// the HTTP handler that serves them, and pprof when asked, on a listener of
// their own (berthd --metrics-listen, --pprof).
//
// Handlers report through the methods of *Metrics (server.Observer is the
// interface they see); a nil *Metrics records nothing, so that a berthd
// without --metrics-listen pays nothing.
package metrics

import (
	"context"
	"net/http"
	"net/http/pprof"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
)

// namespace prefixes every berth metric: berth_sandboxes, berth_execs_...
const namespace = "berth"

// Exec outcomes, the outcome label of berth_execs_ended_total.
const (
	OutcomeSuccess         = "success"          // exit code 0
	OutcomeFailure         = "failure"          // exited with another code
	OutcomeSignaled        = "signaled"         // killed by a signal (not a timeout or an OOM kill)
	OutcomeTimedOut        = "timed_out"        // killed at its timeout
	OutcomeOOMKilled       = "oom_killed"       // killed by the kernel's OOM killer
	OutcomeRuntimeReplaced = "runtime_replaced" // the sandbox's task died under it
	OutcomeLost            = "lost"             // berthd stopped following it (restart, deleted sandbox)
)

// Snapshot is the state the gauges show, read from the service at each
// scrape.
type Snapshot struct {
	// Sandboxes counts sandboxes by state, one of SandboxStates.
	// Warm-pool members are counted under "pooled", not in the others.
	Sandboxes map[string]int
	// WarmPoolReady is the number of ready warm-pool sandboxes by image.
	WarmPoolReady map[string]int
	// Capacity is what is in use of each admission limit (resource:
	// "sandboxes", "server_execs", "memory_bytes", "disk_bytes") and the limit (0: none).
	Capacity []Capacity
}

// Capacity is one admission resource.
type Capacity struct {
	Resource string
	InUse    uint64
	Limit    uint64 // 0: no limit
}

// Source is what the gauges read: the service.
type Source interface {
	// MetricsSnapshot returns the state now; ctx bounds the reads (a
	// scrape's timeout).
	MetricsSnapshot(ctx context.Context) (Snapshot, error)
}

// Metrics holds berthd's collectors in a registry of its own.
type Metrics struct {
	reg  *prometheus.Registry
	grpc *grpcprom.ServerMetrics

	createSeconds *prometheus.HistogramVec
	execsStarted  prometheus.Counter
	execsEnded    *prometheus.CounterVec
	outputBytes   *prometheus.CounterVec
	droppedBytes  prometheus.Counter
	fileBytes     *prometheus.CounterVec
	directReads   prometheus.Counter
	agentRestarts prometheus.Counter
	errors        *prometheus.CounterVec
}

// New returns berthd's collectors, registered with the Go runtime and
// process collectors in a new registry. Call SetSource before serving.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		grpc: grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(
			grpcprom.WithHistogramBuckets([]float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}))),
		createSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "sandbox_create_seconds",
			Help:    "Time from CreateSandbox's admission to its answer for a new sandbox, in seconds; source is cold (a new container) or warm (from the warm pool).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"source"}),
		execsStarted: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "execs_started_total",
			Help: "Execs started (ExecStarted came back from the agent for a new exec id), Exec streams and Run calls.",
		}),
		execsEnded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "execs_ended_total",
			Help: "Execs started by this berthd that ended, by outcome: success, failure, signaled, timed_out, oom_killed, runtime_replaced, lost.",
		}, []string{"outcome"}),
		outputBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "exec_output_bytes_total",
			Help: "Output bytes sent to callers of Exec and Run, by stream (stdout, stderr); a replay on attach counts again.",
		}, []string{"stream"}),
		droppedBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "exec_dropped_bytes_total",
			Help: "Output bytes that callers were told were lost (ExecDropped.lost_bytes sent on Exec streams).",
		}),
		fileBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "file_bytes_total",
			Help: "File content bytes through FileService, by direction: in (WriteFile, Upload) or out (ReadFile, Download).",
		}, []string{"direction"}),
		directReads: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "file_reads_direct_total",
			Help: "ReadFile calls berthd served from the descriptor the sandbox's agent opened (runc sandboxes), not through the agent's stream.",
		}),
		agentRestarts: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "agent_restarts_total",
			Help: "Sandbox tasks berthd started anew after their agent died.",
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "errors_total",
			Help: "Errors returned to callers, by gRPC code and ErrorInfo reason.",
		}, []string{"code", "reason"}),
	}
	m.reg.MustRegister(m.grpc, m.createSeconds, m.execsStarted, m.execsEnded, m.outputBytes, m.droppedBytes,
		m.fileBytes, m.directReads, m.agentRestarts, m.errors,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, o := range []string{OutcomeSuccess, OutcomeFailure, OutcomeSignaled, OutcomeTimedOut, OutcomeOOMKilled, OutcomeRuntimeReplaced, OutcomeLost} {
		m.execsEnded.WithLabelValues(o)
	}
	for _, s := range []string{"stdout", "stderr"} {
		m.outputBytes.WithLabelValues(s)
	}
	for _, d := range []string{"in", "out"} {
		m.fileBytes.WithLabelValues(d)
	}
	return m
}

// SetSource registers the gauges that read src at each scrape.
func (m *Metrics) SetSource(src Source) {
	m.reg.MustRegister(&stateCollector{src: src})
}

// SetFleetConflicts registers berth_fleet_sandbox_conflicts, a gauge that
// reads n at each scrape: the number of local sandboxes whose id the
// fleet's records place on another node (cluster.Member.Conflicts). Such a
// sandbox keeps running; an operator resolves the conflict.
func (m *Metrics) SetFleetConflicts(n func() int) {
	if m == nil {
		return
	}
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: namespace, Name: "fleet_sandbox_conflicts",
		Help: "Local sandboxes whose id the fleet's records place on another node, as the node's last registration found them; they keep running until an operator deletes one of the two.",
	}, func() float64 { return float64(n()) }))
}

// Registry returns the registry, for tests and extra collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// ServerOptions returns the gRPC server options that count RPCs: started,
// handled by code, messages and handling time per method
// (grpc_server_*). Pass them to server.NewGRPCServer, then call
// InitializeGRPC with the server so every method shows zeros from the
// start.
func (m *Metrics) ServerOptions() []grpc.ServerOption {
	if m == nil {
		return nil
	}
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(m.grpc.UnaryServerInterceptor(), func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			resp, err := handler(ctx, req)
			m.failed(err)
			return resp, err
		}),
		grpc.ChainStreamInterceptor(m.grpc.StreamServerInterceptor(), func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			err := handler(srv, ss)
			m.failed(err)
			return err
		}),
	}
}

// failed counts an error returned to a caller by its code and ErrorInfo
// reason (empty when it has none, as for errors of the gRPC library).
func (m *Metrics) failed(err error) {
	if err != nil {
		m.errors.WithLabelValues(status.Code(err).String(), rpcstatus.Reason(err)).Inc()
	}
}

// InitializeGRPC sets every method of srv to zero in the RPC metrics.
func (m *Metrics) InitializeGRPC(srv *grpc.Server) {
	if m != nil {
		m.grpc.InitializeMetrics(srv)
	}
}

// Handler serves /metrics (Prometheus text or OpenMetrics) and, with
// profiles, Go's profiles under /debug/pprof/ (net/http/pprof); without,
// /debug/pprof/ is 404. The profiles need no credentials and show the
// process's command line (/debug/pprof/cmdline: file paths of its token
// file and TLS key), its stacks and heap: whoever reaches the listener
// sees them.
func (m *Metrics) Handler(profiles bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{EnableOpenMetrics: true, Timeout: 10 * time.Second}))
	if !profiles {
		return mux
	}
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// SandboxCreated records a successful create that took d; warm says it came
// from the warm pool.
func (m *Metrics) SandboxCreated(warm bool, d time.Duration) {
	if m == nil {
		return
	}
	source := "cold"
	if warm {
		source = "warm"
	}
	m.createSeconds.WithLabelValues(source).Observe(d.Seconds())
}

// ExecStarted records a new exec.
func (m *Metrics) ExecStarted() {
	if m != nil {
		m.execsStarted.Inc()
	}
}

// ExecEnded records the end of an exec started through this berthd, with
// one of the Outcome constants.
func (m *Metrics) ExecEnded(outcome string) {
	if m != nil {
		m.execsEnded.WithLabelValues(outcome).Inc()
	}
}

// OutputSent records n output bytes of stream ("stdout" or "stderr") sent
// to a caller.
func (m *Metrics) OutputSent(stream string, n int) {
	if m != nil && n > 0 {
		m.outputBytes.WithLabelValues(stream).Add(float64(n))
	}
}

// OutputDropped records lost output bytes reported to a caller.
func (m *Metrics) OutputDropped(n uint64) {
	if m != nil && n > 0 {
		m.droppedBytes.Add(float64(n))
	}
}

// FileBytes records n file content bytes moved in direction "in" (into the
// sandbox) or "out".
func (m *Metrics) FileBytes(direction string, n int) {
	if m != nil && n > 0 {
		m.fileBytes.WithLabelValues(direction).Add(float64(n))
	}
}

// FileReadDirect records a ReadFile served from the agent's descriptor.
func (m *Metrics) FileReadDirect() {
	if m != nil {
		m.directReads.Inc()
	}
}

// AgentRestarted records a sandbox task started anew.
func (m *Metrics) AgentRestarted() {
	if m != nil {
		m.agentRestarts.Inc()
	}
}
