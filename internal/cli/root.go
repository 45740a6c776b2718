// Package cli holds meshmark's cobra commands. Commands stay thin: they parse flags,
// call into the packages that own the work and print what those return.
package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/spf13/cobra"
)

// Version is set at build time with -ldflags "-X github.com/meshmark/meshmark/internal/cli.Version=...".
// A build without it is "dev", with the commit it was built from when Go recorded one
// ("dev+1a2b3c4d5e6f", ".dirty" for uncommitted changes), so that two dev builds of
// different sources are told apart (runnerVersionEnv).
var Version = devVersion("dev")

// devVersion adds the build's commit to a "dev" version.
func devVersion(v string) string {
	info, ok := debug.ReadBuildInfo()
	if v != "dev" || !ok {
		return v
	}
	var rev, dirty string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = ".dirty"
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev == "" {
		return v
	}
	return v + "+" + rev + dirty
}

// runnerVersionEnv is set, in every pod the Kubernetes substrate starts, to the version
// of the meshmark that starts it (kube.RunnerVersionEnv): a pod whose image holds
// another meshmark refuses to run, naming both, rather than speak a protocol or take
// flags the runner does not mean.
const runnerVersionEnv = "MESHMARK_RUNNER_VERSION"

// checkRunnerVersion refuses to run a command in a pod started by a meshmark of another
// version.
func checkRunnerVersion() error {
	want := os.Getenv(runnerVersionEnv)
	if want == "" || want == Version {
		return nil
	}
	return withExitCode(2, fmt.Errorf("this image's meshmark is %s, but the meshmark that started this pod is %s: build the image from the runner's own binary (`meshmark image build`) and give the cluster that one", Version, want))
}

// exitError carries a specific process exit code out of a command.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// withExitCode makes a command fail with the given exit code instead of 1.
func withExitCode(code int, err error) error { return &exitError{code: code, err: err} }

// registry of subcommand constructors; each command file adds itself in init so that
// adding a command touches one file.
var commands []func() *cobra.Command

func register(f func() *cobra.Command) { commands = append(commands, f) }

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "meshmark",
		Short:         "Measure what a service mesh costs, against no mesh, with honest error bars",
		Version:       Version,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			return checkRunnerVersion()
		},
	}
	for _, f := range commands {
		root.AddCommand(f())
	}
	return root
}

// Main runs the command line and returns the process exit code. SIGINT and SIGTERM
// cancel the command's context so that every command can clean up before exiting.
func Main(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := newRoot()
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintln(os.Stderr, "meshmark:", err)
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	if ctx.Err() != nil {
		return 130
	}
	return 1
}
