package linkerd

import (
	"fmt"
	"strings"
)

// Chain names are linkerd2-proxy-init's, so anyone who knows Linkerd can read the rules.
const (
	chainInbound  = "PROXY_INIT_REDIRECT"
	chainOutbound = "PROXY_INIT_OUTPUT"
)

// Interception is what linkerd2-proxy-init writes into a pod's nat table: every inbound
// TCP connection to the proxy's inbound port except the proxy's own admin and control
// ports, and every outbound TCP connection not made by the proxy's uid and not on
// loopback to its outbound port.
type Interception struct {
	ProxyUID     int
	InboundPort  int   // 4143
	OutboundPort int   // 4140
	SkipInbound  []int // 4190, 4191
	// Outbound is false for a pod whose outbound traffic is not intercepted (unused by
	// the profile, kept so tests can remove one direction).
	Outbound bool
}

// InstallRules renders the rules as an iptables-restore file applied with --noflush.
// The jumps go first in PREROUTING and OUTPUT so they act before the substrate's
// service DNAT: the outbound proxy must see the service address as the original
// destination, as it does in Kubernetes where kube-proxy's DNAT comes later.
func (ic Interception) InstallRules() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("*nat")
	w(":%s - [0:0]", chainInbound)
	w(":%s - [0:0]", chainOutbound)
	if len(ic.SkipInbound) > 0 {
		ports := make([]string, len(ic.SkipInbound))
		for i, p := range ic.SkipInbound {
			ports[i] = fmt.Sprint(p)
		}
		w("-A %s -p tcp -m multiport --dports %s -j RETURN", chainInbound, strings.Join(ports, ","))
	}
	w("-A %s -p tcp -j REDIRECT --to-ports %d", chainInbound, ic.InboundPort)
	if ic.Outbound {
		w("-A %s -m owner --uid-owner %d -j RETURN", chainOutbound, ic.ProxyUID)
		w("-A %s -o lo -j RETURN", chainOutbound)
		w("-A %s -p tcp -j REDIRECT --to-ports %d", chainOutbound, ic.OutboundPort)
	}
	w("-I PREROUTING 1 -p tcp -j %s", chainInbound)
	w("-I OUTPUT 1 -p tcp -j %s", chainOutbound)
	w("COMMIT")
	return b.String()
}

// RemoveRules undoes InstallRules.
func (ic Interception) RemoveRules() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("*nat")
	w("-D PREROUTING -p tcp -j %s", chainInbound)
	w("-D OUTPUT -p tcp -j %s", chainOutbound)
	w("-F %s", chainInbound)
	w("-F %s", chainOutbound)
	w("-X %s", chainInbound)
	w("-X %s", chainOutbound)
	w("COMMIT")
	return b.String()
}
