package envoysidecar

import (
	"fmt"
	"strings"

	"github.com/meshmark/meshmark/internal/substrate"
)

// Chain names are istio-iptables' so anyone who knows Istio can read the rules.
const (
	chainInbound    = "ISTIO_INBOUND"
	chainInRedirect = "ISTIO_IN_REDIRECT"
	chainOutput     = "ISTIO_OUTPUT"
	chainRedirect   = "ISTIO_REDIRECT"
)

// Interception says which traffic of one pod goes through its sidecar.
type Interception struct {
	// InboundPorts are redirected to the inbound listener when they arrive at the pod;
	// InboundAll redirects every port instead (Istio's includeInboundPorts "*"), except
	// ExcludeInbound.
	InboundPorts   []int
	InboundAll     bool
	ExcludeInbound []int
	// Outbound redirects every outbound TCP connection not made by the proxy itself.
	Outbound     bool
	ProxyUID     int
	InboundPort  int // 15006
	OutboundPort int // 15001
}

// InstallRules renders the interception as an iptables-restore file for the pod's nat
// table. It is applied with --noflush so the substrate's own rules stay; the jumps are
// inserted first in PREROUTING and OUTPUT so they act before the substrate's service
// DNAT (the proxy routes by the original service address; its own connections return
// from ISTIO_OUTPUT and are DNATed as usual).
func (ic Interception) InstallRules() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("*nat")
	for _, c := range []string{chainInbound, chainInRedirect, chainOutput, chainRedirect} {
		w(":%s - [0:0]", c)
	}
	w("-A %s -p tcp -j REDIRECT --to-ports %d", chainInRedirect, ic.InboundPort)
	w("-A %s -p tcp -j REDIRECT --to-ports %d", chainRedirect, ic.OutboundPort)
	if ic.InboundAll {
		for _, p := range ic.ExcludeInbound {
			w("-A %s -p tcp --dport %d -j RETURN", chainInbound, p)
		}
		w("-A %s -p tcp -j %s", chainInbound, chainInRedirect)
	} else {
		for _, p := range ic.InboundPorts {
			w("-A %s -p tcp --dport %d -j %s", chainInbound, p, chainInRedirect)
		}
	}
	if ic.Outbound {
		uid := ic.ProxyUID
		// The proxy dials the local app from 127.0.0.6: leave that alone.
		w("-A %s -s %s/32 -o lo -j RETURN", chainOutput, InboundPassthroughSource)
		// The proxy dialling its own pod (a pod calling its own service) goes back
		// through the inbound side, as it would from any other pod.
		w("-A %s ! -d 127.0.0.1/32 -o lo -p tcp -m owner --uid-owner %d -j %s", chainOutput, uid, chainInRedirect)
		// Anything else on loopback that is not the proxy stays local.
		w("-A %s -o lo -m owner ! --uid-owner %d -j RETURN", chainOutput, uid)
		// The proxy's own upstream connections must not loop back into it.
		w("-A %s -m owner --uid-owner %d -j RETURN", chainOutput, uid)
		w("-A %s ! -d 127.0.0.1/32 -o lo -p tcp -m owner --gid-owner %d -j %s", chainOutput, uid, chainInRedirect)
		w("-A %s -o lo -m owner ! --gid-owner %d -j RETURN", chainOutput, uid)
		w("-A %s -m owner --gid-owner %d -j RETURN", chainOutput, uid)
		w("-A %s -d 127.0.0.1/32 -j RETURN", chainOutput)
		w("-A %s -j %s", chainOutput, chainRedirect)
	}
	w("-I PREROUTING 1 -p tcp -j %s", chainInbound)
	w("-I OUTPUT 1 -p tcp -j %s", chainOutput)
	w("COMMIT")
	return b.String()
}

// RemoveRules undoes InstallRules.
func (ic Interception) RemoveRules() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("*nat")
	w("-D PREROUTING -p tcp -j %s", chainInbound)
	w("-D OUTPUT -p tcp -j %s", chainOutput)
	for _, c := range []string{chainInbound, chainInRedirect, chainOutput, chainRedirect} {
		w("-F %s", c)
	}
	for _, c := range []string{chainInbound, chainInRedirect, chainOutput, chainRedirect} {
		w("-X %s", c)
	}
	w("COMMIT")
	return b.String()
}

// IstioExcludedInboundPorts are the ports istio-iptables leaves out of inbound capture
// whatever the pod's annotations say: HBONE (15008), Envoy's Prometheus stats (15090),
// the health port (15021) and pilot-agent's merged metrics (15020). A connection to
// one of them reaches whatever listens there in the pod without the sidecar.
var IstioExcludedInboundPorts = []int{15008, 15090, 15021, 15020}

// istioInterception is the sidecar interception of a pod serving appPort: every
// inbound port but Istio's exclusions, as Istio's default includeInboundPorts "*"
// does, so that a port the app opens beside its service port is inside the mesh too.
// A pod serving nothing (a client, appPort 0) gets outbound capture only.
func istioInterception(appPort int) Interception {
	ic := Interception{Outbound: true, ProxyUID: substrate.ProxyUID, InboundPort: InboundPort, OutboundPort: OutboundPort}
	if appPort > 0 {
		ic.InboundAll, ic.ExcludeInbound = true, IstioExcludedInboundPorts
	}
	return ic
}
