package image

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// WriteArchive writes img to path as an OCI image layout in a tar archive, the form
// `ctr images import` and `kind load image-archive` read, with img named tag. The file
// appears only once it is complete.
func WriteArchive(path string, img v1.Image, tag string) error {
	t, err := name.NewTag(tag)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	err = errors.Join(f.Chmod(0o644), writeArchive(f, img, tag, t))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

func writeArchive(w io.Writer, img v1.Image, tag string, t name.Tag) error {
	mt, err := img.MediaType()
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	size, err := img.Size()
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	registry := t.RegistryStr()
	if registry == name.DefaultRegistry {
		// Kubernetes and containerd spell Docker Hub this way; the other spelling
		// would name an image no pod refers to.
		registry = "docker.io"
	}
	index, err := json.Marshal(v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType: mt,
			Size:      size,
			Digest:    digest,
			Annotations: map[string]string{
				"org.opencontainers.image.ref.name": tag,
				// containerd names an imported image by this one; from ref.name alone
				// `ctr images import` would name it only with --base-name.
				"io.containerd.image.name": registry + "/" + t.RepositoryStr() + ":" + t.TagStr(),
			},
			Platform: &v1.Platform{OS: cf.OS, Architecture: cf.Architecture, Variant: cf.Variant},
		}},
	})
	if err != nil {
		return err
	}

	tw := tar.NewWriter(w)
	file := func(name string, size int64, r io.Reader) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: size, ModTime: epoch}); err != nil {
			return err
		}
		_, err := io.Copy(tw, r)
		return err
	}
	small := func(name string, data []byte) error { return file(name, int64(len(data)), bytes.NewReader(data)) }
	blob := func(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

	if err := small("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := small("index.json", index); err != nil {
		return err
	}
	for _, dir := range []string{"blobs/", "blobs/" + digest.Algorithm + "/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: epoch}); err != nil {
			return err
		}
	}
	manifest, err := img.RawManifest()
	if err != nil {
		return err
	}
	if err := small(blob(digest), manifest); err != nil {
		return err
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	configName, err := img.ConfigName()
	if err != nil {
		return err
	}
	if err := small(blob(configName), config); err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	// A base may hold the same layer twice; a layout holds each blob once.
	written := map[v1.Hash]bool{}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return err
		}
		if written[d] {
			continue
		}
		written[d] = true
		size, err := l.Size()
		if err != nil {
			return err
		}
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		err = file(blob(d), size, rc)
		rc.Close()
		if err != nil {
			return err
		}
	}
	return tw.Close()
}
