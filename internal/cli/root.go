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
)

// Version is set at build time with -ldflags "-X github.com/meshmark/meshmark/internal/cli.Version=...".
var Version = "dev"

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
