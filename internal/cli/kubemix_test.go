package cli

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/substrate/kube"
	"github.com/meshmark/meshmark/internal/substrate/kube/kubetest"
	"github.com/meshmark/meshmark/internal/workload"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// standInWorkload plays the app's workload pods, which kwok runs only on paper: once all
// n workload pods of a namespace run, each is served as its container would run it, by
// a real `meshmark service` server (workload.Server) made from the pod's own arguments,
// on loopback, which the API server's pod proxy reaches at the pod's address
// (kubetest.ReachPodPort) and a port-forward to the pod reaches too
// (kubetest.ForwardPodPort: the request-mix check's reads). Calls between pods go where
// the cluster would send them: a --spread name to the ready endpoints of its headless
// Service, as cluster DNS answers it (kubetest runs none), and each pod address to its
// stand-in; a call by service name, which kube-proxy balances per connection, to one pod
// of the service, as one kept-alive connection stays on the pod it was given. It
// returns where each namespace's entry service (productpage) is served.
func standInWorkload(t *testing.T, c *kubetest.Cluster, g *workload.Graph, n int) func(namespace string) (string, bool) {
	t.Helper()
	client, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	entries := map[string]string{}
	done := map[string]bool{}
	served := map[types.UID]bool{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	serve := func(namespace string, pods []corev1.Pod) error {
		lookup := func(ctx context.Context, host string) ([]string, error) {
			slices, err := client.DiscoveryV1().EndpointSlices(namespace).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + host})
			if err != nil {
				return nil, err
			}
			var ips []string
			for _, s := range slices.Items {
				for _, e := range s.Endpoints {
					if e.Conditions.Ready != nil && *e.Conditions.Ready {
						ips = append(ips, e.Addresses...)
					}
				}
			}
			if len(ips) == 0 {
				return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
			}
			return ips, nil
		}
		resolve := map[string]string{}
		lns := make([]net.Listener, len(pods))
		for i, p := range pods {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return err
			}
			lns[i] = ln
			resolve[p.Status.PodIP] = ln.Addr().String()
			if _, taken := resolve[p.Labels["app"]]; !taken {
				resolve[p.Labels["app"]] = ln.Addr().String()
			}
		}
		for i, p := range pods {
			args := p.Spec.Containers[0].Args
			var spread []string
			opts := workload.ServerOptions{Pod: p.Name, LookupHost: lookup, Resolve: resolve}
			for j := 0; j+1 < len(args); j++ {
				switch args[j] {
				case "--service":
					opts.Service = args[j+1]
				case "--version":
					opts.Version = args[j+1]
				case "--spread":
					spread = append(spread, args[j+1])
				}
			}
			if opts.Spread, err = workload.ParseSpread(spread); err != nil {
				return fmt.Errorf("pod %s: %w", p.Name, err)
			}
			srv, err := workload.NewServer(g, opts)
			if err != nil {
				return fmt.Errorf("pod %s: %w", p.Name, err)
			}
			wg.Add(1)
			go func() { defer wg.Done(); _ = srv.Serve(ctx, lns[i]) }()
			port := g.Service(opts.Service).Port
			if err := c.ReachPodPort(p.Status.PodIP, port, lns[i].Addr().String()); err != nil {
				return err
			}
			// The request-mix check reads each pod through a port-forward.
			if err := c.ForwardPodPort(ctx, namespace, p.Name, port, lns[i].Addr().String()); err != nil {
				return err
			}
		}
		mu.Lock()
		entries[namespace] = resolve[g.Entrypoint().Service]
		mu.Unlock()
		return nil
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			time.Sleep(100 * time.Millisecond)
			list, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: kube.ManagedByLabel + "=" + kube.ManagedBy + ",app"})
			if err != nil {
				continue
			}
			byNS := map[string][]corev1.Pod{}
			for _, p := range list.Items {
				if p.DeletionTimestamp != nil {
					continue
				}
				if !served[p.UID] {
					// A pod of a new bring-up: the namespace's entry is not served until
					// its stand-ins are.
					mu.Lock()
					delete(entries, p.Namespace)
					mu.Unlock()
				}
				if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
					byNS[p.Namespace] = append(byNS[p.Namespace], p)
				}
			}
			for ns, pods := range byNS {
				// A bring-up is its pods: a namespace made anew under the old name (the
				// next repeat of a mesh) holds new ones.
				var uids []string
				for _, p := range pods {
					uids = append(uids, string(p.UID))
				}
				slices.Sort(uids)
				key := ns + "/" + strings.Join(uids, ",")
				if done[key] || len(pods) < n {
					continue
				}
				done[key] = true
				if err := serve(ns, pods); err != nil {
					t.Errorf("standing in for the pods of %s: %v", ns, err)
					return
				}
				for _, p := range pods {
					served[p.UID] = true
				}
			}
		}
	}()
	return func(namespace string) (string, bool) {
		mu.Lock()
		defer mu.Unlock()
		addr, ok := entries[namespace]
		return addr, ok
	}
}

// TestRunOnClusterChecksTheRequestMix: the baseline on a cluster spreads each call over
// the callee's versions per request, as the meshes' proxies do: its workload pods run
// with --spread over each version's headless Service, and the request-mix check, reading
// what each pod served through a port-forward to it, finds reviews' three versions
// a third each. The same baseline balancing per connection, as kube-proxy does for
// callers that keep their connections, has every call of a trial on one version of
// reviews, and the check flags it. The pods are stand-ins running the real service
// server from each pod's own arguments (standInWorkload); the names resolve from the
// headless Services' real endpoints, since kubetest runs no cluster DNS: that cluster
// DNS answers them so is for the test on real nodes to show.
func TestRunOnClusterChecksTheRequestMix(t *testing.T) {
	c := startTestCluster(t)
	g, err := workload.Builtin("bookinfo")
	if err != nil {
		t.Fatal(err)
	}
	entry := standInWorkload(t, c, g, len(g.Deployments()))
	standInGeneratorsTo(t, c, "productpage", entry)
	path := kubeStudy(t, c, "    - {name: baseline, profile: none}\n    - {name: kube-proxy, profile: none, options: {balancing: per-connection}}\n  baseline: baseline")
	rewriteStudy(t, path, "  workload: {graph: app.yaml}", "  workload: {graph: bookinfo, entrypoint: /productpage}",
		"    - {name: latency, kind: fixed-rate, rate: 100, duration: 30s}",
		"    - {name: latency, kind: fixed-rate, rate: 100, duration: 3s, warmup: 500ms}")
	run, errOut := runOnCluster(t, path)
	if strings.Contains(errOut, "the request mix is not checked") {
		t.Fatalf("the mix was not checked:\n%s", errOut)
	}
	for _, tr := range run.Trials {
		shares := map[string]results.VersionShare{}
		for _, v := range tr.Result.Mix {
			shares[v.Service+" "+v.Version] = v
		}
		t.Logf("%s: mix %+v, flags %v", tr.Mesh, tr.Result.Mix, tr.Result.Flags)
		switch tr.Mesh {
		case "baseline":
			for _, v := range []string{"v1", "v2", "v3"} {
				if s := shares["reviews "+v]; s.Share < 0.23 || s.Share > 0.43 || tr.Result.HasFlag(results.FlagMixSkewed) {
					t.Errorf("baseline: reviews %s served %.0f%% of %d requests, flags %v: want a third each, per request", v, 100*s.Share, s.Requests, tr.Result.Flags)
				}
			}
		case "kube-proxy":
			if !tr.Result.HasFlag(results.FlagMixSkewed) {
				t.Errorf("per connection: mix %+v not flagged skewed", tr.Result.Mix)
			}
		}
	}
	if !regexp.MustCompile(`warning: request mix off by more than 10 points in latency 100 req/s on kube-proxy: reviews v\d served 100% of \d+ requests`).MatchString(errOut) {
		t.Errorf("progress does not warn of kube-proxy's mix:\n%s", errOut)
	}
}
