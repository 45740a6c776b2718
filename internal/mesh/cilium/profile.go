// Package cilium is the cilium mesh profile: Cilium as its service-mesh documentation
// installs it on a Kubernetes cluster, from its own Helm chart. It owns the install's
// description (chart, pinned release, values, what the cluster must and must not hold),
// how enrollment shows (a ready agent on every node of the app), and how Cilium's own
// metrics are read into a trial's proxy counters.
//
// Cilium runs on Kubernetes only. It has no sidecar and no proxy process meshmark could
// start beside a pod: its data plane is eBPF programs the cilium agent loads into each
// node's kernel, as the cluster's CNI, with one Envoy per node for L7. So there is
// nothing to run on the local substrate, and the registration says so, which makes
// `meshmark validate` refuse the profile there. (The local cilium-envoy profile is the
// nearest the local substrate comes: Cilium's per-node Envoy design, without the eBPF
// datapath.)
//
// Being the cluster's CNI is also what decides where it can go. Cilium installs onto a
// cluster created without a pod network; installed beside another CNI it breaks both,
// so the install refuses a cluster where a known CNI's DaemonSet runs. And no other mesh
// (the baseline included) can start a pod on a cluster without a CNI, so a study on
// Kubernetes compares Cilium only with Cilium: its baseline is a plain Cilium, the CNI
// with its mesh features off (encryption: none, l7: off), as each of S5's meshes had a
// cluster of its own.
//
// Choices, and why:
//
//   - The chart is cilium/cilium from https://helm.cilium.io at 1.19.6: the release
//     whose chart these values were rendered against, with Helm's schema validation,
//     from the cilium/charts repository that helm.cilium.io serves. Newer releases
//     exist (1.20 patch releases, 1.20.4 by November 2026) and were not checked against
//     the values; cilium_version picks another release, cilium_chart a local copy of
//     the chart.
//   - Encryption defaults to WireGuard, Cilium's transparent encryption between nodes:
//     what the published comparisons ran as Cilium's "mTLS" (S5 installed Cilium with
//     encryption.type=wireguard). Cilium has no mTLS between pods, so the common mtls
//     option is refused with why; encryption: ipsec needs the key Secret Cilium's IPsec
//     guide has the user create first, and is refused until it exists.
//   - Mutual authentication (SPIRE, beta in Cilium) is off unless mutual_auth: spire:
//     it installs a SPIRE server and agents, whose server needs a persistent volume,
//     and only traffic a policy marks "authentication required" is authenticated.
//     With it meshmark applies one such policy, cluster-wide, to meshmark's pods, as S5
//     applied one to its app.
//   - The per-node Envoy (cilium-envoy, a DaemonSet of its own since Cilium 1.16) is on,
//     the chart's default, and l7: off turns the L7 proxy off. Cilium sends traffic
//     through it only where an L7 policy or a CiliumEnvoyConfig asks, and meshmark
//     applies none, so it costs its idle resources, as a stock install's does.
//   - The agent's metrics (prometheus.enabled) are turned on, since they are how a
//     trial sees what the datapath carried; that is the one value set for a stock
//     install.
package cilium

import (
	"context"
	"errors"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/published"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

// Name is the registry name.
const Name = "cilium"

// The values of the encryption and mutual_auth options.
const (
	EncryptionWireGuard = "wireguard"
	EncryptionIPsec     = "ipsec"
	EncryptionNone      = "none"

	MutualAuthSPIRE = "spire"
)

// Option names.
const (
	EncryptionOption = "encryption"
	L7Option         = "l7"
	MutualAuthOption = "mutual_auth"
	VersionOption    = "cilium_version"
	ChartOption      = "cilium_chart"
	ValuesOption     = "helm_values"
)

// kubernetesOnly is why the profile has nothing to run on the local substrate.
const kubernetesOnly = "Cilium's data plane is eBPF programs its agent loads into each node's kernel as the cluster's CNI, " +
	"with no proxy meshmark could run beside a pod; the local substrate's cilium-envoy profile is Cilium's per-node Envoy design alone"

func init() {
	mesh.RegisterProfile(mesh.Registration{
		Name:    Name,
		Summary: "Cilium on Kubernetes only: its Helm chart as the cluster's CNI (eBPF datapath, per-node Envoy), WireGuard encryption by default",
		New:     New,
		Stands:  []published.Stand{{For: "cilium"}},
		Own: map[string]string{
			EncryptionOption: EncryptionWireGuard + " (default: WireGuard between nodes) | " + EncryptionIPsec +
				" (needs the Secret kube-system/" + ipsecSecret + " Cilium's IPsec guide creates) | " + EncryptionNone,
			L7Option:         "on (default: the per-node Envoy, cilium-envoy, runs) | off (no L7 proxy)",
			MutualAuthOption: "off (default) | " + MutualAuthSPIRE + " (SPIRE mutual authentication, beta in Cilium, required between meshmark's pods by a cluster-wide policy)",
			VersionOption:    "the Cilium release whose chart is installed (default " + Version + ")",
			ChartOption:      "a local copy of the cilium chart (helm pull cilium/cilium --untar) to install instead of " + Repo + "'s",
			ValuesOption:     "chart values, {cilium: {...}}, over meshmark's own",
		},
		Unsupported: map[string]string{
			"mtls":             "Cilium has no mTLS between pods: it encrypts between nodes (option encryption) and authenticates with SPIRE (option mutual_auth)",
			"concurrency":      "the cilium chart does not set its Envoy's worker threads (Envoy's default, one per core)",
			"telemetry":        "Cilium's datapath counts what it forwards whatever the setting; meshmark reads the agent's metrics",
			"request_id":       "Cilium's Envoy is on the app's path only where an L7 policy puts it, and meshmark applies none",
			"access_log":       "Cilium's Envoy is on the app's path only where an L7 policy puts it, and meshmark applies none",
			"retries":          "Cilium's Envoy is on the app's path only where an L7 policy puts it, and meshmark applies none",
			"circuit_breakers": "Cilium's Envoy is on the app's path only where an L7 policy puts it, and meshmark applies none",
			"mesh_clients":     "Cilium's datapath carries every pod of a node: clients cannot be left out",
			"trust_domain":     "Cilium's SPIRE trust domain is its own (set it through helm_values if mutual_auth is spire)",
		},
		KubernetesOnly: kubernetesOnly,
	})
}

// Profile is one Cilium configuration.
type Profile struct {
	opts       mesh.Options
	encryption string
	l7         bool
	mutualAuth bool
}

var (
	_ mesh.Profile             = (*Profile)(nil)
	_ mesh.KubernetesInstaller = (*Profile)(nil)
)

// New builds the profile from parsed options; the options Kubernetes alone reads are
// checked by Kubernetes, which New calls so that validate sees their errors too.
func New(o mesh.Options) (mesh.Profile, error) {
	enc, err := o.OwnWord(EncryptionOption, EncryptionWireGuard, EncryptionWireGuard, EncryptionIPsec, EncryptionNone, "off")
	if err != nil {
		return nil, err
	}
	if enc == "off" {
		enc = EncryptionNone
	}
	l7, err := o.OwnBool(L7Option, true)
	if err != nil {
		return nil, err
	}
	auth, err := o.OwnWord(MutualAuthOption, "off", "off", MutualAuthSPIRE)
	if err != nil {
		return nil, err
	}
	p := &Profile{opts: o, encryption: enc, l7: l7, mutualAuth: auth == MutualAuthSPIRE}
	if _, err := p.Kubernetes(); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *Profile) Name() string { return Name }

// errKubernetesOnly is what the local substrate gets if a study built in code reaches
// it past the validator and the preflight, which both refuse the profile there.
var errKubernetesOnly = errors.New(Name + " runs on spec.substrate.kubernetes only: " + kubernetesOnly)

// Install refuses the local substrate.
func (p *Profile) Install(context.Context, substrate.Substrate, *topology.App) error {
	return errKubernetesOnly
}

// Check refuses the local substrate.
func (p *Profile) Check(context.Context, substrate.Substrate, *topology.App) (mesh.Enrollment, error) {
	return mesh.Enrollment{}, errKubernetesOnly
}

// Configs is empty: on Kubernetes the install's values are stored as its effort.
func (p *Profile) Configs() map[string][]byte { return map[string][]byte{} }

// Uninstall has nothing to remove on the local substrate.
func (p *Profile) Uninstall(context.Context, substrate.Substrate) error { return nil }
