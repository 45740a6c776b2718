package ambient

import "fmt"

// Marks istio-cni's in-pod rules use: ztunnel marks its own sockets in the pod with
// 0x539 (1337); connections it accepted are connmarked 0x111 so their replies route
// back to it (original-source spoofing needs table 100's local route).
const (
	ztunnelMark = "0x539/0xfff"
	connMark    = "0x111/0xfff"
	routeTable  = "100"
	rulePref    = "32764"
	// InboundPlaintextPort, HBONEPort and OutboundPort are ztunnel's in-pod listeners.
	InboundPlaintextPort = 15006
	HBONEPort            = 15008
	OutboundPort         = 15001
	// MetricsPort serves ztunnel's Prometheus metrics on the node.
	MetricsPort = 15020
	// ReadinessPort serves /healthz/ready on the node.
	ReadinessPort = 15021
	// kubeletProbeIP is the link-local source istio-cni exempts (kubelet probes are
	// SNATed to it); kept so the rules read as Istio's.
	kubeletProbeIP = "169.254.7.127/32"
)

// InPodRules are the iptables rules istio-cni writes in an ambient pod's namespace
// (ztunnel's scripts/ztunnel-redirect-inpod.sh, without the DNS capture that the
// testbed's /etc/hosts makes moot). The jumps go first in OUTPUT and PREROUTING so they
// act before the testbed's service DNAT: ztunnel must see the service VIP, as it does
// in Kubernetes where kube-proxy rules live on the node, not in the pod.
func InPodRules() string {
	return fmt.Sprintf(`*mangle
:ISTIO_OUTPUT - [0:0]
:ISTIO_PRERT - [0:0]
-I PREROUTING 1 -j ISTIO_PRERT
-I OUTPUT 1 -j ISTIO_OUTPUT
-A ISTIO_OUTPUT -m connmark --mark %[2]s -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff
-A ISTIO_PRERT -m mark --mark %[1]s -j CONNMARK --set-xmark %[2]s
COMMIT
*nat
:ISTIO_OUTPUT - [0:0]
:ISTIO_PRERT - [0:0]
-I OUTPUT 1 -j ISTIO_OUTPUT
-I PREROUTING 1 -j ISTIO_PRERT
-A ISTIO_OUTPUT -d %[3]s -p tcp -m tcp -j ACCEPT
-A ISTIO_OUTPUT -p tcp -m mark --mark %[2]s -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark %[1]s -j REDIRECT --to-ports %[4]d
-A ISTIO_PRERT -s %[3]s -p tcp -m tcp -j ACCEPT
-A ISTIO_PRERT ! -d 127.0.0.1/32 -p tcp ! --dport %[5]d -m mark ! --mark %[1]s -j REDIRECT --to-ports %[6]d
COMMIT
`, ztunnelMark, connMark, kubeletProbeIP, OutboundPort, HBONEPort, InboundPlaintextPort)
}

// RemoveInPodRules undoes InPodRules.
func RemoveInPodRules() string {
	return `*mangle
-D PREROUTING -j ISTIO_PRERT
-D OUTPUT -j ISTIO_OUTPUT
-F ISTIO_OUTPUT
-F ISTIO_PRERT
-X ISTIO_OUTPUT
-X ISTIO_PRERT
COMMIT
*nat
-D OUTPUT -j ISTIO_OUTPUT
-D PREROUTING -j ISTIO_PRERT
-F ISTIO_OUTPUT
-F ISTIO_PRERT
-X ISTIO_OUTPUT
-X ISTIO_PRERT
COMMIT
`
}

// routeCommands set up (and tear down) the policy routing for connmarked replies.
var (
	routeUp = [][]string{
		{"ip", "route", "add", "local", "0.0.0.0/0", "dev", "lo", "table", routeTable},
		{"ip", "rule", "add", "fwmark", connMark, "pref", rulePref, "lookup", routeTable},
	}
	routeDown = [][]string{
		{"ip", "rule", "del", "pref", rulePref},
		{"ip", "route", "flush", "table", routeTable},
	}
)
