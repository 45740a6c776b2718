package cli

import (
	"errors"
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/meshmark/meshmark/internal/image"
	"github.com/meshmark/meshmark/internal/podcmd"
	"github.com/spf13/cobra"
)

func init() {
	register(func() *cobra.Command {
		c := &cobra.Command{
			Use:   "image",
			Short: "The container image that runs meshmark's in-pod roles (meshmark-pod) in Kubernetes pods",
		}
		c.AddCommand(newImageBuild())
		return c
	})
}

func newImageBuild() *cobra.Command {
	var opts image.Options
	var out, push, tag string
	c := &cobra.Command{
		Use:   "build",
		Short: "Build the meshmark image and write it as an OCI archive, push it, or both",
		Long: `build puts meshmark-pod, the small binary of meshmark's in-pod roles (the workload
service, the load generator, the plaintext probe, pause), at ` + image.BinaryPath + ` as
the entrypoint of a one-layer image on the empty base (scratch), without Docker. By
default it is the meshmark-pod beside this meshmark, where ` + "`make build`" + ` puts it
(statically linked; a binary built otherwise must be, with CGO_ENABLED=0). Nothing is
pulled unless --base names a base image.

--out writes an OCI archive named --tag for 'kind load image-archive' or
'ctr images import'; --push writes the image to a registry (credentials as docker
login stores them). See docs/kubernetes.md.`,
		Example: `  make build
  bin/meshmark image build --out meshmark.tar
  kind load image-archive meshmark.tar --name CLUSTER
  bin/meshmark image build --push registry.example/meshmark:v1`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 0 {
				return withExitCode(2, fmt.Errorf("image build takes no arguments, got %q", args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" && push == "" {
				return withExitCode(2, errors.New("image build: nothing to do: give --out FILE, --push REF or both"))
			}
			// Bad names fail before the minutes a build and a push can take.
			if _, err := name.NewTag(tag); err != nil {
				return withExitCode(2, fmt.Errorf("--tag: %w", err))
			}
			if push != "" {
				if _, err := name.ParseReference(push); err != nil {
					return withExitCode(2, fmt.Errorf("--push: %w", err))
				}
			}
			opts.Version = Version
			opts.Context = cmd.Context()
			if opts.Binary == "" {
				bin, err := podcmd.Find()
				if err != nil {
					return err
				}
				opts.Binary = bin
			}
			img, err := image.Build(opts)
			if err != nil {
				return err
			}
			digest, err := img.Digest()
			if err != nil {
				return err
			}
			stdout := cmd.OutOrStdout()
			fmt.Fprintf(stdout, "built image %s\n", digest)
			if out != "" {
				if err := image.WriteArchive(out, img, tag); err != nil {
					return err
				}
				fmt.Fprintf(stdout, "wrote %s (OCI archive, %s)\n", out, tag)
			}
			if push != "" {
				ref, err := image.Push(cmd.Context(), img, push, opts.Insecure, pushProgress(cmd, push))
				if err != nil {
					return err
				}
				fmt.Fprintf(stdout, "pushed %s@%s\n", ref.Context().Name(), digest)
			}
			return nil
		},
	}
	c.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return withExitCode(2, err) })
	fl := c.Flags()
	fl.StringVar(&opts.Binary, "binary", "", "meshmark-pod binary to put in the image (default: the one beside this meshmark)")
	fl.StringVar(&opts.Base, "base", "", "base image to pull and build on (default: none, scratch)")
	fl.BoolVar(&opts.Insecure, "insecure", false, "allow plain HTTP to the --base and --push registries")
	fl.StringVarP(&out, "out", "o", "", "write the image to `FILE` as an OCI archive")
	fl.StringVar(&push, "push", "", "push the image to `REF`, e.g. registry.example/meshmark:v1")
	fl.StringVar(&tag, "tag", image.DefaultTag(Version), "name of the image in the --out archive")
	return c
}

// pushProgress reports every tenth of the bytes uploaded on stderr, so that a large
// push shows it is moving without flooding a CI log.
func pushProgress(cmd *cobra.Command, ref string) func(complete, total int64) {
	last := int64(-1)
	return func(complete, total int64) {
		if total <= 0 {
			return
		}
		if step := complete * 10 / total; step > last {
			last = step
			fmt.Fprintf(cmd.ErrOrStderr(), "pushing %s: %.1f of %.1f MiB\n", ref, mib(complete), mib(total))
		}
	}
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }
