package podcmd

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"

	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
	"github.com/meshmark/meshmark/internal/substrate/kube/plaintextprobe"
)

// PlaintextProbe calls each --target once in plaintext, as a caller outside the mesh
// (after --control, the positive control, has answered), and reports how each ended on stdout and in --message-file (a probe pod's
// termination message; package plaintextprobe).
func PlaintextProbe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		targets     stringList
		controlArg  string
		messageFile string
	)
	fs := flags(plaintextprobe.Command, stderr)
	fs.Var(&targets, "target", "a service to call: SERVICE=HOST:PORT[/PROTOCOL], protocol http (default), h2c or grpc; repeatable")
	fs.StringVar(&controlArg, "control", "", "a positive control: a service outside the mesh that must answer, as --target; called first, again while it refuses (up to 15s), and reported last")
	fs.StringVar(&messageFile, "message-file", "", "also write the report here (a pod's termination message file)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if len(targets) == 0 {
		return usage("no --target")
	}
	var ts []meshprobe.PlaintextTarget
	for _, s := range targets {
		t, err := plaintextprobe.ParseTarget(s)
		if err != nil {
			return &UsageError{Err: err}
		}
		ts = append(ts, t)
	}
	var control *meshprobe.PlaintextTarget
	if controlArg != "" {
		t, err := plaintextprobe.ParseTarget(controlArg)
		if err != nil {
			return &UsageError{Err: fmt.Errorf("--control: %w", err)}
		}
		control = &t
	}
	report := plaintextprobe.Run(ctx, ts, control, (&net.Dialer{}).DialContext)
	// The log keeps the report too, which the pod's status falls back to when the file
	// cannot be written.
	fmt.Fprintln(stdout, string(report))
	if messageFile != "" {
		if err := os.WriteFile(messageFile, report, 0o644); err != nil {
			return fmt.Errorf("writing the report: %w", err)
		}
	}
	return nil
}
