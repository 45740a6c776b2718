package cli

import (
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/meshmark/meshmark/internal/workload"
	"github.com/spf13/cobra"
)

func init() {
	register(func() *cobra.Command {
		var (
			graphArg, service, version, pod, listen string
			resolve, callees, spread                []string
			callTimeout                             time.Duration
			printGraph                              bool
		)
		cmd := &cobra.Command{
			Use:   "service --graph FILE|BUILTIN --service NAME [--version V] [--listen ADDR]",
			Short: "Run one service of a workload graph over HTTP/1.1, h2c or gRPC (what each pod runs)",
			Long: `Run one service of a service graph (see docs/graph.md): it answers HTTP/1.1 and
cleartext HTTP/2, and gRPC when the graph says the service speaks it. Each request runs
the service's script (calls, sleeps, CPU burn) and is answered with a JSON trace of every
service it went through. Built-in graphs: bookinfo, emojivoto, online-boutique,
teastore, chain-N, fanout-N, optionally with options, e.g. bookinfo:replicas=3.

With --print, write the graph file of a built-in graph and exit.`,
			Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				if graphArg == "" {
					return withExitCode(2, fmt.Errorf("--graph is required"))
				}
				if printGraph {
					src, err := workload.BuiltinYAML(graphArg)
					if err != nil {
						return withExitCode(2, err)
					}
					_, err = cmd.OutOrStdout().Write(src)
					return err
				}
				g, err := workload.Load(graphArg)
				if err != nil {
					return withExitCode(2, err)
				}
				if service == "" {
					return withExitCode(2, fmt.Errorf("--service is required"))
				}
				overrides, err := workload.ParseResolve(resolve)
				if err != nil {
					return withExitCode(2, err)
				}
				authorities, err := workload.ParseCallees(callees)
				if err != nil {
					return withExitCode(2, err)
				}
				endpoints, err := workload.ParseSpread(spread)
				if err != nil {
					return withExitCode(2, err)
				}
				srv, err := workload.NewServer(g, workload.ServerOptions{
					Service: service, Version: version, Pod: pod,
					Resolve: overrides, Callees: authorities, Spread: endpoints, CallTimeout: callTimeout,
				})
				if err != nil {
					return withExitCode(2, err)
				}
				if listen == "" {
					listen = ":" + strconv.Itoa(g.Service(service).Port)
				}
				ln, err := net.Listen("tcp", listen)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "meshmark service: %s of graph %s listening on %s\n", srv.Describe(), g.Name, ln.Addr())
				return srv.Serve(cmd.Context(), ln)
			},
		}
		f := cmd.Flags()
		f.StringVar(&graphArg, "graph", "", "graph file or built-in graph name")
		f.StringVar(&service, "service", "", "service of the graph to run")
		f.StringVar(&version, "version", "", "version of the service (default: its only version)")
		f.StringVar(&pod, "pod", "", "pod name reported in traces (default: $POD_NAME, then the host name)")
		f.StringVar(&listen, "listen", "", "address to listen on (default: :<service port>)")
		f.StringArrayVar(&resolve, "resolve", nil, "name=ip or name=ip:port: where calls to a service go (repeatable)")
		f.StringArrayVar(&spread, "spread", nil, "service=ip:port@weight,...: call a service's endpoints directly, one picked per request by weight (repeatable; the baseline's per-request balancing)")
		f.StringArrayVar(&callees, "callee", nil, "service=host:port: the authority calls to a service use in their URLs instead of service:port (repeatable; meshes that address services by their own names set it)")
		f.DurationVar(&callTimeout, "call-timeout", 30*time.Second, "time limit for one request's whole script")
		f.BoolVar(&printGraph, "print", false, "print the graph file of the built-in named by --graph and exit")
		return cmd
	})
}
