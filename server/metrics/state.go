package metrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// SandboxStates are the states berth_sandboxes counts (besides "pooled"),
// each a SandboxState's name in lower case; a scrape shows every one, 0
// included.
var SandboxStates = []string{"starting", "running", "paused", "hibernated", "stopping", "stopped"}

var (
	sandboxesDesc = prometheus.NewDesc(namespace+"_sandboxes", "Sandboxes by state (starting, running, paused, hibernated, stopping, stopped; warm-pool members as pooled).", []string{"state"}, nil)
	warmPoolDesc  = prometheus.NewDesc(namespace+"_warm_pool_ready", "Ready warm-pool sandboxes by image.", []string{"image"}, nil)
	inUseDesc     = prometheus.NewDesc(namespace+"_capacity_in_use", "What is in use of each admission limit: sandboxes, server_execs (execs running), memory_bytes (memory promised), disk_bytes (disk quotas promised), run_output_bytes (output buffers reserved by Runs in progress).", []string{"resource"}, nil)
	limitDesc     = prometheus.NewDesc(namespace+"_capacity_limit", "Each admission limit; 0 is none.", []string{"resource"}, nil)
	scrapeErrDesc = prometheus.NewDesc(namespace+"_state_scrape_error", "1 when the state gauges could not be read at this scrape (see berthd's log), else 0.", nil, nil)
)

// stateCollector reads the gauges from the service at each scrape: the
// values live in containerd and in berthd's own tables, so copying them into
// gauges as they change would be a second bookkeeping to keep right.
type stateCollector struct {
	src Source
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{sandboxesDesc, warmPoolDesc, inUseDesc, limitDesc, scrapeErrDesc} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	snap, err := c.src.MetricsSnapshot(ctx)
	failed := 0.0
	if err != nil {
		failed = 1
	}
	ch <- prometheus.MustNewConstMetric(scrapeErrDesc, prometheus.GaugeValue, failed)
	for _, state := range append(SandboxStates, "pooled") {
		if err == nil || snap.Sandboxes != nil {
			ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(snap.Sandboxes[state]), state)
		}
	}
	for image, n := range snap.WarmPoolReady {
		ch <- prometheus.MustNewConstMetric(warmPoolDesc, prometheus.GaugeValue, float64(n), image)
	}
	for _, r := range snap.Capacity {
		ch <- prometheus.MustNewConstMetric(inUseDesc, prometheus.GaugeValue, float64(r.InUse), r.Resource)
		ch <- prometheus.MustNewConstMetric(limitDesc, prometheus.GaugeValue, float64(r.Limit), r.Resource)
	}
}
