package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/meshmark/meshmark/internal/substrate"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Resources on a cluster come from each node's kubelet: its resource metrics endpoint,
// /metrics/resource, read through the API server's node proxy, so that no port of a node
// need be reachable from where meshmark runs, and the right to read it is one RBAC rule
// (get nodes/proxy). It reports, per container, the CPU time used since the container
// started and its memory working set, the figure the kubelet itself evicts by.
const (
	metricContainerCPU    = "container_cpu_usage_seconds_total"
	metricContainerMemory = "container_memory_working_set_bytes"
)

// gatewayAPILabel marks the pods of a Gateway API Gateway's deployment, whichever
// mesh's controller made it (Istio's waypoints and ingress gateways among them).
const gatewayAPILabel = "gateway.networking.k8s.io/gateway-name"

// ResourceScope is which containers of the cluster a mesh's trials account for, and how
// to tell what each is for.
type ResourceScope struct {
	Mesh string
	// App is the namespace of the workload and its load generators.
	App string
	// MeshNamespaces are where the mesh installed itself (istio-system). A DaemonSet's pod
	// there that carries traffic for every pod of its node (ztunnel, the Cilium agent) is
	// a node proxy (see NodeProxies); any other pod there is the mesh's control plane.
	MeshNamespaces []string
	// MeshPodLabels, when set, are labels every pod of the mesh carries: a pod of the
	// mesh's namespaces without them is the cluster's own (Cilium installs into
	// kube-system, beside kube-proxy and CoreDNS) and is left out.
	MeshPodLabels map[string]string
	// Sidecars are the containers meshes inject beside an application's: the mesh's
	// own and every other known mesh's (mesh.KnownClusterMarks), by the names their
	// injectors give them.
	Sidecars []string
	// GatewayPodLabels mark the pods of a mesh's own gateways (Istio's classic ingress
	// gateway), beside the Gateway API's label every gateway carries; a value "" matches
	// any value.
	GatewayPodLabels map[string]string
	// NodeProxies, when set, are the labels of the mesh's node proxies (ztunnel): a
	// DaemonSet's pod in the mesh's namespaces that has none of them is a node agent
	// (istio-cni's), counted with the control plane, not the data plane.
	NodeProxies []map[string]string
}

// Namespaces are the namespaces whose pods the scope covers.
func (s ResourceScope) Namespaces() []string {
	out := []string{s.App}
	for _, ns := range s.MeshNamespaces {
		if !slices.Contains(out, ns) {
			out = append(out, ns)
		}
	}
	return out
}

// RoleOf says what a container of pod is for, and false when the pod is outside the
// scope (another tenant's, the cluster's own).
func (s ResourceScope) RoleOf(pod *corev1.Pod, container string) (substrate.Role, bool) {
	if _, ok := pod.Labels[gatewayAPILabel]; ok {
		return substrate.RoleGateway, true
	}
	for k, v := range s.GatewayPodLabels {
		if got, ok := pod.Labels[k]; ok && (v == "" || got == v) {
			return substrate.RoleGateway, true
		}
	}
	switch {
	case pod.Namespace == s.App:
		switch {
		case slices.Contains(s.Sidecars, container):
			return substrate.RoleSidecar, true
		case pod.Labels[RoleLabel] == roleGenerator:
			return substrate.RoleLoadGen, true
		case pod.Labels[RoleLabel] == roleGateway:
			return substrate.RoleGateway, true
		}
		return substrate.RoleWorkload, true
	case slices.Contains(s.MeshNamespaces, pod.Namespace):
		if !labels.SelectorFromSet(s.MeshPodLabels).Matches(labels.Set(pod.Labels)) {
			return "", false
		}
		for _, o := range pod.OwnerReferences {
			if o.Kind != "DaemonSet" {
				continue
			}
			if len(s.NodeProxies) == 0 || slices.ContainsFunc(s.NodeProxies, func(l map[string]string) bool {
				return labels.SelectorFromSet(l).Matches(labels.Set(pod.Labels))
			}) {
				return substrate.RoleNodeProxy, true
			}
		}
		return substrate.RoleControlPlane, true
	}
	return "", false
}

// AddMesh adds a mesh install's namespaces to the scope.
func (s *ResourceScope) AddMesh(mi *MeshInstall) {
	if mi == nil {
		return
	}
	for _, r := range mi.Releases {
		if ns := r.Chart.Namespace; ns != "" && ns != s.App && !slices.Contains(s.MeshNamespaces, ns) {
			s.MeshNamespaces = append(s.MeshNamespaces, ns)
		}
	}
}

// ContainerSample is one kubelet reading of one container.
type ContainerSample struct {
	Node, Namespace, Pod, Container string
	Role                            substrate.Role
	// T is when the kubelet took the reading, when its samples say so, else the middle
	// of the request that read it.
	T time.Time
	// CPUSeconds is cumulative since the container started.
	CPUSeconds      float64
	WorkingSetBytes uint64
}

// UnreadNode is a node whose resource metrics could not be read in some rounds: its
// containers are missing from those rounds, not zero.
type UnreadNode struct {
	Node   string
	Failed int // rounds in which it could not be read, of Rounds
	Rounds int
	// Err is the last failure, in the API server's words.
	Err string
}

func (u UnreadNode) String() string {
	return fmt.Sprintf("node %s: resource metrics unreadable in %d of %d rounds (%s)", u.Node, u.Failed, u.Rounds, u.Err)
}

// ResourceReadings is everything a ResourceSampler read.
type ResourceReadings struct {
	Rounds  int
	Samples []ContainerSample
	// Unread lists the nodes that failed at least once, by name; ListErr is the last
	// failure to list the scope's pods, which leaves a whole round out.
	Unread  []UnreadNode
	ListErr string
}

// ResourceSampler reads the kubelets' resource metrics of every node that hosts a pod of
// its scope, every interval, until Stop.
type ResourceSampler struct {
	c        *Cluster
	scope    ResourceScope
	interval time.Duration
	// onRound, when set, is given each round's readings as they are taken (live
	// metrics), on the sampling goroutine.
	onRound func([]ContainerSample)
	cancel  context.CancelFunc
	done    chan struct{}

	mu     sync.Mutex
	out    ResourceReadings
	unread map[string]*UnreadNode
	// answered counts each node's readable rounds; listing, the nodes that listed a
	// container of the scope at least once.
	answered map[string]int
	listing  map[string]bool
	// last is the kubelet's timestamp of each container's latest sample: a kubelet
	// refreshes its figures every few seconds, and a reading it has already given adds
	// nothing but a flat interval.
	last map[[3]string]time.Time
}

// SampleResources starts reading the scope's containers' CPU and memory every interval
// (a first round at once), until Stop, giving each round's readings to onRound if set.
func (c *Cluster) SampleResources(ctx context.Context, scope ResourceScope, interval time.Duration, onRound func([]ContainerSample)) *ResourceSampler {
	sctx, cancel := context.WithCancel(ctx)
	s := &ResourceSampler{c: c, scope: scope, interval: interval, onRound: onRound, cancel: cancel, done: make(chan struct{}),
		unread: map[string]*UnreadNode{}, last: map[[3]string]time.Time{}, answered: map[string]int{}, listing: map[string]bool{}}
	go s.run(ctx, sctx)
	return s
}

// Stop takes a last round, closing the final interval, and returns every reading.
func (s *ResourceSampler) Stop() ResourceReadings {
	s.cancel()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.out
	out.Samples = slices.Clone(out.Samples)
	for node, n := range s.answered {
		if !s.listing[node] {
			u := s.unread[node]
			if u == nil {
				u = &UnreadNode{Node: node, Err: fmt.Sprintf("it answered, but never listed a container of the trial's pods (%s, %s)", metricContainerCPU, metricContainerMemory)}
				s.unread[node] = u
			}
			u.Failed += n
		}
	}
	for _, u := range s.unread {
		u.Rounds = out.Rounds
		out.Unread = append(out.Unread, *u)
	}
	sort.Slice(out.Unread, func(i, j int) bool { return out.Unread[i].Node < out.Unread[j].Node })
	return out
}

// run samples under ctx until Stop cancels sctx; an interrupted trial (ctx done) stores
// nothing, so it takes no closing round.
func (s *ResourceSampler) run(ctx, sctx context.Context) {
	defer close(s.done)
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		s.round(sctx)
		select {
		case <-sctx.Done():
			if ctx.Err() != nil {
				return
			}
			last, cancel := context.WithTimeout(ctx, 10*time.Second)
			s.round(last)
			cancel()
			return
		case <-t.C:
		}
	}
}

// round lists the scope's pods, reads every node that hosts one, in parallel, and keeps
// the samples of the scope's containers.
func (s *ResourceSampler) round(ctx context.Context) {
	pods := map[[2]string]*corev1.Pod{}
	nodes := map[string]bool{}
	for _, ns := range s.scope.Namespaces() {
		list, err := s.c.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if ctx.Err() != nil {
			return // stopped mid-round: the closing round stands for it
		}
		if err != nil {
			s.mu.Lock()
			s.out.Rounds++
			s.out.ListErr = fmt.Sprintf("listing the pods of namespace %s: %v", ns, err)
			s.mu.Unlock()
			return
		}
		for i := range list.Items {
			p := &list.Items[i]
			if p.Spec.NodeName == "" {
				continue
			}
			pods[[2]string{p.Namespace, p.Name}] = p
			nodes[p.Spec.NodeName] = true
		}
	}
	type result struct {
		node    string
		samples []ContainerSample
		err     error
	}
	results := make(chan result, len(nodes))
	for node := range nodes {
		go func() {
			ss, err := s.readNode(ctx, node, pods)
			results <- result{node, ss, err}
		}()
	}
	var got []result
	for range nodes {
		got = append(got, <-results)
	}
	if ctx.Err() != nil {
		return
	}
	if s.onRound != nil {
		var read []ContainerSample
		for _, r := range got {
			read = append(read, r.samples...)
		}
		s.onRound(read)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.out.Rounds++
	for _, r := range got {
		if r.err != nil {
			u := s.unread[r.node]
			if u == nil {
				u = &UnreadNode{Node: r.node}
				s.unread[r.node] = u
			}
			u.Failed++
			u.Err = r.err.Error()
			continue
		}
		s.answered[r.node]++
		s.listing[r.node] = s.listing[r.node] || len(r.samples) > 0
		for _, cs := range r.samples {
			k := [3]string{cs.Namespace, cs.Pod, cs.Container}
			if prev, ok := s.last[k]; ok && !cs.T.After(prev) {
				continue
			}
			s.last[k] = cs.T
			s.out.Samples = append(s.out.Samples, cs)
		}
	}
}

// readNode reads one node's kubelet resource metrics through the API server and keeps
// the containers of pods.
func (s *ResourceSampler) readNode(ctx context.Context, node string, pods map[[2]string]*corev1.Pod) ([]ContainerSample, error) {
	rctx, cancel := context.WithTimeout(ctx, max(s.interval, 5*time.Second))
	defer cancel()
	start := time.Now()
	res := s.c.client.CoreV1().RESTClient().Get().
		Resource("nodes").Name(node).SubResource("proxy").Suffix("metrics", "resource").
		// Prometheus text first; */* too, since a server that names no type it produces
		// (kwok's go-restful routes) refuses an Accept that lacks it.
		SetHeader("Accept", "text/plain;version=0.0.4,*/*;q=0.1").
		Do(rctx)
	readAt := start.Add(time.Since(start) / 2)
	body, err := res.Raw()
	if err != nil {
		// What the kubelet or the proxy answered says more than client-go's reading of
		// a status it does not know; and a warning is one line.
		msg := err.Error()
		var code int
		if res.StatusCode(&code); code != 0 && len(body) > 0 {
			msg = fmt.Sprintf("HTTP %d: %s", code, firstLine(body))
		}
		return nil, fmt.Errorf("GET /api/v1/nodes/%s/proxy/metrics/resource: %s", node, strings.Join(strings.Fields(msg), " "))
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("node %s's /metrics/resource is not Prometheus text: %w", node, err)
	}
	// A kubelet lists a container once it has its stats (kwok, from its second read), so
	// one reading without it is no failure; a node that never lists any is, at Stop.
	cpu, mem := families[metricContainerCPU], families[metricContainerMemory]
	byContainer := map[[3]string]*ContainerSample{}
	var order [][3]string
	take := func(f *dto.MetricFamily, set func(*ContainerSample, float64)) {
		if f == nil {
			return
		}
		for _, m := range f.GetMetric() {
			ns, pod, container := label(m, "namespace"), label(m, "pod"), label(m, "container")
			p := pods[[2]string{ns, pod}]
			if p == nil || container == "" {
				continue
			}
			role, ok := s.scope.RoleOf(p, container)
			if !ok {
				continue
			}
			k := [3]string{ns, pod, container}
			cs := byContainer[k]
			if cs == nil {
				cs = &ContainerSample{Node: node, Namespace: ns, Pod: pod, Container: container, Role: role, T: readAt}
				byContainer[k] = cs
				order = append(order, k)
			}
			if ms := m.GetTimestampMs(); ms > 0 {
				cs.T = time.UnixMilli(ms)
			}
			set(cs, value(m))
		}
	}
	// CPU last, so that its timestamp is the sample's: rates are taken from it.
	take(mem, func(cs *ContainerSample, v float64) { cs.WorkingSetBytes = uint64(max(v, 0)) })
	take(cpu, func(cs *ContainerSample, v float64) { cs.CPUSeconds = v })
	out := make([]ContainerSample, 0, len(order))
	for _, k := range order {
		out = append(out, *byContainer[k])
	}
	return out, nil
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func value(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	}
	return m.GetUntyped().GetValue()
}

// firstLine is the gist of an error body, for a one-line message: the message of the
// API server's Status, else the body's first line.
func firstLine(b []byte) string {
	var status metav1.Status
	if json.Unmarshal(b, &status) == nil && status.Message != "" {
		return status.Message
	}
	line, _, _ := bytes.Cut(bytes.TrimSpace(b), []byte("\n"))
	if len(line) > 200 {
		line = line[:200]
	}
	return string(line)
}
