package kubetest

import (
	"context"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// OnNewPods stands in for what a pod's containers would do once kwok has scheduled it:
// until the test ends it lists, every 100 ms, the pods of every namespace that match
// selector and calls handle with each it has not handled yet. handle returns done
// false to see the pod again on a later round (say, its Service does not exist yet);
// an error fails the test and ends the watch. Cleanups the caller registered before
// this call run after the watch has stopped, so they may release what handle made.
func (c *Cluster) OnNewPods(t testing.TB, selector string, handle func(ctx context.Context, p *corev1.Pod) (done bool, err error)) {
	t.Helper()
	client, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		handled := map[string]bool{}
		for ctx.Err() == nil {
			time.Sleep(100 * time.Millisecond)
			pods, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: selector})
			if err != nil {
				continue
			}
			for i := range pods.Items {
				p := &pods.Items[i]
				key := p.Namespace + "/" + p.Name
				if handled[key] {
					continue
				}
				done, err := handle(ctx, p)
				if err != nil {
					t.Error(err)
					return
				}
				handled[key] = done
			}
		}
	}()
}
