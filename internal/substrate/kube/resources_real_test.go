package kube

import (
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/load"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/substrate/kube/kubetest"
	"github.com/meshmark/meshmark/internal/workload"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// burnerGraph is one service that burns a known CPU time per request: driven at a known
// rate, its container uses a known number of cores.
const burnerGraph = `name: burner
services:
  - name: burner
    isEntrypoint: true
    port: 9080
    protocol: http
    script:
      - cpu: 4ms
`

// TestResourcesOnRealNodesMatchTheWork holds the kubelets' resource metrics, read as a
// trial reads them, to a known truth: a service that burns 4 ms of CPU per request,
// driven at 100 req/s by a generator pod on the other node, uses 0.4 cores plus what
// serving HTTP costs, and its process's CPU time on the node (/proc, the kernel's own
// account, independent of the kubelet and cAdvisor) says how much. The sampler's
// readings of its container over the load must agree with /proc within 5%, the
// generator use some but less than the service, each container be taken for its role,
// and its working set be a real one.
func TestResourcesOnRealNodesMatchTheWork(t *testing.T) {
	l := kubetest.SharedLocal(t)
	ctx := context.Background()
	c, _ := connectAcrossNodes(t, l)
	g, err := workload.Parse("burner.yaml", []byte(burnerGraph))
	if err != nil {
		t.Fatal(err)
	}
	app := deployReady(t, c, AppSpec{Run: "burn1", Mesh: "baseline", Deployments: g.Deployments(), Generators: 1,
		Files: map[string][]byte{"graph.yaml": []byte(burnerGraph)},
		Args: func(d workload.Deployment) []string {
			args := g.ServiceArgs(d, PodNameArg)
			args[2] = FilesDir + "/graph.yaml" // after --graph
			return args
		}})
	pool := dialGenerator(t, c, app)
	const url = "http://burner:9080/"
	untilAnswered(t, pool, url)

	const rate, length = 100.0, 30 * time.Second
	burner := processOfPod(t, c, app.Namespace, "burner")
	procStart, procFrom := processCPU(t, burner), time.Now()
	sampler := c.SampleResources(ctx, ResourceScope{Mesh: "baseline", App: app.Namespace}, time.Second, nil)
	res, _, err := pool.Run(ctx, load.Spec{
		Version:  load.SpecVersion,
		Request:  load.RequestSpec{URL: url},
		Open:     &load.OpenSpec{Schedule: load.ScheduleSpec{Arrival: load.Constant, Rate: rate}, Connections: 4},
		Duration: length, Timeout: 5 * time.Second,
	}, nil)
	procEnd, procTo := processCPU(t, burner), time.Now()
	got := sampler.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors.Total() != 0 || float64(res.Completed) < 0.98*rate*length.Seconds() {
		t.Fatalf("%d requests completed, %d errors: want %.0f, none failed", res.Completed, res.Errors.Total(), rate*length.Seconds())
	}

	type span struct{ first, last ContainerSample }
	byContainer := map[[2]string]*span{}
	for _, s := range got.Samples {
		k := [2]string{s.Pod, s.Container}
		if byContainer[k] == nil {
			byContainer[k] = &span{first: s}
		}
		byContainer[k].last = s
		if s.WorkingSetBytes < 1<<20 || s.WorkingSetBytes > 1<<30 {
			t.Errorf("%s/%s working set %d bytes: not a real process's", s.Pod, s.Container, s.WorkingSetBytes)
		}
	}
	cores := map[substrate.Role]float64{}
	for k, s := range byContainer {
		d := s.last.T.Sub(s.first.T)
		if d < length/2 {
			t.Errorf("%s/%s read over %s of a %s load: the kubelet's readings did not move", k[0], k[1], d, length)
			continue
		}
		c := (s.last.CPUSeconds - s.first.CPUSeconds) / d.Seconds()
		cores[s.first.Role] += c
		t.Logf("%s/%s (%s): %.3f cores over %s of readings", k[0], k[1], s.first.Role, c, d.Round(time.Second))
	}
	if len(got.Unread) > 0 {
		t.Errorf("unread kubelets: %v", got.Unread)
	}
	// The truth: the service's process, as the node's kernel accounts it (/proc), over
	// the load; and at least the 4 ms a request it burns.
	truth := (procEnd - procStart) / procTo.Sub(procFrom).Seconds()
	const least = rate * 0.004
	work := cores[substrate.RoleWorkload]
	t.Logf("the service's process used %.3f cores (/proc), the kubelet says %.3f; its requests burn %.2f", truth, work, least)
	if math.Abs(work-truth) > 0.05*truth || truth < 0.95*least {
		t.Errorf("the app used %.3f cores by its kubelet, %.3f by its process's own account (/proc); want them within 5%%, and at least %.2f (%.0f req/s × 4 ms)", work, truth, least, rate)
	}
	if gen := cores[substrate.RoleLoadGen]; gen <= 0 || gen > least {
		t.Errorf("the generator used %.3f cores: want some, and less than the app's work", gen)
	}
}

// processOfPod is the host's pid of the one process of a service's pod: a local
// cluster's containers are processes of this machine, in pid namespaces below the
// host's, and their command line carries the pod's name.
func processOfPod(t *testing.T, c *Cluster, namespace, service string) int {
	t.Helper()
	pods, err := c.Client().CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + service})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("pods of %s: %d, %v", service, len(pods.Items), err)
	}
	want := "\x00--pod\x00" + pods.Items[0].Name + "\x00"
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && strings.Contains(string(cmd), want) {
			return pid
		}
	}
	t.Fatalf("no process of pod %s on this machine", pods.Items[0].Name)
	return 0
}

// processCPU is a process's CPU time so far, user and system, in seconds.
func processCPU(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The fields after the command's closing parenthesis; utime and stime are the
	// 14th and 15th of the whole line, in clock ticks (100 a second on Linux).
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	utime, err1 := strconv.ParseFloat(fields[11], 64)
	stime, err2 := strconv.ParseFloat(fields[12], 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("/proc/%d/stat: %q", pid, b)
	}
	return (utime + stime) / 100
}
