package kube

import (
	"bufio"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestGeneratorsAreSpreadAndReachedThroughPortForwards puts two load-generator pods on
// the load-generator nodes and reaches each through a port-forward made by the API
// server. On this cluster the pods run only on paper: kwok's kubelet endpoint, which the
// API server calls for the forward, dials a listener of this test instead of the pod's
// loopback (kubetest.ForwardPodPort), and each listener says which pod it stands for,
// so the test sees that every forward leads to its own pod.
func TestGeneratorsAreSpreadAndReachedThroughPortForwards(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	c := connect(t, Config{
		AppNodeSelector:     map[string]string{"meshmark.dev/test-node": "0"},
		LoadgenNodeSelector: map[string]string{"type": "kwok"},
	})
	spec := bookinfoSpec(t, "9e7f01")
	spec.Generators = 2
	app, err := c.Deploy(ctx, spec)
	t.Cleanup(func() { _ = c.Teardown(context.Background(), app) })
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitReady(ctx, app, nil); err != nil {
		t.Fatal(err)
	}
	pods, err := c.Client().CoreV1().Pods(app.Namespace).List(ctx, metav1.ListOptions{LabelSelector: RoleLabel + "=" + roleGenerator})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 2 {
		t.Fatalf("%d generator pods, want 2", len(pods.Items))
	}
	nodes := map[string]bool{}
	for _, p := range pods.Items {
		nodes[p.Spec.NodeName] = true
		args := strings.Join(p.Spec.Containers[0].Args, " ")
		if args != "generator --listen 127.0.0.1:7070 --allow-namespace $(POD_NAMESPACE)" {
			t.Errorf("generator pod %s args %q", p.Name, args)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func(name string) {
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				_, _ = conn.Write([]byte(name + "\n"))
				conn.Close()
			}
		}(p.Name)
		if err := cluster.ForwardPodPort(ctx, app.Namespace, p.Name, GeneratorPort, ln.Addr().String()); err != nil {
			t.Fatal(err)
		}
	}
	if len(nodes) != 2 {
		t.Errorf("generator pods on nodes %v, want them spread over two nodes", nodes)
	}

	fw, err := c.ForwardGenerators(ctx, app)
	if err != nil {
		t.Fatal(err)
	}
	defer fw.Close()
	if len(fw.Generators) != 2 {
		t.Fatalf("%d forwards, want 2", len(fw.Generators))
	}
	for _, g := range fw.Generators {
		conn, err := net.DialTimeout("tcp", g.Addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		line, err := bufio.NewReader(conn).ReadString('\n')
		conn.Close()
		if err != nil {
			t.Fatalf("forward to %s (%s): %v", g.Pod, g.Addr, err)
		}
		if strings.TrimSpace(line) != g.Pod {
			t.Errorf("forward to %s reached %q", g.Pod, strings.TrimSpace(line))
		}
		if !nodes[g.Node] {
			t.Errorf("generator %s on node %q", g.Pod, g.Node)
		}
	}
	if err := fw.Err(); err != nil {
		t.Errorf("a forward broke: %v", err)
	}
}
