package kube

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Proxy counters on a cluster come from the mesh's own metrics endpoints on the proxies'
// pods, read through the API server's pod proxy
// (/api/v1/namespaces/NS/pods/NAME:PORT/proxy/PATH): as for the kubelets, no pod need be
// reachable from where meshmark runs, and the right to read them is one RBAC rule (get
// pods/proxy).
const (
	// proxyReadTimeout bounds one read: a proxy that hangs is noted as unreadable,
	// while the others are read.
	proxyReadTimeout = 10 * time.Second
	// proxyReadsAtOnce keeps a large app from opening a connection per pod at once
	// through the API server.
	proxyReadsAtOnce = 16
)

// proxyTarget is one proxy to read: its pod, and what it is stored as.
type proxyTarget struct {
	ep   *meshkube.ProxyEndpoint
	pod  *corev1.Pod
	name string // the pod for a sidecar, the node for a node proxy
	of   meshkube.ProxyScrape
}

// ReadProxyCounters reads, now, every proxy of the app that endpoints describe: the
// sidecar of every pod of the app's namespace that carries one, the mesh's own proxy
// pods there (a waypoint), and the node proxies on the nodes that host the app's pods. A proxy that cannot be read, or pods that cannot
// be listed, are returned with Err set in the API server's words, never dropped, so that
// a trial says which proxy it lacks.
func (c *Cluster) ReadProxyCounters(ctx context.Context, app *App, endpoints []meshkube.ProxyEndpoint, services []string) []meshkube.ProxyCounters {
	if len(endpoints) == 0 {
		return nil
	}
	var out []meshkube.ProxyCounters
	failed := func(ep *meshkube.ProxyEndpoint, where string, err error) {
		out = append(out, meshkube.ProxyCounters{Component: ep.Component, Pod: where, Time: time.Now(), Err: err})
	}
	appPods, err := c.appPods(ctx, app)
	if err != nil {
		for i := range endpoints {
			failed(&endpoints[i], "namespace "+app.Namespace, fmt.Errorf("listing its pods: %w", err))
		}
		return out
	}
	nodes := map[string]bool{}
	for _, p := range appPods {
		if p.Spec.NodeName != "" {
			nodes[p.Spec.NodeName] = true
		}
	}
	var targets []proxyTarget
	for i := range endpoints {
		ep := &endpoints[i]
		switch {
		case ep.Container != "":
			for j := range appPods {
				p := &appPods[j]
				if hasSidecar(p.Spec, ep.Container) {
					targets = append(targets, proxyTarget{ep: ep, pod: p, name: p.Name,
						of: meshkube.ProxyScrape{Service: p.Labels["app"], Namespace: app.Namespace, Services: services}})
				}
			}
		case len(ep.AppLabels) > 0:
			sel := labels.SelectorFromSet(ep.AppLabels).String()
			list, err := c.client.CoreV1().Pods(app.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
			if err != nil {
				failed(ep, "namespace "+app.Namespace, fmt.Errorf("listing its %s pods: %w", ep.Component, err))
				continue
			}
			found := 0
			for j := range list.Items {
				if p := &list.Items[j]; p.DeletionTimestamp == nil {
					found++
					targets = append(targets, proxyTarget{ep: ep, pod: p, name: p.Name,
						of: meshkube.ProxyScrape{Namespace: app.Namespace, Services: services}})
				}
			}
			// The mesh puts this proxy beside the app: without it no proxy counted the
			// traffic it carries, which is said, not left out.
			if found == 0 {
				failed(ep, "namespace "+app.Namespace, fmt.Errorf("no %s pod (labels %s) in the namespace", ep.Component, sel))
			}
		case ep.Namespace != "":
			list, err := c.client.CoreV1().Pods(ep.Namespace).List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(ep.Labels).String()})
			if err != nil {
				failed(ep, "namespace "+ep.Namespace, fmt.Errorf("listing its %s pods: %w", ep.Component, err))
				continue
			}
			onNode := map[string]bool{}
			for j := range list.Items {
				p := &list.Items[j]
				if p.DeletionTimestamp != nil || !nodes[p.Spec.NodeName] {
					continue
				}
				onNode[p.Spec.NodeName] = true
				targets = append(targets, proxyTarget{ep: ep, pod: p, name: p.Spec.NodeName,
					of: meshkube.ProxyScrape{Namespace: app.Namespace, Services: services}})
			}
			// A node of the app without its node proxy is a node whose traffic no proxy
			// counted: said, not left out.
			for _, n := range slices.Sorted(maps.Keys(nodes)) {
				if !onNode[n] {
					failed(ep, n, fmt.Errorf("no %s pod (namespace %s, labels %s) on the node", ep.Component, ep.Namespace, labels.SelectorFromSet(ep.Labels)))
				}
			}
		}
	}
	read := make([]meshkube.ProxyCounters, len(targets))
	sem := make(chan struct{}, proxyReadsAtOnce)
	var wg sync.WaitGroup
	for i, tg := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			read[i] = c.readProxy(ctx, tg)
		}()
	}
	wg.Wait()
	out = append(out, read...)
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Component != out[j].Component {
			return out[i].Component < out[j].Component
		}
		return out[i].Pod < out[j].Pod
	})
	return out
}

// readProxy reads one proxy's endpoint through the API server and parses it.
func (c *Cluster) readProxy(ctx context.Context, tg proxyTarget) meshkube.ProxyCounters {
	ep, p := tg.ep, tg.pod
	path := fmt.Sprintf("/api/v1/namespaces/%s/pods/%s:%d/proxy%s", p.Namespace, p.Name, ep.Port, ep.Path)
	pc := meshkube.ProxyCounters{Component: ep.Component, Pod: tg.name, Time: time.Now()}
	if p.Status.PodIP == "" {
		// The API server would say the same less plainly.
		pc.Err = fmt.Errorf("pod %s has no IP yet (phase %s)", p.Name, p.Status.Phase)
		return pc
	}
	rctx, cancel := context.WithTimeout(ctx, proxyReadTimeout)
	defer cancel()
	start := time.Now()
	res := c.client.CoreV1().RESTClient().Get().
		Namespace(p.Namespace).Resource("pods").Name(p.Name+":"+strconv.Itoa(ep.Port)).SubResource("proxy").
		Suffix(strings.Split(strings.TrimPrefix(ep.Path, "/"), "/")...).
		SetHeader("Accept", "text/plain;version=0.0.4,*/*;q=0.1").
		Do(rctx)
	pc.Time = start.Add(time.Since(start) / 2)
	body, err := res.Raw()
	if err != nil {
		msg := err.Error()
		var code int
		if res.StatusCode(&code); code != 0 && len(body) > 0 {
			msg = fmt.Sprintf("HTTP %d: %s", code, firstLine(body))
		}
		pc.Err = fmt.Errorf("pod %s: GET %s: %s", p.Name, path, strings.Join(strings.Fields(msg), " "))
		return pc
	}
	got, err := ep.Read(bytes.NewReader(body), tg.of)
	if err != nil {
		pc.Err = fmt.Errorf("pod %s: GET %s: %w", p.Name, path, err)
		return pc
	}
	got.Component, got.Pod, got.Time = pc.Component, pc.Pod, pc.Time
	return got
}
