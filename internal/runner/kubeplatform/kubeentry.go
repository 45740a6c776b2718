package kubeplatform

import (
	"context"
	"fmt"
	"time"

	"github.com/meshmark/meshmark/internal/load"
	"github.com/meshmark/meshmark/internal/study"
)

// Before the first trial on a cluster where no probe burst went first (no mesh, or
// none whose proxies count), every load generator must have been answered by the entry
// service. Ready pods behind ready endpoints are not yet a path: each node's kube-proxy
// programs a Service's new endpoints a moment later, and a connection opened meanwhile
// can hang. On the real test cluster, dials from the worker node to a new Service's
// address timed out for up to 2.8 s after the endpoints were ready, and before this
// wait the first trial after a bring-up lost 1 s, and once 29 s (a trial of 1 s at 50
// req/s measured p50 29.4 s, every request answered late, and nothing but the
// generator's lag said anything was wrong).
//
// Where a mesh's burst goes first, it is that traffic, unmeasured, and this wait must
// not go before it: it would open the app's pooled connections first, and the burst's
// proof reads the connections and TLS handshakes that proxies count as they open
// (ztunnel, istio-proxy's inbound listener). On the real cluster the Istio sidecar then
// showed no mTLS on the wire, and ztunnel no connection into details.
const (
	// entryProbePerGenerator is how many requests each generator sends per attempt,
	// each on a connection of its own, spread over entryProbeLength.
	entryProbePerGenerator = 5
	entryProbeLength       = 500 * time.Millisecond
	// entryProbeTimeout bounds each request: a dial that takes longer is stuck as
	// above, and the next attempt dials anew.
	entryProbeTimeout = 2 * time.Second
	// entryAnswerLimit is how long the generators may wait for their first answers:
	// ample for kube-proxy's next sync (it waits at least 1 s between them).
	entryAnswerLimit = 30 * time.Second
)

// awaitEntry sends, from every load generator, a few requests to the entry service,
// each on a new connection (a gRPC entry's on new channels) and each within
// entryProbeTimeout, until an attempt has all of them answered: then the trials' own
// connections, opened afterwards, find the Service programmed on every node. An answer of any status counts: what is awaited is
// the path; whether the app serves is for the trials (and the burst) to judge. It says
// on the progress display when it had to wait, and gives up after entryAnswerLimit
// saying how the last attempt failed.
func (r *run) awaitEntry(ctx context.Context, d *kubeDeployment) error {
	n := max(len(d.forwards.Generators), 1)
	e := &study.Experiment{Name: "entry-probe", Kind: study.KindFixedRate}
	// A gRPC client keeps its channel open (the engine refuses to close it after each
	// call); each attempt's channels are new all the same, dialled as the attempt starts.
	e.KeepAlive = r.ClientProtocol(*e) == study.ProtocolGRPC
	spec, err := r.ProbeSpec(e, r.kubeLoad(ctx, d, nil).Target, float64(n*entryProbePerGenerator)/entryProbeLength.Seconds(), entryProbeLength)
	if err != nil {
		return err
	}
	spec.Timeout = entryProbeTimeout
	start := time.Now()
	deadline := start.Add(entryAnswerLimit)
	for attempt := 1; ; attempt++ {
		res, _, err := d.pool.Run(ctx, spec, nil)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		why := entryUnanswered(res, err)
		if why == "" {
			if attempt > 1 {
				r.Note(fmt.Sprintf("%s: the entry service answered every load generator after %s (%d attempts)",
					d.mesh.Name, time.Since(start).Round(100*time.Millisecond), attempt))
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the entry service did not answer the load generators within %s: %s", entryAnswerLimit, why)
		}
		if attempt == 1 {
			r.Note(fmt.Sprintf("%s: waiting for the entry service to answer every load generator (%s)", d.mesh.Name, why))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// entryUnanswered says why an attempt of awaitEntry does not count as answered, or ""
// when it does.
func entryUnanswered(res *load.Result, err error) string {
	switch {
	case err != nil:
		return err.Error()
	case res == nil || res.Sent == 0:
		return "no request was sent"
	}
	if unanswered := res.Errors.Total() - res.Errors.Non2xx; unanswered > 0 || res.Completed != res.Sent {
		return fmt.Sprintf("%d of %d requests answered: %s", res.Completed-unanswered, res.Sent, describeBurstErrors(res))
	}
	return ""
}
