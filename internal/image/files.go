package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// File is one file of an image made from files: a copy of a host file (Source) or the
// given bytes (Data), or a symbolic link (Link).
type File struct {
	Path   string // absolute path in the image
	Source string
	Data   []byte
	Link   string
	Dir    bool  // an empty directory (such as /tmp)
	Mode   int64 // 0 means the source's mode, or 0644 for Data (0755 for a directory)
}

// Config is what an image made from files runs.
type Config struct {
	Entrypoint []string
	Cmd        []string
	Env        []string
	WorkingDir string
	User       string // uid[:gid]; empty is root
	Labels     map[string]string
}

// FromFiles makes a one-layer image on the empty base holding files, uncompressed, with their parent
// directories, owned by root and dated epoch, so that the same files give the same
// digest. It is how a local cluster gets the images of the components it runs (the
// pause container, CoreDNS, a mesh's control plane and proxies) without a registry.
func FromFiles(files []File, cfg Config) (v1.Image, error) {
	layer, arch, err := filesLayer(files)
	if err != nil {
		return nil, err
	}
	img, err := mutate.Append(empty.Image, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "meshmark image (files)"},
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Created = v1.Time{Time: epoch}
	cf.OS, cf.Architecture = "linux", arch
	cf.Config.Entrypoint, cf.Config.Cmd = cfg.Entrypoint, cfg.Cmd
	cf.Config.Env = cfg.Env
	if !slices.ContainsFunc(cfg.Env, func(e string) bool { return strings.HasPrefix(e, "PATH=") }) {
		cf.Config.Env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, cfg.Env...)
	}
	cf.Config.WorkingDir, cf.Config.User = cfg.WorkingDir, cfg.User
	cf.Config.Labels = map[string]string{"org.opencontainers.image.source": Source}
	for k, v := range cfg.Labels {
		cf.Config.Labels[k] = v
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, err
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	return mutate.ConfigMediaType(img, types.OCIConfigJSON), nil
}

// filesLayer writes files into one uncompressed tar layer and says which architecture
// its executables are for (amd64 when it holds none).
func filesLayer(files []File) (v1.Layer, string, error) {
	sorted := append([]File(nil), files...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Path < sorted[j].Path })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	arch := ""
	for _, f := range sorted {
		if !path.IsAbs(f.Path) {
			return nil, "", fmt.Errorf("image file %q: not an absolute path", f.Path)
		}
		name := f.Path[1:]
		var parents []string
		for d := path.Dir(name); d != "." && !dirs[d]; d = path.Dir(d) {
			parents = append(parents, d)
		}
		for i := len(parents) - 1; i >= 0; i-- {
			dirs[parents[i]] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: parents[i] + "/", Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
				return nil, "", err
			}
		}
		if f.Dir {
			mode := f.Mode
			if mode == 0 {
				mode = 0o755
			}
			dirs[name] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
				return nil, "", err
			}
			continue
		}
		if f.Link != "" {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: f.Link, Mode: 0o777, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
				return nil, "", err
			}
			continue
		}
		data, mode := f.Data, f.Mode
		if f.Source != "" {
			st, err := os.Stat(f.Source)
			if err != nil {
				return nil, "", err
			}
			if data, err = os.ReadFile(f.Source); err != nil {
				return nil, "", err
			}
			if mode == 0 {
				mode = int64(st.Mode().Perm())
			}
		}
		if mode == 0 {
			mode = 0o644
		}
		if a, _, err := inspect(data); err == nil && arch == "" {
			arch = a
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return nil, "", err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, "", err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, "", err
	}
	if arch == "" {
		arch = "amd64"
	}
	// Uncompressed: these images go from this machine into a local cluster's nodes,
	// where compressing a hundred megabytes of binaries would only cost a minute.
	return static.NewLayer(buf.Bytes(), types.OCIUncompressedLayer), arch, nil
}

var lddLine = regexp.MustCompile(`(?:=>\s*)?(/\S+)\s+\(0x[0-9a-f]+\)`)

// SharedLibraries lists the host's files a dynamically linked executable needs to run
// in an image of its own: each library ldd resolves, and the dynamic loader, at the
// paths the executable will look for them. A static executable needs none.
func SharedLibraries(executable string) ([]File, error) {
	f, err := elf.Open(executable)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", executable, err)
	}
	interp := ""
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, err := io.ReadAll(p.Open())
			if err == nil {
				interp = strings.TrimRight(string(b), "\x00")
			}
		}
	}
	shared := f.Type == elf.ET_DYN && interp == ""
	libs, _ := f.ImportedLibraries()
	f.Close()
	if interp == "" && !(shared && len(libs) > 0) {
		return nil, nil // static
	}
	out, err := exec.Command("ldd", executable).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", executable, err)
	}
	seen := map[string]bool{}
	var files []File
	add := func(p string) error {
		if seen[p] {
			return nil
		}
		seen[p] = true
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			return fmt.Errorf("%s needs %s: %w", executable, p, err)
		}
		files = append(files, File{Path: p, Source: real})
		return nil
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if m := lddLine.FindStringSubmatch(sc.Text()); m != nil {
			if err := add(m[1]); err != nil {
				return nil, err
			}
		}
	}
	if interp == "" {
		return files, nil // a library: its loader comes with the executable that loads it
	}
	return files, add(interp)
}

// Named is an image under the name pods ask for it by, built when it is needed.
type Named struct {
	Name string // e.g. docker.io/istio/pilot:1.31.1
	// Aliases are more names of the same image (a chart's variants of a tag).
	Aliases []string
	Build   func() (v1.Image, error)
}

// xtablesModules is where Debian keeps iptables' extensions, which it loads by name at
// run time, so that ldd does not list them.
const xtablesModules = "/usr/lib/x86_64-linux-gnu/xtables"

// HostIptables are the host's iptables tools for an image whose programs program a
// pod's netfilter rules (Istio's istio-init and istio-cni): the nft and legacy
// multi-call binaries under every name those programs call them by, iptables'
// extensions, and the libraries of both. The kernel is the host's, so its tools fit it.
func HostIptables() ([]File, error) {
	var files []File
	seen := map[string]bool{}
	addWithLibs := func(path string) error {
		if seen[path] {
			return nil
		}
		seen[path] = true
		files = append(files, File{Path: path, Source: path, Mode: 0o755})
		libs, err := SharedLibraries(path)
		if err != nil {
			return err
		}
		for _, l := range libs {
			if !seen[l.Path] {
				seen[l.Path] = true
				files = append(files, l)
			}
		}
		return nil
	}
	multi := map[string]string{"xtables-nft-multi": "nft", "xtables-legacy-multi": "legacy"}
	for bin, kind := range multi {
		if err := addWithLibs("/usr/sbin/" + bin); err != nil {
			return nil, fmt.Errorf("iptables tools (Debian's iptables package): %w", err)
		}
		for _, fam := range []string{"iptables", "ip6tables"} {
			for _, suffix := range []string{"", "-save", "-restore"} {
				files = append(files, File{Path: "/usr/sbin/" + fam + "-" + kind + suffix, Link: bin})
				// The plain names are the nft ones, as Debian's alternatives make them.
				if kind == "nft" {
					files = append(files, File{Path: "/usr/sbin/" + fam + suffix, Link: bin})
				}
			}
		}
	}
	mods, err := filepath.Glob(filepath.Join(xtablesModules, "*.so"))
	if err != nil || len(mods) == 0 {
		return nil, fmt.Errorf("iptables extensions: none in %s", xtablesModules)
	}
	for _, m := range mods {
		if err := addWithLibs(m); err != nil {
			return nil, err
		}
	}
	return files, nil
}
