package nodeenvoy

import (
	"bufio"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/meshmark/meshmark/internal/topology"
)

// Chain holds the profile's rules, in pods (nat OUTPUT) and nodes (nat PREROUTING).
const Chain = "MM-NODEPROXY"

// PodRules stop a pod from translating service addresses itself: a connection to a
// VIP is ACCEPTed in the nat table before the testbed's service chain sees it, so it
// leaves for the node (the pod's gateway) still addressed to the VIP.
//
// Without l7 a pod keeps translating its own service's VIP: the node would have to
// send the connection back to the address it came from, and on the testbed's routed
// pod network that never completes (observed: the translated SYN never reaches
// POSTROUTING; kube-proxy relies on the bridge's hairpin mode and br_netfilter). With l7 the node's Envoy dials the pod from the
// node's own address, so even those calls go through the node.
func PodRules(app *topology.App, pod topology.Pod, l7 bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "*nat\n:%s - [0:0]\n", Chain)
	for _, s := range app.Services {
		if !s.VIP.IsValid() || (!l7 && s.Name == pod.Service) {
			continue
		}
		fmt.Fprintf(&b, "-A %s -d %s/32 -p tcp -m tcp --dport %d -m comment --comment \"service %s to the node\" -j ACCEPT\n", Chain, s.VIP, s.Port, s.Name)
	}
	fmt.Fprintf(&b, "-I OUTPUT 1 -p tcp -j %s\nCOMMIT\n", Chain)
	return b.String()
}

// NodeRules steer the node's pods' service connections: with l7 to the node's Envoy
// (REDIRECT to ProxyPort; Envoy reads the VIP back with SO_ORIGINAL_DST), without it
// through a counting rule only, on to the testbed's own service translation in the
// same PREROUTING hook. Each rule names its service, so its packet counter (the first
// packet of each connection: nat sees nothing else) counts the service's connections.
func NodeRules(app *topology.App, l7 bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "*nat\n:%s - [0:0]\n", Chain)
	for _, s := range app.Services {
		if !s.VIP.IsValid() {
			continue
		}
		target := "RETURN"
		if l7 {
			target = fmt.Sprintf("REDIRECT --to-ports %d", ProxyPort)
		}
		fmt.Fprintf(&b, "-A %s -d %s/32 -p tcp -m tcp --dport %d -m comment --comment \"service %s\" -j %s\n", Chain, s.VIP, s.Port, s.Name, target)
	}
	fmt.Fprintf(&b, "-I PREROUTING 1 -p tcp -j %s\nCOMMIT\n", Chain)
	return b.String()
}

// removeRules undoes PodRules (hook OUTPUT) or NodeRules (hook PREROUTING).
func removeRules(hook string) string {
	return fmt.Sprintf("*nat\n-D %s -p tcp -j %s\n-F %s\n-X %s\nCOMMIT\n", hook, Chain, Chain, Chain)
}

var counterLine = regexp.MustCompile(`^\[(\d+):\d+\] -A ` + Chain + ` .*--comment "service ([a-z0-9-]+)"`)

// ParseRuleCounters reads `iptables-save -c -t nat` output: connections per service
// from the node rules' packet counters.
func ParseRuleCounters(out string) map[string]uint64 {
	got := map[string]uint64{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		m := counterLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		n, err := strconv.ParseUint(m[1], 10, 64)
		if err == nil {
			got[m[2]] += n
		}
	}
	return got
}
