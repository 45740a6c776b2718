package kube

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/meshmark/meshmark/internal/workload"
)

// PodServed is how many requests one workload pod says it has served
// (workload.ServedPath), with the service version it plays.
type PodServed struct {
	Pod, Service, Version string
	Served                int64
}

// Served reads how many requests every workload pod of the app has served, from the pod
// itself (workload.ServedPath on its service port): the request-mix check's counts, as
// the local runner reads them on loopback. Each read goes through a port-forward, which
// the kubelet's runtime opens on the pod's own loopback: no mesh intercepts that (Istio's
// and Linkerd's rules leave loopback alone, ambient redirects only what reaches the
// pod's address), so a pod under strict mTLS answers too, where the API server's pod
// proxy, a plaintext caller from outside, would be refused. A pod that cannot be read is
// left out and named in the error.
func (c *Cluster) Served(ctx context.Context, app *App) ([]PodServed, error) {
	pods, err := c.appPods(ctx, app)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, servedTimeout)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	var out []PodServed
	var errs []string
	sem := make(chan struct{}, 8)
	for _, p := range pods {
		if p.Labels["app"] == "" || p.Labels[RoleLabel] != "" {
			continue // a load generator's, or a probe's: serves no service
		}
		port := 0
		for _, ctr := range p.Spec.Containers {
			for _, cp := range ctr.Ports {
				if cp.Name == "app" {
					port = int(cp.ContainerPort)
				}
			}
		}
		ps := PodServed{Pod: p.Name, Service: p.Labels["app"], Version: p.Labels["version"]}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			n, err := c.readServed(ctx, app.Namespace, ps.Pod, port)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err.Error())
				return
			}
			ps.Served = n
			out = append(out, ps)
		}()
	}
	wg.Wait()
	sort.Slice(out, func(i, j int) bool { return out[i].Pod < out[j].Pod })
	if len(errs) > 0 {
		sort.Strings(errs)
		return out, fmt.Errorf("reading what the pods served: %s", strings.Join(errs, "; "))
	}
	return out, nil
}

func (c *Cluster) readServed(ctx context.Context, namespace, pod string, port int) (int64, error) {
	if port == 0 {
		return 0, fmt.Errorf("pod %s: no container port named app", pod)
	}
	f := &Forwards{errs: make(chan error, 1)}
	addr, err := c.forward(ctx, f, namespace, pod, port)
	if err != nil {
		return 0, fmt.Errorf("pod %s: port-forward to port %d: %w", pod, port, err)
	}
	defer f.Close()
	url := "http://" + addr + workload.ServedPath
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := servedClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("pod %s: GET %s on its port %d: %w", pod, workload.ServedPath, port, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return 0, fmt.Errorf("pod %s: GET %s on its port %d: %w", pod, workload.ServedPath, port, err)
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("pod %s: GET %s on its port %d: HTTP %d: %s", pod, workload.ServedPath, port, resp.StatusCode, firstLine(body))
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(body)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("pod %s: GET %s on its port %d: not a count: %.80q", pod, workload.ServedPath, port, body)
	}
	return n, nil
}

// servedClient opens a connection per read: each goes through a port-forward of its own.
var servedClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// servedTimeout bounds one round of reading every pod's count.
const servedTimeout = 5 * time.Second
