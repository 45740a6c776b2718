package plaintextprobe

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
)

// TestControlIsCalledAgainUntilItAnswers: kube-proxy refuses a new Service's traffic
// for a moment after its endpoints are ready; the probe calls the positive control
// again while it refuses, reports it last, and calls each meshed service once.
func TestControlIsCalledAgainUntilItAnswers(t *testing.T) {
	workload := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"service":"control","pod":"control"}`)
	}))
	defer workload.Close()
	var controlCalls, serviceCalls atomic.Int64
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		switch addr {
		case "control:9080":
			if controlCalls.Add(1) <= 3 {
				return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
			}
			return (&net.Dialer{}).DialContext(ctx, network, workload.Listener.Addr().String())
		default:
			serviceCalls.Add(1)
			return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNRESET}
		}
	}
	control := meshprobe.PlaintextTarget{Service: "control", Addr: "control:9080", Protocol: "http"}
	targets := []meshprobe.PlaintextTarget{{Service: "front", Addr: "front:80", Protocol: "http"}, {Service: "back", Addr: "back:80", Protocol: "http"}}

	var report []meshprobe.PlaintextProbe
	if err := json.Unmarshal(Run(context.Background(), targets, &control, dial), &report); err != nil {
		t.Fatal(err)
	}
	if len(report) != 3 || report[2].Service != "control" || report[2].Refused {
		t.Fatalf("report %+v: want front and back, then the control, served", report)
	}
	if report[0].Service != "front" || !report[0].Refused || report[1].Service != "back" || !report[1].Refused {
		t.Errorf("report %+v: want front and back refused", report)
	}
	if n := controlCalls.Load(); n != 4 {
		t.Errorf("control called %d times, want 4 (3 refused, then served)", n)
	}
	if n := serviceCalls.Load(); n != 2 {
		t.Errorf("services called %d times, want once each", n)
	}
}
