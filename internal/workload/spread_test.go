package workload

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"
)

// TestSpreadOverNamesBalancesPerRequest: an endpoint named by a host name (a cluster's
// headless Service of one version) stands for every address it resolves to, sharing the
// version's weight, picked per request over kept-alive connections; when the name's
// answer changes (a pod goes), the calls follow within about a second. Pods here are
// servers on 127.0.0.1-3 at one port, as a headless Service's pods share the Service's
// port; the names resolve through the test's own lookup.
func TestSpreadOverNamesBalancesPerRequest(t *testing.T) {
	g := mustParse(t, `name: g
services:
  - name: a
    script: [call: b]
  - name: b
    versions: [{name: v1}, {name: v2}]
`)
	// One port on three loopback addresses: the first free one on 127.0.0.1 that the
	// other two have free too.
	var lns []net.Listener
	for attempt := 0; len(lns) < 3 && attempt < 20; attempt++ {
		for _, l := range lns {
			l.Close()
		}
		lns = nil
		first, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, first)
		port := first.Addr().(*net.TCPAddr).Port
		for _, ip := range []string{"127.0.0.2", "127.0.0.3"} {
			l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
			if err != nil {
				break
			}
			lns = append(lns, l)
		}
	}
	if len(lns) < 3 {
		t.Fatal("no port free on 127.0.0.1-3")
	}
	port := lns[0].Addr().(*net.TCPAddr).Port
	var mu sync.Mutex
	byAddr := map[string]int{}
	for i, l := range lns {
		version := []string{"v1", "v1", "v2"}[i]
		srv, err := NewServer(g, ServerOptions{Service: "b", Version: version, Pod: fmt.Sprintf("b-%s-%d", version, i)})
		if err != nil {
			t.Fatal(err)
		}
		hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			byAddr[l.Addr().String()]++
			mu.Unlock()
			srv.ServeHTTP(w, r)
		})}
		go hs.Serve(l)
		t.Cleanup(func() { hs.Close() })
	}
	answers := map[string][]string{"b-v1-pods": {"127.0.0.1", "127.0.0.2"}, "b-v2-pods": {"127.0.0.3"}}
	var lookups sync.Map
	lookup := func(_ context.Context, host string) ([]string, error) {
		n, _ := lookups.LoadOrStore(host, new(int))
		mu.Lock()
		defer mu.Unlock()
		*n.(*int)++
		if a, ok := answers[host]; ok {
			return append([]string(nil), a...), nil
		}
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	p := strconv.Itoa(port)
	spread, err := ParseSpread([]string{"b=b-v1-pods:" + p + "@1,b-v2-pods:" + p + "@1"})
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewServer(g, ServerOptions{Service: "a", Spread: spread, LookupHost: lookup})
	if err != nil {
		t.Fatal(err)
	}
	call := func(n int) map[string]int {
		mu.Lock()
		clear(byAddr)
		mu.Unlock()
		for range n {
			rec := httptest.NewRecorder()
			a.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
			var tr trace
			if err := json.Unmarshal(rec.Body.Bytes(), &tr); err != nil || rec.Code != 200 || len(tr.Calls) != 1 || tr.Calls[0].Code != 200 {
				t.Fatalf("a answered %d: %s", rec.Code, rec.Body)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		out := map[string]int{}
		for k, v := range byAddr {
			host, _, _ := net.SplitHostPort(k)
			out[host] = v
		}
		return out
	}
	// v1's two pods share its half: a quarter each; v2's one pod has half.
	got := call(800)
	t.Logf("800 calls: %v", got)
	// 200 of 800 expected for each v1 pod (sd 12.2), 400 for v2's (sd 14.1): 50 is over three sd.
	if got["127.0.0.1"] < 150 || got["127.0.0.1"] > 250 || got["127.0.0.2"] < 150 || got["127.0.0.2"] > 250 || got["127.0.0.3"] < 350 || got["127.0.0.3"] > 450 {
		t.Errorf("calls by pod %v: want about 200, 200 and 400 (each v1 pod a quarter, the v2 pod half)", got)
	}
	// One v1 pod goes: after the next resolution, v1's half is the other pod's.
	mu.Lock()
	answers["b-v1-pods"] = []string{"127.0.0.1"}
	mu.Unlock()
	time.Sleep(spreadRefresh + 100*time.Millisecond)
	call(10) // the first calls after the refresh time start the new resolution
	time.Sleep(200 * time.Millisecond)
	got = call(400)
	t.Logf("400 calls after a v1 pod left: %v", got)
	if got["127.0.0.2"] != 0 || got["127.0.0.1"] < 150 || got["127.0.0.1"] > 250 {
		t.Errorf("calls by pod %v after 127.0.0.2 left the name: want none there, about 200 to 127.0.0.1", got)
	}
	// A name that stops resolving keeps its last answer rather than losing its share.
	mu.Lock()
	delete(answers, "b-v2-pods")
	mu.Unlock()
	time.Sleep(spreadRefresh + 100*time.Millisecond)
	call(10)
	time.Sleep(200 * time.Millisecond)
	if got = call(200); got["127.0.0.3"] < 60 {
		t.Errorf("calls by pod %v after b-v2-pods stopped resolving: want v2's pod to keep its half", got)
	}
}

func TestParseSpreadTakesNames(t *testing.T) {
	m, err := ParseSpread([]string{"reviews=reviews-v1-pods:9080@2,reviews-v2-pods.ns.svc.cluster.local:9080@1,127.0.0.1:9"})
	if err != nil || len(m["reviews"]) != 3 || m["reviews"][0].Addr != "reviews-v1-pods:9080" || m["reviews"][0].Weight != 2 {
		t.Errorf("ParseSpread with names: %+v %v", m, err)
	}
	for _, bad := range []string{"b=-bad-:1", "b=a..b:1", "b=under_score:1", "b=host:0"} {
		if _, err := ParseSpread([]string{bad}); err == nil {
			t.Errorf("ParseSpread(%q) accepted", bad)
		}
	}
}
