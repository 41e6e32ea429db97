package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// metricsURL returns the base URL of the metrics listener of berthd p,
// started with --metrics-listen 127.0.0.1:0, from its "metrics serving" log
// line.
func metricsURL(t *testing.T, p *berthdProc) string {
	t.Helper()
	for _, line := range p.logLines(`"msg":"metrics serving"`) {
		var rec struct{ Listen string }
		if err := json.Unmarshal([]byte(line), &rec); err == nil && rec.Listen != "" {
			return "http://" + rec.Listen
		}
	}
	t.Fatalf("berthd logged no metrics listener:\n%s", p.log)
	return ""
}

// scrape fetches and parses url's /metrics.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return mfs
}

// metricValue returns the value of the sample of family name whose labels
// include labels (a counter, gauge or, for a histogram, its count), and
// whether there is one.
func metricValue(mfs map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	mf, ok := mfs[name]
	if !ok {
		return 0, false
	}
	for _, m := range mf.GetMetric() {
		match := 0
		for _, lp := range m.GetLabel() {
			if v, ok := labels[lp.GetName()]; ok && v == lp.GetValue() {
				match++
			}
		}
		if match != len(labels) {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

// TestMetrics runs berthd with --metrics-listen and a warm pool, creates a
// sandbox cold and one warm, runs execs with known outputs and outcomes,
// moves file bytes, provokes a typed error, and checks every value on
// /metrics, then that pprof answers on the same listener.
func TestMetrics(t *testing.T) {
	need(t)
	rt, ns, stateDir := newNamespaceRuntime(t, "metrics")
	e := &berthEnv{ns: ns, stateDir: stateDir, rt: rt, sock: env.dir + "/metrics.sock"}
	p := startBerthd(t, e, "--metrics-listen", "127.0.0.1:0", "--pprof", "--warm-pool", baseImage+"=1")
	e.importBase(t)
	url := metricsURL(t, p)

	c, err := client.Dial(context.Background(), "unix://"+e.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The pool fills in the background: wait for its member (bounded).
	deadline := time.Now().Add(time.Minute)
	for {
		if v, _ := metricValue(scrape(t, url), "berth_warm_pool_ready", map[string]string{"image": baseImage}); v == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the warm pool had no member within a minute; berthd log:\n%s", p.log)
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}

	cold, err := c.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: baseImage, SandboxId: "metrics-cold"})
	if err != nil {
		t.Fatal(err)
	}
	warm, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: baseImage})
	if err != nil {
		t.Fatal(err)
	}
	if !warm.GetFromWarmPool() {
		t.Fatalf("second create was not served from the warm pool")
	}
	res, err := c.Run(ctx, cold.GetId(), &berthv1.ProcessSpec{ShellCommand: "printf hello; printf oops >&2; exit 3"})
	if err != nil {
		t.Fatal(err)
	}
	if res.GetResult().GetExitCode() != 3 {
		t.Fatalf("exit code %d, want 3", res.GetResult().GetExitCode())
	}
	var out bytes.Buffer
	x, err := c.Exec(ctx, cold.GetId(), &berthv1.ProcessSpec{Argv: []string{"cat"}, Stdin: true}, client.WithStdout(&out))
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(x.Stdin(), "0123456789")
	x.Stdin().Close()
	if r, err := x.Wait(); err != nil || r.GetExitCode() != 0 || out.String() != "0123456789" {
		t.Fatalf("cat: %v, %v, %q", r, err, out.String())
	}
	content := strings.Repeat("x", 3000)
	if _, err := c.WriteFile(ctx, cold.GetId(), "/workspace/f", strings.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReadFile(ctx, cold.GetId(), "/workspace/f", io.Discard); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetSandbox(ctx, "metrics-nosuch"); err == nil {
		t.Fatal("GetSandbox of an unknown id succeeded")
	}

	mfs := scrape(t, url)
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"berth_sandboxes", map[string]string{"state": "running"}, 2},
		{"berth_sandbox_create_seconds", map[string]string{"source": "cold"}, 1},
		{"berth_sandbox_create_seconds", map[string]string{"source": "warm"}, 1},
		{"berth_execs_started_total", nil, 2},
		{"berth_execs_ended_total", map[string]string{"outcome": "failure"}, 1},
		{"berth_execs_ended_total", map[string]string{"outcome": "success"}, 1},
		{"berth_exec_output_bytes_total", map[string]string{"stream": "stdout"}, 5 + 10},
		{"berth_exec_output_bytes_total", map[string]string{"stream": "stderr"}, 4},
		{"berth_exec_dropped_bytes_total", nil, 0},
		{"berth_file_bytes_total", map[string]string{"direction": "in"}, 3000},
		{"berth_file_bytes_total", map[string]string{"direction": "out"}, 3000},
		{"berth_agent_restarts_total", nil, 0},
		{"berth_errors_total", map[string]string{"code": "NotFound", "reason": "SANDBOX_NOT_FOUND"}, 1},
		{"berth_capacity_in_use", map[string]string{"resource": "server_execs"}, 0},
		{"berth_capacity_in_use", map[string]string{"resource": "run_output_bytes"}, 0},
		{"berth_capacity_limit", map[string]string{"resource": "run_output_bytes"}, 1 << 30},
		{"grpc_server_handled_total", map[string]string{"grpc_method": "Run", "grpc_code": "OK"}, 1},
		{"grpc_server_handled_total", map[string]string{"grpc_method": "GetSandbox", "grpc_code": "NotFound"}, 1},
	}
	for _, c := range checks {
		got, ok := metricValue(mfs, c.name, c.labels)
		if !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	// The pool refills after the hand-out; with it the namespace holds 3
	// sandboxes or, until it has, 2.
	if got, _ := metricValue(mfs, "berth_capacity_in_use", map[string]string{"resource": "sandboxes"}); got < 2 || got > 3 {
		t.Errorf("berth_capacity_in_use{resource=sandboxes} = %v, want 2 or 3", got)
	}

	resp, err := http.Get(url + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte("goroutine profile")) {
		t.Errorf("GET /debug/pprof/goroutine: %s, %.200q", resp.Status, body)
	}
	// At DEBUG (startBerthd's level) every call has a line with its
	// duration in seconds.
	if lines := p.logLines(`"grpc.method":"Run"`, `"grpc.duration_seconds":`); len(lines) != 1 {
		t.Errorf("berthd logged %d lines for the Run call with grpc.duration_seconds, want 1", len(lines))
	}
}

// TestInfoLogBudget checks the bound: berthd at 500 execs/s writes
// less than 1 KB/s of logs at INFO. It measures the bytes berthd logs at
// INFO per exec (Run and Exec streams, after the sandbox exists) and
// extrapolates to 500 execs/s, which this machine cannot sustain in a test.
func TestInfoLogBudget(t *testing.T) {
	need(t)
	rt, ns, stateDir := newNamespaceRuntime(t, "logbudget")
	e := &berthEnv{ns: ns, stateDir: stateDir, rt: rt, sock: env.dir + "/logbudget.sock"}
	p := startBerthd(t, e, "--log-level", "INFO")
	e.importBase(t)
	c, err := client.Dial(context.Background(), "unix://"+e.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := c.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: baseImage, SandboxId: "logbudget"})
	if err != nil {
		t.Fatal(err)
	}
	// berthd's log arrives through a pipe: the create's own line may come
	// after its answer. Start counting once it is there.
	for deadline := time.Now().Add(30 * time.Second); len(p.logLines(`"msg":"sandbox created"`)) == 0; {
		if time.Now().After(deadline) {
			t.Fatalf("berthd logged no \"sandbox created\":\n%s", p.log)
		}
		time.Sleep(10 * time.Millisecond)
	}
	before := len(p.log.String())
	const n = 100
	for i := range n {
		if i%2 == 0 {
			if _, err := c.Run(ctx, sb.GetId(), &berthv1.ProcessSpec{Argv: []string{"true"}}); err != nil {
				t.Fatal(err)
			}
			continue
		}
		x, err := c.Exec(ctx, sb.GetId(), &berthv1.ProcessSpec{Argv: []string{"echo", "hi"}}, client.WithStdout(io.Discard))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := x.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	logged := len(p.log.String()) - before
	perSecond := float64(logged) / n * 500
	t.Logf("%d execs logged %d bytes at INFO: %.1f B/s at 500 execs/s", n, logged, perSecond)
	if perSecond >= 1000 {
		t.Errorf("berthd logs %.0f B/s at INFO at 500 execs/s, want < 1000; what it logged:\n%s", perSecond, p.log.String()[before:])
	}
}
