// Package cli holds meshmark's cobra commands. Commands stay thin: they parse flags,
// call into the packages that own the work and print what those return.
package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/meshmark/meshmark/internal/podcmd"
)

// Version is set at build time with -ldflags "-X github.com/meshmark/meshmark/internal/cli.Version=..."
// (`make build` gives it the commit). A build without it is "dev", with the commit it
// was built from when Go recorded one (podcmd.BuildVersion), so that two dev builds of
// different sources are told apart (podcmd.CheckRunnerVersion).
var Version = "dev"

func init() { Version = podcmd.BuildVersion(Version) }

// checkRunnerVersion refuses to run a command in a pod started by a meshmark of another
// version.
func checkRunnerVersion() error {
	if err := podcmd.CheckRunnerVersion(Version); err != nil {
		return withExitCode(2, err)
	}
	return nil
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
