package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/report"
	"github.com/meshmark/meshmark/internal/store"
)

func init() {
	register(func() *cobra.Command {
		var format, output, dir, db string
		c := &cobra.Command{
			Use:   "report RUN",
			Short: "Write the report of a stored run (html, md, json, csv or smp)",
			Long: "Write the report of a stored run. RUN is a run id, a unique id prefix or \"last\".\n" +
				"--format html writes one self-contained page (charts included, works offline) to\n" +
				"report-<run>.html unless -o says otherwise; the other formats go to stdout by default.\n" +
				"--dir writes every format into a directory instead.\n" +
				"Exit code 2 for a bad format, 3 when the run does not exist.",
			Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				f, err := report.ParseFormat(format)
				if err != nil {
					return withExitCode(2, err)
				}
				runs, err := loadRuns(cmd.Context(), db, args[0])
				if errors.Is(err, store.ErrNotFound) {
					return withExitCode(3, err)
				}
				if err != nil {
					return err
				}
				run := runs[0]
				an := analyze(run, analysis.Options{})
				opts := report.Options{MeshmarkVersion: Version}
				if dir != "" {
					paths, err := report.Write(cmd.Context(), run, an, dir, opts)
					for _, p := range paths {
						fmt.Fprintln(cmd.OutOrStdout(), p)
					}
					return err
				}
				if output == "" && f == report.HTML {
					output = "report-" + run.ID + ".html"
				}
				if output == "" || output == "-" {
					return report.Render(cmd.OutOrStdout(), f, run, an, opts)
				}
				return writeReportFile(output, func(w io.Writer) error { return report.Render(w, f, run, an, opts) }, cmd.ErrOrStderr())
			},
		}
		c.Flags().StringVarP(&format, "format", "f", "html", "html, md, json, csv or smp")
		c.Flags().StringVarP(&output, "output", "o", "", "file to write (\"-\" for stdout)")
		c.Flags().StringVar(&dir, "dir", "", "write every format into this directory")
		c.Flags().StringVar(&db, "db", "", "results database (default $"+store.EnvDB+" or ~/.local/share/meshmark/results.db)")
		return c
	})
}

// writeReportFile writes through a temporary file so that an interrupted report never
// leaves a truncated file under the final name.
func writeReportFile(path string, render func(io.Writer) error, log io.Writer) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := render(tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	fmt.Fprintln(log, "wrote", path)
	return nil
}
