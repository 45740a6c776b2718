package kube

import (
	"context"
	"fmt"
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

// Served reads, through the API server's pod proxy, how many requests every workload pod
// of the app has served, from the pod itself (workload.ServedPath on its service port):
// the request-mix check's counts, as the local runner reads them on loopback. A pod
// that cannot be read is left out and named in the error: under strict mTLS a meshed
// pod refuses the API server's plaintext request, as it refuses any caller's.
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
	path := fmt.Sprintf("/api/v1/namespaces/%s/pods/%s:%d/proxy%s", namespace, pod, port, workload.ServedPath)
	res := c.client.CoreV1().RESTClient().Get().
		Namespace(namespace).Resource("pods").Name(pod + ":" + strconv.Itoa(port)).SubResource("proxy").
		Suffix(strings.Split(strings.TrimPrefix(workload.ServedPath, "/"), "/")...).
		Do(ctx)
	body, err := res.Raw()
	if err != nil {
		msg := err.Error()
		var code int
		if res.StatusCode(&code); code != 0 && len(body) > 0 {
			msg = fmt.Sprintf("HTTP %d: %s", code, firstLine(body))
		}
		return 0, fmt.Errorf("pod %s: GET %s: %s", pod, path, strings.Join(strings.Fields(msg), " "))
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(body)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("pod %s: GET %s: not a count: %.80q", pod, path, body)
	}
	return n, nil
}

// servedTimeout bounds one round of reading every pod's count.
const servedTimeout = 5 * time.Second
