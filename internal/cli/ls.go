package cli

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/store"
	"github.com/spf13/cobra"
)

// addDBFlag gives a results command the --db flag (store.Open treats "" as
// $MESHMARK_DB, then the per-user data directory).
func addDBFlag(c *cobra.Command, path *string) {
	c.Flags().StringVar(path, "db", "", "results database (default $MESHMARK_DB, else $XDG_DATA_HOME/meshmark/results.db or ~/.local/share/meshmark/results.db)")
}

// loadRuns opens the results database and loads the runs named by refs (ids, unique id
// prefixes or "last"); store.ErrNotFound comes back wrapped for a ref that matches none.
func loadRuns(ctx context.Context, db string, refs ...string) ([]*results.Run, error) {
	s, err := store.Open(ctx, db)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	runs := make([]*results.Run, len(refs))
	for i, ref := range refs {
		if runs[i], err = s.LoadRun(ctx, ref); err != nil {
			return nil, err
		}
	}
	return runs, nil
}

func init() {
	register(func() *cobra.Command {
		var db string
		c := &cobra.Command{
			Use:   "ls",
			Short: "List stored runs, newest first",
			Long: "ls lists the runs in the results database. A run whose process died is shown as " +
				"incomplete: its committed trials are intact and can be shown, exported and compared.",
			Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				s, err := store.Open(cmd.Context(), db)
				if err != nil {
					return err
				}
				defer s.Close()
				runs, err := s.ListRuns(cmd.Context())
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				if len(runs) == 0 {
					fmt.Fprintf(out, "no runs in %s\n", s.Path())
					return nil
				}
				tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tSTARTED\tDURATION\tSTATUS\tSTUDY\tMESHES\tEXPERIMENTS\tTRIALS")
				for _, r := range runs {
					dur := "-"
					if !r.Ended.IsZero() {
						dur = r.Ended.Sub(r.Started).Round(time.Second).String()
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\n", r.ID, r.Started.Local().Format(time.DateTime), dur, r.Status,
						r.Study, strings.Join(r.Meshes, ","), strings.Join(r.Experiments, ","), r.Trials)
				}
				return tw.Flush()
			},
		}
		addDBFlag(c, &db)
		return c
	})
}
