package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/meshmark/meshmark/internal/gateway"
	"github.com/meshmark/meshmark/internal/image"
	"github.com/meshmark/meshmark/internal/localcluster"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/podcmd"
	"github.com/spf13/cobra"
)

func init() {
	register(func() *cobra.Command {
		c := &cobra.Command{
			Use:   "cluster",
			Short: "A real Kubernetes cluster on this machine, for Kubernetes studies without a cluster of your own",
			Long: `cluster up brings up a real Kubernetes cluster on this Linux machine without Docker:
etcd and the control plane, a kubelet and a containerd per node (Debian's containerd
and runc), bridge CNI, an nftables kube-proxy and CoreDNS, all inside a network
namespace of its own with addresses of 198.18.0.0/15. The host reaches only the API
server, on a loopback port; the context ` + localcluster.DefaultName + ` is merged into your
kubeconfig, and meshmark's image and the meshes' images are loaded into the nodes, so
the Kubernetes examples run against it with context: ` + localcluster.DefaultName + `.
cluster down removes everything it made. Both need root; ` + "`meshmark setup --for cluster`" + `
installs or builds the parts.`,
		}
		c.AddCommand(newClusterUp(), newClusterDown(), newClusterList(), newClusterLoad())
		return c
	})
}

func newClusterUp() *cobra.Command {
	var opts localcluster.Options
	c := &cobra.Command{
		Use:   "up",
		Short: "Bring a local cluster up and merge its context into your kubeconfig",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.Progress = cmd.ErrOrStderr()
			var err error
			if opts.PauseBinary, err = podcmd.Find(); err != nil {
				return err
			}
			if opts.Images, err = clusterImages(cmd.ErrOrStderr()); err != nil {
				return err
			}
			cl, err := localcluster.Up(cmd.Context(), opts)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "cluster %s is up in %s: %d nodes, API server %s\n", opts.Name, cl.Took.Round(100*time.Millisecond), len(cl.State.Nodes), cl.Server)
			if cl.State.Context != "" {
				fmt.Fprintf(out, "context %s in %s (now current)\n", cl.State.Context, cl.State.Kubeconfig)
			}
			fmt.Fprintf(out, "take it down with: meshmark cluster down --name %s\n", opts.Name)
			return nil
		},
	}
	c.Flags().StringVar(&opts.Name, "name", localcluster.DefaultName, "the cluster's name, also its kubeconfig context")
	c.Flags().IntVar(&opts.Nodes, "nodes", 2, fmt.Sprintf("number of nodes (1 to %d)", localcluster.MaxNodes))
	c.Flags().StringVar(&opts.Kubeconfig, "kubeconfig", "", "the kubeconfig to merge the context into (default: $KUBECONFIG's first file, else ~/.kube/config; - for none)")
	c.Flags().DurationVar(&opts.Timeout, "wait", 5*time.Minute, "how long to wait for the cluster to be ready")
	return c
}

func newClusterDown() *cobra.Command {
	var name string
	c := &cobra.Command{
		Use:   "down",
		Short: "Take a local cluster down and remove everything it made",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			start := time.Now()
			if err := localcluster.Down(cmd.Context(), name, cmd.ErrOrStderr()); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "cluster %s removed in %s\n", name, time.Since(start).Round(100*time.Millisecond))
			return nil
		},
	}
	c.Flags().StringVar(&name, "name", localcluster.DefaultName, "the cluster's name")
	return c
}

func newClusterLoad() *cobra.Command {
	var name string
	c := &cobra.Command{
		Use:   "load",
		Short: "Load this meshmark's image and the meshes' images into a running local cluster again (after a rebuild)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			images, err := clusterImages(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			start := time.Now()
			if err := localcluster.LoadImages(cmd.Context(), name, images); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "loaded %d images into cluster %s in %s\n", len(images), name, time.Since(start).Round(100*time.Millisecond))
			return nil
		},
	}
	c.Flags().StringVar(&name, "name", localcluster.DefaultName, "the cluster's name")
	return c
}

func newClusterList() *cobra.Command {
	return &cobra.Command{
		Use:   "ls",
		Short: "List local clusters",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			names, err := localcluster.List()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if len(names) == 0 {
				fmt.Fprintln(out, "no local cluster")
				return nil
			}
			for _, n := range names {
				st, err := localcluster.Load(n)
				if errors.Is(err, os.ErrNotExist) {
					fmt.Fprintf(out, "%s\t(no state: meshmark clean removes it)\n", n)
					continue
				}
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "%s\t%s\t%d nodes\thttps://127.0.0.1:%d\tsince %s\n", n, st.Phase, len(st.Nodes), st.APIPort, st.Since.Local().Format(time.DateTime))
			}
			return nil
		},
	}
}

// clusterImages are the images a local cluster gets besides its own: meshmark's, under
// the name the Kubernetes examples use and under this version's, and every mesh's that
// is built here, and Envoy's for the ingress gateway; w hears of an image that is not
// built here, which the cluster runs without.
func clusterImages(w io.Writer) ([]localcluster.Image, error) {
	bin, err := podcmd.Find()
	if err != nil {
		return nil, err
	}
	var out []localcluster.Image
	tags := []string{"meshmark:dev"}
	if t := image.DefaultTag(Version); t != tags[0] {
		tags = append(tags, t)
	}
	for _, tag := range tags {
		out = append(out, localcluster.Image{Name: tag, Build: func() (v1.Image, error) {
			return image.Build(image.Options{Binary: bin, Version: Version})
		}})
	}
	// The ingress path's plain gateway (package gateway) is Envoy's image.
	if gw, err := gateway.LocalImage(); err != nil {
		fmt.Fprintf(w, "not loaded: the ingress gateway's Envoy image: %v\n", err)
	} else {
		out = append(out, gw)
	}
	meshes, notBuilt, err := mesh.LocalImages()
	if err != nil {
		return nil, err
	}
	for _, n := range notBuilt {
		fmt.Fprintf(w, "not loaded: %s\n", n)
	}
	return append(out, meshes...), nil
}
