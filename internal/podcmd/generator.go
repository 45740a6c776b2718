package podcmd

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"

	"github.com/meshmark/meshmark/internal/loadgen"
)

// Generator serves load plans over gRPC until ctx ends (package loadgen): each plan a
// load.Spec and this generator's share of it, one at a time, streaming every interval
// back as it ends. --listen takes host:port, or unix:PATH for a socket that only the
// file's permissions let in (the local testbed's generator, driven from outside its
// pod's network namespace).
func Generator(ctx context.Context, args []string, _, stderr io.Writer) error {
	var (
		listen, namespace, rawDir string
		allowAny                  bool
		resolve                   stringList
	)
	fs := flags("generator", stderr)
	fs.StringVar(&listen, "listen", "127.0.0.1:7070", "address to serve plans on: host:port, or unix:PATH")
	fs.StringVar(&namespace, "allow-namespace", "", "also load the Kubernetes services of this namespace, by name")
	fs.BoolVar(&allowAny, "allow-any-target", false, "load any address (only ones you own)")
	fs.Var(&resolve, "resolve", "HOST:PORT:ADDR: dial ADDR for HOST:PORT (repeatable)")
	fs.StringVar(&rawDir, "raw-dir", "", "keep every request of every plan as a raw CSV log in this directory")
	if err := parse(fs, args); err != nil {
		return err
	}
	rmap, err := loadgen.ParseResolve(resolve)
	if err != nil {
		return &UsageError{Err: err}
	}
	if rawDir != "" {
		if err := os.MkdirAll(rawDir, 0o755); err != nil {
			return err
		}
	}
	network, addr := "tcp", listen
	if path, ok := strings.CutPrefix(listen, "unix:"); ok {
		network, addr = "unix", path
		// A socket left by a generator that was killed would refuse the bind.
		if st, err := os.Lstat(path); err == nil && st.Mode()&os.ModeSocket != 0 {
			_ = os.Remove(path)
		}
	}
	lis, err := net.Listen(network, addr)
	if err != nil {
		return err
	}
	srv := loadgen.NewServer(loadgen.ServerOptions{
		AllowAnyTarget: allowAny, AllowNamespace: namespace, Resolve: rmap, RawDir: rawDir, Log: stderr,
	})
	fmt.Fprintf(stderr, "generator listening on %s\n", listen)
	stopped := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			srv.Stop()
		case <-stopped:
		}
	}()
	err = srv.Serve(lis)
	close(stopped)
	if network == "unix" {
		_ = os.Remove(addr)
	}
	if ctx.Err() != nil {
		return nil
	}
	return err
}
