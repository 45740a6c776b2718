package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/meshmark/meshmark/internal/localcluster"
	"github.com/meshmark/meshmark/internal/store"
	"github.com/meshmark/meshmark/internal/substrate/kube"
	"github.com/meshmark/meshmark/internal/testbed"
	"github.com/spf13/cobra"
)

func init() {
	register(func() *cobra.Command {
		var opts testbed.CleanOptions
		var db string
		var k8s kubeFlags
		c := &cobra.Command{
			Use:   "clean [run-id...]",
			Short: "Remove what killed runs left behind: processes, network namespaces, /etc/netns entries, run directories, local clusters",
			Long: "clean removes the objects of local testbeds whose owner process is dead " +
				"(namespaces mm-<id>-*, /etc/netns/mm-<id>-*, " + testbed.RunRoot + "/<id>) and the " +
				"processes still running in them, local clusters (meshmark cluster up) whose bring-up or test " +
				"died, and marks stored results runs whose owner died as " +
				"incomplete. Runs whose owner lives are left alone unless --all. " +
				"Nothing without the meshmark prefix is touched.",
			RunE: func(cmd *cobra.Command, args []string) error {
				if k8s.enabled {
					return cleanKubernetes(cmd, k8s, db, opts.All, args)
				}
				opts.Runs = args
				report, err := testbed.Clean(cmd.Context(), opts)
				out := cmd.OutOrStdout()
				for _, run := range report.Runs {
					if run.SkippedReason != "" {
						fmt.Fprintf(out, "run %s: kept (%s)\n", run.ID, run.SkippedReason)
						continue
					}
					fmt.Fprintf(out, "run %s:", run.ID)
					if run.Owner != 0 {
						state := "dead"
						if run.OwnerAlive {
							state = "alive"
						}
						fmt.Fprintf(out, " owner pid %d (%s)", run.Owner, state)
					}
					fmt.Fprintln(out)
					for _, pid := range run.Killed {
						fmt.Fprintf(out, "  killed process %d\n", pid)
					}
					for _, ns := range run.Namespaces {
						fmt.Fprintf(out, "  removed network namespace %s\n", ns)
					}
					for _, dir := range run.EtcNetns {
						fmt.Fprintf(out, "  removed %s\n", dir)
					}
					if run.RunDir != "" {
						fmt.Fprintf(out, "  removed %s\n", run.RunDir)
					}
				}
				clusters, cerr := localcluster.Clean(cmd.Context(), opts.All, cmd.ErrOrStderr())
				removedCluster := false
				for _, c := range clusters {
					if c.Removed {
						removedCluster = true
						fmt.Fprintf(out, "local cluster %s: removed (%s)\n", c.Name, c.Why)
					} else {
						fmt.Fprintf(out, "local cluster %s: kept (%s)\n", c.Name, c.Why)
					}
				}
				err = errors.Join(err, cerr)
				marked, serr := markAbandoned(cmd, db)
				for _, id := range marked {
					fmt.Fprintf(out, "results run %s: owner is gone, marked incomplete\n", id)
				}
				if !report.Removed() && !removedCluster && len(marked) == 0 && err == nil && serr == nil {
					fmt.Fprintln(out, "nothing to clean")
				}
				return errors.Join(err, serr)
			},
		}
		c.Flags().BoolVar(&opts.All, "all", false, "also remove runs whose owner process is alive (or, with --kubernetes, runs from other hosts)")
		c.Flags().BoolVar(&k8s.enabled, "kubernetes", false, "clean a Kubernetes cluster instead of this host: delete the namespaces meshmark labelled whose run is gone (stored runs whose owner died are marked incomplete either way)")
		c.Flags().StringVar(&k8s.kubeconfig, "kubeconfig", "", "with --kubernetes: the kubeconfig file (default $KUBECONFIG, then ~/.kube/config)")
		c.Flags().StringVar(&k8s.context, "context", "", "with --kubernetes: the kubeconfig context (default its current one)")
		addDBFlag(c, &db)
		return c
	})
}

// markAbandoned opens the results store, which marks runs whose owner died as
// incomplete, and returns them. A database that does not exist yet is left uncreated:
// there is nothing in it to mark.
func markAbandoned(cmd *cobra.Command, db string) ([]string, error) {
	path := db
	if path == "" {
		var err error
		if path, err = store.DefaultPath(); err != nil {
			return nil, err
		}
	}
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	s, err := store.Open(cmd.Context(), path)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return s.Abandoned(), nil
}

type kubeFlags struct {
	enabled             bool
	kubeconfig, context string
}

// cleanKubernetes deletes the namespaces meshmark labelled on a cluster whose owner
// process is gone, and waits until the cluster has removed them and what was in them;
// as the local clean does, it marks the stored runs whose owner died incomplete.
func cleanKubernetes(cmd *cobra.Command, f kubeFlags, db string, all bool, runs []string) error {
	out := cmd.OutOrStdout()
	c, err := kube.Connect(cmd.Context(), kube.Config{Kubeconfig: f.kubeconfig, Context: f.context})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "cluster %s (context %s)\n", c.Server, c.ContextName)
	lastLeft := -1
	report, err := c.Clean(cmd.Context(), kube.CleanOptions{All: all, Runs: runs, Progress: func(left int) {
		if left != lastLeft && left > 0 {
			fmt.Fprintf(cmd.ErrOrStderr(), "waiting for %d namespace(s) to terminate\n", left)
		}
		lastLeft = left
	}})
	removed := 0
	for _, ns := range report {
		what := "namespace " + ns.Name
		if ns.Run != "" {
			what += " (run " + ns.Run + ")"
		}
		if strings.Contains(ns.Name, "/") {
			what = ns.Name // a cluster-scoped object, kind/name
		}
		if ns.Kept != "" {
			fmt.Fprintf(out, "%s: kept (%s)\n", what, ns.Kept)
			continue
		}
		removed++
		fmt.Fprintf(out, "%s: removed\n", what)
	}
	marked, serr := markAbandoned(cmd, db)
	for _, id := range marked {
		fmt.Fprintf(out, "results run %s: owner is gone, marked incomplete\n", id)
	}
	if removed == 0 && len(marked) == 0 && err == nil && serr == nil {
		fmt.Fprintln(out, "nothing to clean")
	}
	return errors.Join(err, serr)
}
