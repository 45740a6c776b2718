// Command meshmark measures what a service mesh costs and whether its security holds.
package main

import (
	"os"

	"github.com/meshmark/meshmark/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:]))
}
