package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/meshmark/meshmark/internal/runner"
	// Every platform a study can name beside the local testbed registers itself.
	_ "github.com/meshmark/meshmark/internal/runner/kubeplatform"
	"github.com/meshmark/meshmark/internal/store"
	"github.com/meshmark/meshmark/internal/study"
)

// runFlags are shared by `run` and `demo`.
type runFlags struct {
	db          string
	logs        string
	reportDir   string
	metricsAddr string
	noReport    bool
	plan        bool
}

func (f *runFlags) add(c *cobra.Command) {
	c.Flags().StringVar(&f.db, "db", "", "results database (default $MESHMARK_DB or ~/.local/share/meshmark/results.db)")
	c.Flags().StringVar(&f.logs, "logs", "", "keep every process log of the run under this directory")
	c.Flags().StringVar(&f.reportDir, "report-dir", ".", "directory the run's report is written to")
	c.Flags().StringVar(&f.metricsAddr, "metrics-addr", "", "serve live Prometheus metrics at this address during the run (e.g. 127.0.0.1:9478)")
	c.Flags().BoolVar(&f.noReport, "no-report", false, "do not write a report at the end")
	c.Flags().BoolVar(&f.plan, "plan", false, "run nothing: estimate from the stored runs of the same study or graph how small a difference the planned repeats will tell apart")
}

func init() {
	register(func() *cobra.Command {
		var f runFlags
		c := &cobra.Command{
			Use:   "run STUDY",
			Short: "Run a study file (or a built-in study such as demo) and store its results",
			Args:  cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				st, err := study.Load(args[0])
				if err != nil {
					return withExitCode(2, err)
				}
				return runStudy(cmd, st, f)
			},
		}
		f.add(c)
		return c
	})
	register(func() *cobra.Command {
		var f runFlags
		c := &cobra.Command{
			Use:   "demo",
			Short: "Run the built-in demo study: bookinfo under no mesh, an Envoy sidecar mesh, and the same with strict mTLS",
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				st, err := study.Builtin("demo")
				if err != nil {
					return err
				}
				return runStudy(cmd, st, f)
			},
		}
		f.add(c)
		return c
	})
}

func runStudy(cmd *cobra.Command, st *study.Study, f runFlags) error {
	ctx := cmd.Context()
	out, errw := cmd.OutOrStdout(), cmd.ErrOrStderr()
	if f.plan {
		return planStudy(cmd, st, f)
	}
	if st.Spec.Substrate.Kubernetes == nil && os.Geteuid() != 0 {
		return errors.New("running a study on the local substrate needs root: it creates network namespaces and iptables rules (try sudo)")
	}
	for _, w := range st.Warnings {
		fmt.Fprintf(errw, "warning: %s\n", w)
	}
	db, err := studyDB(st, f.db)
	if err != nil {
		return err
	}
	s, err := store.Open(ctx, db)
	if err != nil {
		return err
	}
	defer s.Close()

	opts := runner.Options{
		Store:       s,
		Progress:    errw,
		Interactive: isTerminal(errw),
		LogDir:      f.logs,
		Version:     Version,
	}
	if f.metricsAddr != "" {
		obs, stop, err := serveMetrics(ctx, f.metricsAddr)
		if err != nil {
			return err
		}
		defer stop()
		opts.Observe = obs
		fmt.Fprintf(errw, "live metrics at http://%s/metrics\n", f.metricsAddr)
	}
	fmt.Fprintf(errw, "study %s (%s): results in %s\n", st.Metadata.Name, st.File, s.Path())
	run, err := runner.Run(ctx, st, opts)
	if run == nil {
		return err
	}
	fmt.Fprintf(out, "\nrun %s: %s\n", run.ID, run.Status)
	if len(run.Trials) > 0 {
		if perr := printSummary(out, run); perr != nil {
			err = errors.Join(err, perr)
		}
		if !f.noReport {
			// The report is written even for an interrupted run: what finished is real.
			rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			paths, rerr := writeReports(rctx, run, f.reportDir)
			cancel()
			for _, p := range paths {
				fmt.Fprintf(out, "report: %s\n", p)
			}
			err = errors.Join(err, rerr)
		}
	}
	if errors.Is(err, runner.ErrInterrupted) {
		return withExitCode(130, err)
	}
	return err
}

// studyDB is the results database a run writes to: --db, else $MESHMARK_DB, else the
// study's spec.results.dir (results.db in it, relative to the study file), else the
// default ("" lets the store choose).
func studyDB(st *study.Study, flag string) (string, error) {
	if flag != "" || os.Getenv("MESHMARK_DB") != "" || st.Spec.Results == nil || st.Spec.Results.Dir == "" {
		return flag, nil
	}
	dir := st.Resolve(st.Spec.Results.Dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("spec.results.dir: %w", err)
	}
	return filepath.Join(dir, "results.db"), nil
}
