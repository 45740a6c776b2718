package analysis

import (
	"sort"

	"github.com/meshmark/meshmark/internal/results"
)

// Loopback is the interface name NetworkUsage treats as loopback.
const Loopback = "lo"

// NetworkUsage is the traffic of one network interface of one pod at one measuring
// point of one mesh, averaged over the repeats.
//
// Rates come from the cumulative counters: per trial (last − first) / elapsed between
// the first and last sample of the interface; the trials' rates are summed and divided
// by the number of trials that had the interface (as Resources does with CPU). A trial
// with fewer than two samples of the interface, no elapsed time, or a counter that went
// backwards (the interface was recreated) contributes nothing.
//
// Loopback ("lo") is left out when its counters did not move in any trial of the
// group, and kept when they did: in sidecar meshes lo carries the proxy↔application
// hop inside the pod, which is traffic the mesh adds.
type NetworkUsage struct {
	Key
	Label     string `json:"label"`
	Pod       string `json:"pod"`
	Node      string `json:"node,omitempty"`
	Interface string `json:"interface"`
	// Trials is the number of trials the rates are averaged over.
	Trials          int     `json:"trials"`
	RxBytesPerSec   float64 `json:"rx_bytes_per_s"`
	TxBytesPerSec   float64 `json:"tx_bytes_per_s"`
	RxPacketsPerSec float64 `json:"rx_packets_per_s"`
	TxPacketsPerSec float64 `json:"tx_packets_per_s"`
	// RxDropped and TxDropped are the packets dropped during the measured windows,
	// summed over the trials (not averaged: any drop is worth seeing).
	RxDropped int64 `json:"rx_dropped"`
	TxDropped int64 `json:"tx_dropped"`
}

type netKey struct{ pod, node, iface string }

// Network summarises the network samples of every group, one row per pod interface,
// ordered by pod, node and interface within each group.
func Network(groups []*Group) []NetworkUsage {
	var out []NetworkUsage
	for _, g := range groups {
		type acc struct {
			trials               int
			rx, tx, rxPkt, txPkt float64
			rxDrop, txDrop       int64
			moved                bool
		}
		by := map[netKey]*acc{}
		for _, t := range g.Trials {
			per := map[netKey][]results.NetSample{}
			for _, s := range t.Result.Network {
				k := netKey{s.Pod, s.Node, s.Interface}
				per[k] = append(per[k], s)
			}
			for k, ss := range per {
				if len(ss) < 2 {
					continue
				}
				sort.SliceStable(ss, func(i, j int) bool { return ss[i].T.Before(ss[j].T) })
				first, last := ss[0], ss[len(ss)-1]
				secs := last.T.Sub(first.T).Seconds()
				d := [6]int64{last.RxBytes - first.RxBytes, last.TxBytes - first.TxBytes, last.RxPackets - first.RxPackets,
					last.TxPackets - first.TxPackets, last.RxDropped - first.RxDropped, last.TxDropped - first.TxDropped}
				if secs <= 0 || d[0] < 0 || d[1] < 0 || d[2] < 0 || d[3] < 0 || d[4] < 0 || d[5] < 0 {
					continue
				}
				a := by[k]
				if a == nil {
					a = &acc{}
					by[k] = a
				}
				a.trials++
				a.rx += float64(d[0]) / secs
				a.tx += float64(d[1]) / secs
				a.rxPkt += float64(d[2]) / secs
				a.txPkt += float64(d[3]) / secs
				a.rxDrop += d[4]
				a.txDrop += d[5]
				if d != [6]int64{} {
					a.moved = true
				}
			}
		}
		keys := make([]netKey, 0, len(by))
		for k, a := range by {
			if k.iface == Loopback && !a.moved {
				continue
			}
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool {
			a, b := keys[i], keys[j]
			if a.pod != b.pod {
				return a.pod < b.pod
			}
			if a.node != b.node {
				return a.node < b.node
			}
			return a.iface < b.iface
		})
		for _, k := range keys {
			a := by[k]
			n := float64(a.trials)
			out = append(out, NetworkUsage{Key: g.Key, Label: g.Label, Pod: k.pod, Node: k.node, Interface: k.iface, Trials: a.trials,
				RxBytesPerSec: a.rx / n, TxBytesPerSec: a.tx / n, RxPacketsPerSec: a.rxPkt / n, TxPacketsPerSec: a.txPkt / n,
				RxDropped: a.rxDrop, TxDropped: a.txDrop})
		}
	}
	return out
}
