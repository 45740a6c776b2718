package gateway

import (
	"fmt"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/meshmark/meshmark/internal/image"
	"github.com/meshmark/meshmark/internal/prereq"
)

// Image is the gateway's container image on a cluster: Envoy's own distroless image,
// at the release the local testbed runs, with Envoy at ImageEnvoy.
var Image = "docker.io/envoyproxy/envoy:distroless-v" + prereq.EnvoyVersion

// ImageEnvoy is where Image holds Envoy.
const ImageEnvoy = "/usr/local/bin/envoy"

// LocalImage is Image made on this machine of the Envoy that setup installed, with
// its libraries, for a local cluster, which reaches no registry.
func LocalImage() (image.Named, error) {
	envoy, err := prereq.Envoy()
	if err != nil {
		return image.Named{}, err
	}
	return image.Named{Name: Image, Build: func() (v1.Image, error) {
		real, err := filepath.EvalSymlinks(envoy)
		if err != nil {
			return nil, err
		}
		libs, err := image.SharedLibraries(real)
		if err != nil {
			return nil, fmt.Errorf("envoy's libraries: %w", err)
		}
		files := []image.File{{Path: ImageEnvoy, Source: real}, {Path: "/tmp", Dir: true, Mode: 0o1777}}
		seen := map[string]bool{ImageEnvoy: true, "/tmp": true}
		for _, f := range libs {
			if !seen[f.Path] {
				seen[f.Path] = true
				files = append(files, f)
			}
		}
		return image.FromFiles(files, image.Config{Entrypoint: []string{ImageEnvoy},
			Labels: map[string]string{"org.opencontainers.image.version": prereq.EnvoyVersion}})
	}}, nil
}
