// Package podcmd owns the commands that run inside a pod, on the local testbed and on
// Kubernetes: the workload service, the load generator, the plaintext probe and pause.
// The small binary cmd/meshmark-pod runs them and nothing else, so that what a pod
// costs in memory and cache is the role's, not meshmark's whole (Helm, client-go,
// SQLite and the rest stay in the big binary); `meshmark service`, `meshmark generator`
// and `meshmark plaintext-probe` run the same code. Flags are the standard library's,
// spelt as meshmark's (--name value or --name=value).
package podcmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
)

// Name is the small binary's name: `make build` puts it beside meshmark in bin/.
const Name = "meshmark-pod"

// UsageError is a command line a role cannot run: the process exits 2.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

func usage(format string, a ...any) error { return &UsageError{Err: fmt.Errorf(format, a...)} }

// role is one in-pod command.
type role struct {
	name, summary string
	run           func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var roles = []role{
	{"service", "run one service of a workload graph (what each workload pod runs)", Service},
	{"generator", "serve load plans over gRPC (a load-generator pod, or the local testbed's generator)", Generator},
	{"plaintext-probe", "call each target once in plaintext, as a caller outside the mesh (a probe pod)", PlaintextProbe},
	{"pause", "wait for SIGTERM or SIGINT, reaping children (a pod sandbox's first process)", Pause},
	{"version", "print the version", func(_ context.Context, _ []string, stdout, _ io.Writer) error {
		_, err := fmt.Fprintln(stdout, Name, Version)
		return err
	}},
}

// Main runs the command line of the small binary and returns its exit code: 0, 1 for a
// failure, 2 for a usage error. SIGINT and SIGTERM cancel the role's context.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		w := stderr
		if len(args) > 0 {
			w = stdout
		}
		fmt.Fprintf(w, "usage: %s ROLE [FLAGS]: the commands meshmark runs inside pods\n\nroles:\n", Name)
		for _, r := range roles {
			fmt.Fprintf(w, "  %-16s %s\n", r.name, r.summary)
		}
		fmt.Fprintf(w, "\n%s ROLE --help lists a role's flags.\n", Name)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if args[0] != "version" {
		if err := CheckRunnerVersion(Version); err != nil {
			fmt.Fprintf(stderr, "%s %s: %v\n", Name, args[0], err)
			return 2
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := Run(ctx, args[0], args[1:], stdout, stderr)
	if err == nil {
		return 0
	}
	fmt.Fprintf(stderr, "%s %s: %v\n", Name, args[0], err)
	var ue *UsageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}

// Run runs one role with its arguments. A usage error is a *UsageError; --help prints
// the role's flags and is no error.
func Run(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	i := slices.IndexFunc(roles, func(r role) bool { return r.name == name })
	if i < 0 {
		var names []string
		for _, r := range roles {
			names = append(names, r.name)
		}
		return usage("unknown role %q: want %s", name, strings.Join(names, ", "))
	}
	err := roles[i].run(ctx, args, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

// flags is a role's flag set, writing its usage to stderr.
func flags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(Name+" "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parse parses args into fs; a bad flag or a stray argument is a usage error.
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &UsageError{Err: err}
	}
	if fs.NArg() > 0 {
		return usage("unexpected arguments %q", fs.Args())
	}
	return nil
}

// strings is a repeatable string flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }
