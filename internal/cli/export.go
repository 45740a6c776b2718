package cli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/meshmark/meshmark/internal/store"
	"github.com/spf13/cobra"
)

func init() {
	register(func() *cobra.Command {
		var db, format, output string
		c := &cobra.Command{
			Use:   "export RUN",
			Short: "Export a run as JSON (everything, lossless histograms) or CSV (one row per trial and interval)",
			Long: "export writes a run to stdout or a file. JSON holds everything stored, with every " +
				"histogram in the HdrHistogram V2 compressed encoding (base64), readable by any " +
				"HdrHistogram library. CSV has one row per trial and one per one-second interval.\n\n" +
				"RUN is a run id, a unique prefix of one, or \"last\".",
			Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				if format != store.FormatJSON && format != store.FormatCSV {
					return withExitCode(2, fmt.Errorf("--format %q: want json or csv", format))
				}
				runs, err := loadRuns(cmd.Context(), db, args[0])
				if err != nil {
					return err
				}
				run := runs[0]
				if output == "" || output == "-" {
					return store.WriteExport(cmd.OutOrStdout(), run, format)
				}
				return writeExportFile(output, func(w io.Writer) error { return store.WriteExport(w, run, format) })
			},
		}
		addDBFlag(c, &db)
		c.Flags().StringVar(&format, "format", "json", "json or csv")
		c.Flags().StringVarP(&output, "output", "o", "", "write to this file instead of stdout (replaced atomically)")
		return c
	})
}

// writeExportFile writes through a temporary file and renames it, so that a failed
// export never leaves a truncated file where a good one was.
func writeExportFile(path string, write func(io.Writer) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := write(tmp); err != nil {
		tmp.Close()
		return fmt.Errorf("export to %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("export to %s: %w", path, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
