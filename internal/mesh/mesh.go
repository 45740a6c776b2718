// Package mesh owns the mesh-profile contract: what a mesh must do to a deployed app
// (install its data plane before the workload starts, prove every pod is enrolled, hand
// over its generated configs), the typed options a study file sets for it, and the
// registry that lets a new mesh be added as one package that registers itself.
// Profiles live in subpackages (none, envoysidecar); import them for their init.
package mesh

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/meshmark/meshmark/internal/image"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"github.com/meshmark/meshmark/internal/published"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

// Profile turns a mesh choice into processes, configs and interception rules.
//
// Lifecycle, per app deployment: the runner brings up pods (without workloads), calls
// Install, starts the workload processes, waits for them, calls Check and stores the
// Enrollment with the results, runs the load, then calls Uninstall (or tears the pods
// down, which also removes everything a profile put there). Install runs before the
// workload because interception must already be in place when the first connection is
// made; a proxy whose upstream is not listening yet simply fails those few requests.
type Profile interface {
	// Name is the registry name, e.g. "envoy-sidecar".
	Name() string
	// Install puts the data plane in place for app on sub.
	Install(ctx context.Context, sub substrate.Substrate, app *topology.App) error
	// Check drives probe traffic and reports, as data, whether every pod is enrolled
	// the way the profile claims. An error means the check itself could not run; a
	// failed enrollment is Enrollment.Pass == false.
	Check(ctx context.Context, sub substrate.Substrate, app *topology.App) (Enrollment, error)
	// Configs returns every generated config (by a path-like name) for provenance.
	// Private keys are never included.
	Configs() map[string][]byte
	// Uninstall stops the processes Install started and removes its rules, so the
	// same pods can be reused. It is safe to call after a failed or partial Install.
	Uninstall(ctx context.Context, sub substrate.Substrate) error
}

// Factory builds a profile from parsed options. It must not touch the machine: the
// study validator calls it to check a file, so `meshmark validate` says exactly what
// `meshmark run` will accept.
type Factory func(Options) (Profile, error)

// Registration is what a profile package tells the registry about itself.
type Registration struct {
	Name string
	// Summary is one line for `meshmark mesh list`.
	Summary string
	New     Factory
	// Own documents the options only this profile takes (key -> accepted values and
	// default); their raw values reach the factory in Options.Own.
	Own map[string]string
	// Unsupported names common options that mean nothing for this profile, with why:
	// a study file setting one is refused rather than silently ignored.
	Unsupported map[string]string
	// Needs names the prerequisites (prereq item names, e.g. "envoy",
	// "linkerd2-proxy", or "kernel:MODULE" for a kernel module such as xt_TPROXY) the
	// profile runs, so a study is checked before its first trial.
	Needs []string
	// KubernetesOnly, when set, says why the profile runs on a Kubernetes cluster only
	// (it is the mesh installed there, with no data plane meshmark can run locally).
	// The study validator refuses it on the local substrate with this reason, so that
	// `meshmark validate` says what `meshmark run` will do.
	KubernetesOnly string
	// LocalImages, when set, are the images the mesh's Kubernetes install runs, made on
	// this machine under the names its charts ask for, which `meshmark cluster up`
	// loads into a local cluster's nodes (such a cluster reaches no registry).
	LocalImages func() ([]image.Named, error)
	// SMPType is the mesh type the Service Mesh Performance spec's enum gives the mesh
	// whose data plane design the profile reproduces ("istio", "linkerd", "maesh"), for
	// the SMP export; empty when the enum has no such mesh, and the export then writes
	// the profile's own name.
	SMPType string
	// Stands are the published studies' meshes the profile can stand for (see
	// internal/published), with how faithfully.
	Stands []published.Stand
	// OnCluster is how the mesh shows on a Kubernetes cluster whatever its options,
	// which meshmark reads for every registered mesh at once (see KnownClusterMarks).
	OnCluster meshkube.ClusterMarks
}

// ErrImagesNotBuilt is what a mesh's LocalImages returns, wrapped with how to build
// them, when the build its images are made of is not on this machine (one only a user
// who asks for it makes, such as Linkerd's from source).
var ErrImagesNotBuilt = errors.New("images not built")

// LocalImages are the images every registered mesh needs on a local cluster, each name
// once, and a note for each mesh whose images are not built here (ErrImagesNotBuilt),
// which a local cluster then runs without.
func LocalImages() (images []image.Named, notBuilt []string, err error) {
	registryMu.RLock()
	defer registryMu.RUnlock()
	var names []string
	for n := range registry {
		names = append(names, n)
	}
	sort.Strings(names)
	seen := map[string]bool{}
	for _, n := range names {
		r := registry[n]
		if r.LocalImages == nil {
			continue
		}
		ims, err := r.LocalImages()
		if errors.Is(err, ErrImagesNotBuilt) {
			notBuilt = append(notBuilt, fmt.Sprintf("mesh %s: %v", n, err))
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("mesh %s: %w", n, err)
		}
		for _, im := range ims {
			if !seen[im.Name] {
				seen[im.Name] = true
				images = append(images, im)
			}
		}
	}
	return images, notBuilt, nil
}

// KubernetesProfiles are the registered profiles that go onto a Kubernetes cluster
// (their profile, built with the default options, is a KubernetesInstaller), sorted.
func KubernetesProfiles() []string {
	var out []string
	for _, n := range Names() {
		if p, err := New(n, nil); err == nil {
			if _, ok := p.(KubernetesInstaller); ok {
				out = append(out, n)
			}
		}
	}
	return out
}

// SMPType is the SMP export's mesh type of a profile: its registered SMPType, else its
// own name (the spec's enum has no "no mesh", and writing nothing would claim its
// first entry, App Mesh).
func SMPType(profile string) string {
	if r, ok := Lookup(profile); ok && r.SMPType != "" {
		return r.SMPType
	}
	return profile
}

// KnownClusterMarks gathers the ClusterMarks of every registered mesh: the sidecar
// containers of all of them (sorted, each once), and the gateway labels and opt-outs
// of all of them together, so that a pod meshmark keeps outside the mesh stays outside
// any of them, and a cluster's pods are told apart whichever mesh put them there.
func KnownClusterMarks() meshkube.KnownMarks {
	registryMu.RLock()
	defer registryMu.RUnlock()
	var k meshkube.KnownMarks
	for _, r := range registry {
		m := r.OnCluster
		if m.Sidecar != "" && !slices.Contains(k.Sidecars, m.Sidecar) {
			k.Sidecars = append(k.Sidecars, m.Sidecar)
		}
		k.GatewayPodLabels = union(k.GatewayPodLabels, m.GatewayPodLabels)
		k.Outside.NamespaceLabels = union(k.Outside.NamespaceLabels, m.Outside.NamespaceLabels)
		k.Outside.NamespaceAnnotations = union(k.Outside.NamespaceAnnotations, m.Outside.NamespaceAnnotations)
		k.Outside.PodLabels = union(k.Outside.PodLabels, m.Outside.PodLabels)
		k.Outside.PodAnnotations = union(k.Outside.PodAnnotations, m.Outside.PodAnnotations)
	}
	sort.Strings(k.Sidecars)
	return k
}

// union adds from to into, which it creates when needed. Two meshes that set the same
// key to different values would each undo the other's opt-out: RegisterProfile
// refuses that, so here the values agree.
func union(into, from map[string]string) map[string]string {
	if len(from) == 0 {
		return into
	}
	if into == nil {
		into = map[string]string{}
	}
	maps.Copy(into, from)
	return into
}

var (
	registryMu sync.RWMutex
	registry   = map[string]Registration{}
)

// Register adds a profile that takes the common options only.
func Register(name string, f Factory) {
	RegisterProfile(Registration{Name: name, New: f})
}

// RegisterProfile adds a profile; each profile package calls it from init.
func RegisterProfile(r Registration) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if _, dup := registry[r.Name]; dup {
		panic("mesh: profile registered twice: " + r.Name)
	}
	for k := range r.Own {
		if _, common := optionKeys[k]; common {
			panic("mesh: profile " + r.Name + " redefines common option " + k)
		}
	}
	if err := marksAgree(r.OnCluster, registry); err != nil {
		panic("mesh: profile " + r.Name + ": " + err.Error())
	}
	registry[r.Name] = r
}

// Names lists the registered profiles, sorted.
func Names() []string {
	registryMu.RLock()
	defer registryMu.RUnlock()
	out := make([]string, 0, len(registry))
	for n := range registry {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Lookup returns a profile's registration.
func Lookup(name string) (Registration, bool) {
	registryMu.RLock()
	defer registryMu.RUnlock()
	r, ok := registry[name]
	return r, ok
}

// StandsOf returns the published meshes a profile can stand for; none for a profile
// not registered.
func StandsOf(profile string) []published.Stand {
	r, _ := Lookup(profile)
	return r.Stands
}

// StandingFor says, for a message, which profiles can stand for a study's mesh:
// "envoy-sidecar with mtls on".
func StandingFor(r *published.Role) string {
	var out []string
	for _, name := range Names() {
		reg, _ := Lookup(name)
		for _, st := range reg.Stands {
			if st.For != r.Name {
				continue
			}
			what := name
			if c := cmp.Or(st.MTLS, r.MTLS); c != "" {
				what += " with mtls " + c
			}
			out = append(out, what)
		}
	}
	if len(out) == 0 {
		return "no profile stands for " + r.Title
	}
	return strings.Join(out, " or ")
}

// New builds the named profile from raw study-file options (see ParseOptionsFor).
// Option errors are *OptionError, so callers can point at the offending key.
func New(name string, raw map[string]any) (Profile, error) {
	reg, ok := Lookup(name)
	if !ok {
		return nil, fmt.Errorf("unknown mesh %q (known: %v)", name, Names())
	}
	opts, err := ParseOptionsFor(reg, raw)
	if err != nil {
		return nil, fmt.Errorf("mesh %s: %w", name, err)
	}
	p, err := reg.New(opts)
	if err != nil {
		return nil, fmt.Errorf("mesh %s: %w", name, err)
	}
	return p, nil
}
