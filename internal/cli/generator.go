package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/meshmark/meshmark/internal/load"
	"github.com/meshmark/meshmark/internal/loadgen"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

func init() {
	register(newGeneratorCommand)
}

func newGeneratorCommand() *cobra.Command {
	var (
		listen, namespace, rawDir string
		allowAny                  bool
		resolve                   []string
	)
	c := &cobra.Command{
		Use:   "generator",
		Short: "Serve load plans over gRPC: a remote load generator for `meshmark load --generators` and for runs on Kubernetes",
		Long: `generator waits for plans, each a ` + "`meshmark load`" + ` command line and this generator's share
of it, runs one at a time, and streams every interval's histograms back as it ends, then
the result. A plan stops as soon as the driver goes away.

Targets: loopback and 198.18.0.0/15 only, unless --allow-any-target; --allow-namespace NS
also allows the Kubernetes services of namespace NS by name (NAME, NAME.NS, NAME.NS.svc,
NAME.NS.svc.cluster.local), which is how generator pods run. --resolve HOST:PORT:ADDR
dials ADDR for HOST:PORT, as curl's --resolve does. --raw-dir keeps every request of
every plan as a raw CSV log (the format of ` + "`meshmark load --raw`" + `).

Listen on loopback unless the network between driver and generator is yours: a
generator loads whatever its rules allow for whoever reaches it.`,
		Example: `  meshmark generator --listen 127.0.0.1:7070
  meshmark load http://127.0.0.1:8080/ --rate 1000 -d 30s --generators 127.0.0.1:7070,127.0.0.1:7071`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rmap, err := loadgen.ParseResolve(resolve)
			if err != nil {
				return withExitCode(2, err)
			}
			if rawDir != "" {
				if err := os.MkdirAll(rawDir, 0o755); err != nil {
					return err
				}
			}
			lis, err := net.Listen("tcp", listen)
			if err != nil {
				return err
			}
			srv := loadgen.NewServer(loadgen.ServerOptions{
				Parse: parseLoadArgs, AllowAnyTarget: allowAny, AllowNamespace: namespace,
				Resolve: rmap, RawDir: rawDir, Log: cmd.ErrOrStderr(),
			})
			fmt.Fprintf(cmd.ErrOrStderr(), "generator listening on %s\n", lis.Addr())
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			go func() {
				<-ctx.Done()
				srv.Stop()
			}()
			if err := srv.Serve(lis); err != nil && ctx.Err() == nil {
				return err
			}
			return nil
		},
	}
	c.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return withExitCode(2, err) })
	c.Flags().StringVar(&listen, "listen", "127.0.0.1:7070", "address to serve plans on")
	c.Flags().StringVar(&namespace, "allow-namespace", "", "also load the Kubernetes services of this namespace, by name")
	c.Flags().BoolVar(&allowAny, "allow-any-target", false, "load any address (only ones you own)")
	c.Flags().StringArrayVar(&resolve, "resolve", nil, "HOST:PORT:ADDR: dial ADDR for HOST:PORT (repeatable)")
	c.Flags().StringVar(&rawDir, "raw-dir", "", "keep every request of every plan as a raw CSV log in this directory")
	return c
}

// driverOnly are `meshmark load` flags about the driver's own output, not the load.
var driverOnly = map[string]bool{"generators": true, "format": true, "output": true, "progress": true, "raw": true}

// runRemoteLoad drives the load through the generators that --generators names and
// writes the merged result as a local run would.
func runRemoteLoad(cmd *cobra.Command, f loadFlags) error {
	if f.raw != "" {
		return withExitCode(2, errors.New("--raw is written by each generator with --generators: start them with --raw-dir"))
	}
	args := []string{cmd.Flags().Arg(0)}
	cmd.Flags().Visit(func(fl *pflag.Flag) {
		if driverOnly[fl.Name] {
			return
		}
		if sv, ok := fl.Value.(pflag.SliceValue); ok {
			for _, v := range sv.GetSlice() {
				args = append(args, "--"+fl.Name+"="+v)
			}
			return
		}
		args = append(args, "--"+fl.Name+"="+fl.Value.String())
	})
	stderr := cmd.ErrOrStderr()
	ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
	pool, err := loadgen.Dial(ctx, f.generators)
	cancel()
	if err != nil {
		return err
	}
	defer pool.Close()
	tty := isTerminal(stderr)
	var progress func(load.Progress)
	if tty || f.progress {
		progress = func(p load.Progress) {
			if tty {
				fmt.Fprintf(stderr, "\r\033[K%s", load.ProgressLine(p))
			} else {
				fmt.Fprintln(stderr, load.ProgressLine(p))
			}
		}
	}
	res, _, err := pool.Run(cmd.Context(), args, progress)
	if tty {
		fmt.Fprint(stderr, "\r\033[K")
	}
	if err != nil {
		return err
	}
	return writeResult(cmd, res, f.format, f.output)
}
