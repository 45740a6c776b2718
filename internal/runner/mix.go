package runner

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/topology"
	"github.com/meshmark/meshmark/internal/workload"
)

// Request-mix check. Meshes are only comparable when the same requests take the same
// paths through the graph: with kube-proxy-style balancing (the testbed's service VIPs
// pick an endpoint per connection) and callers that keep connections alive, which
// version of a service gets traffic is decided once per bring-up, and a deployment may
// send nothing at all to one version while a sidecar mesh splits per request. Each
// workload pod counts the requests it served (workload.ServedPath); the runner reads
// every pod before and after a trial and compares each service's split among its
// versions with the graph's weights.
const (
	// mixTolerance is results.MixTolerance. Binomial noise is far below it at
	// mixMinRequests: for a 1/3 share of 200 requests one standard deviation is 3.3
	// points.
	mixTolerance = results.MixTolerance
	// mixMinRequests is the fewest requests a service must have served in the trial to
	// be judged; fewer say little about its split.
	mixMinRequests = 200
)

// served reads how many requests every workload pod has served, by pod name. A pod
// that does not answer is left out; the error names it.
func (r *runner) served(ctx context.Context, d *deployment) (map[string]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	var errs []string
	out := map[string]int64{}
	sem := make(chan struct{}, 8)
	for _, pod := range d.app.Pods() {
		if pod.Service == "" {
			continue
		}
		wg.Add(1)
		go func(pod topology.Pod) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			n, err := readServed(ctx, d, pod)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Sprintf("%s: %v", pod.Name, err))
				return
			}
			out[pod.Name] = n
		}(pod)
	}
	wg.Wait()
	if len(errs) > 0 {
		sort.Strings(errs)
		return out, fmt.Errorf("reading served requests: %s", strings.Join(errs, "; "))
	}
	return out, nil
}

// readServed asks one pod's service straight on loopback, as the health check does,
// so that no mesh rule is involved and nothing is counted as served.
func readServed(ctx context.Context, d *deployment, pod topology.Pod) (int64, error) {
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return d.tb.DialContext(ctx, pod, network, addr)
		},
		DisableKeepAlives: true,
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d%s", pod.Port, workload.ServedPath), nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64))
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s: %s", workload.ServedPath, resp.Status)
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// servedByVersion is what each version served over a trial, from its pods' counts
// before and after it.
func servedByVersion(d *deployment, before, after map[string]int64) map[Version]int64 {
	byVersion := map[Version]int64{}
	for _, pod := range d.app.Pods() {
		a, ok := after[pod.Name]
		if b, okb := before[pod.Name]; ok && okb && pod.Service != "" {
			byVersion[Version{pod.Service, pod.Version}] += a - b
		}
	}
	return byVersion
}

// mixOf is each multi-version service's split among its versions, from what each
// version served, with the shares the graph's weights intend.
func (r *runner) mixOf(byVersion map[Version]int64) []results.VersionShare {
	var out []results.VersionShare
	for _, svc := range r.graph.Services {
		if len(svc.Versions) < 2 {
			continue // one version: nothing to split
		}
		var total int64
		weights := 0
		for _, v := range svc.Versions {
			total += byVersion[Version{svc.Name, v.Name}]
			weights += v.Weight
		}
		if weights == 0 {
			continue
		}
		for _, v := range svc.Versions {
			n := byVersion[Version{svc.Name, v.Name}]
			vs := results.VersionShare{Service: svc.Name, Version: v.Name, Requests: n, Intended: float64(v.Weight) / float64(weights)}
			if total > 0 {
				vs.Share = float64(n) / float64(total)
			}
			out = append(out, vs)
		}
	}
	return out
}

// mixSkew describes the services whose split is off by more than mixTolerance, or ""
// when every judged service is within it.
func mixSkew(mix []results.VersionShare) string {
	totals := map[string]int64{}
	for _, v := range mix {
		totals[v.Service] += v.Requests
	}
	var off []string
	for _, v := range mix {
		if totals[v.Service] < mixMinRequests || math.Abs(v.Share-v.Intended) <= mixTolerance {
			continue
		}
		off = append(off, fmt.Sprintf("%s %s served %.0f%% of %d requests (intended %.0f%%)",
			v.Service, v.Version, 100*v.Share, totals[v.Service], 100*v.Intended))
	}
	return strings.Join(off, ", ")
}
