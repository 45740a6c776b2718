// Command meshmark-pod runs what meshmark runs inside pods: the workload service, the
// load generator, the plaintext probe and pause (package podcmd). It links none of
// meshmark's Helm, Kubernetes client, Istio API, SQLite or CLI, so that a pod's memory
// and cache footprint is its role's.
package main

import (
	"os"

	"github.com/meshmark/meshmark/internal/podcmd"
)

func main() {
	os.Exit(podcmd.Main(os.Args[1:], os.Stdout, os.Stderr))
}
