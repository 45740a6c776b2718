package cli

import (
	"github.com/meshmark/meshmark/internal/substrate/kube/plaintextprobe"
	"github.com/spf13/cobra"
)

func init() {
	// What the plaintext probe's pods run on a cluster under strict mTLS (see
	// kube.ProbePlaintext), from meshmark-pod; hidden, since nobody types it.
	register(func() *cobra.Command {
		return podCommand(plaintextprobe.Command, plaintextprobe.Command+" --target SERVICE=HOST:PORT[/PROTOCOL]... [--message-file FILE]",
			"Call each target once in plaintext, as a caller outside the mesh, and report how each ended (a probe pod's command)", "", true)
	})
}
