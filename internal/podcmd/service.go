package podcmd

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/meshmark/meshmark/internal/workload"
)

// Service runs one service of a workload graph (docs/graph.md) until ctx ends: HTTP/1.1
// and cleartext HTTP/2, and gRPC where the graph says the service speaks it. With
// --print it writes the graph file of a built-in graph instead.
func Service(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		graphArg, service, version, pod, listen string
		resolve, callees, spread                stringList
		callTimeout                             time.Duration
		printGraph                              bool
	)
	fs := flags("service", stderr)
	fs.StringVar(&graphArg, "graph", "", "graph file or built-in graph name (bookinfo, emojivoto, online-boutique, teastore, chain-N, fanout-N, with options such as bookinfo:replicas=3)")
	fs.StringVar(&service, "service", "", "service of the graph to run")
	fs.StringVar(&version, "version", "", "version of the service (default: its only version)")
	fs.StringVar(&pod, "pod", "", "pod name reported in traces (default: $POD_NAME, then the host name)")
	fs.StringVar(&listen, "listen", "", "address to listen on (default: :<service port>)")
	fs.Var(&resolve, "resolve", "name=ip or name=ip:port: where calls to a service go (repeatable)")
	fs.Var(&spread, "spread", "service=ip:port@weight,...: call a service's endpoints directly, one picked per request by weight; an endpoint name:port stands for every address the name resolves to (a headless Service), sharing its weight (repeatable; the baseline's per-request balancing)")
	fs.Var(&callees, "callee", "service=host:port: the authority calls to a service use in their URLs instead of service:port (repeatable; meshes that address services by their own names set it)")
	fs.DurationVar(&callTimeout, "call-timeout", 30*time.Second, "time limit for one request's whole script")
	fs.BoolVar(&printGraph, "print", false, "print the graph file of the built-in named by --graph and exit")
	if err := parse(fs, args); err != nil {
		return err
	}
	if graphArg == "" {
		return usage("--graph is required")
	}
	if printGraph {
		src, err := workload.BuiltinYAML(graphArg)
		if err != nil {
			return &UsageError{Err: err}
		}
		_, err = stdout.Write(src)
		return err
	}
	g, err := workload.Load(graphArg)
	if err != nil {
		return &UsageError{Err: err}
	}
	if service == "" {
		return usage("--service is required")
	}
	overrides, err := workload.ParseResolve(resolve)
	if err != nil {
		return &UsageError{Err: err}
	}
	authorities, err := workload.ParseCallees(callees)
	if err != nil {
		return &UsageError{Err: err}
	}
	endpoints, err := workload.ParseSpread(spread)
	if err != nil {
		return &UsageError{Err: err}
	}
	srv, err := workload.NewServer(g, workload.ServerOptions{
		Service: service, Version: version, Pod: pod,
		Resolve: overrides, Callees: authorities, Spread: endpoints, CallTimeout: callTimeout,
	})
	if err != nil {
		return &UsageError{Err: err}
	}
	if listen == "" {
		listen = ":" + strconv.Itoa(g.Service(service).Port)
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "meshmark service: %s of graph %s listening on %s\n", srv.Describe(), g.Name, ln.Addr())
	return srv.Serve(ctx, ln)
}
