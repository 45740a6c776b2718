package envoysidecar

import (
	"fmt"
	"io"
	"strings"

	"github.com/meshmark/meshmark/internal/gateway"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/istiohelm"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
)

const (
	// IstioSidecar is the container istiod's injection adds to every enrolled pod.
	IstioSidecar = "istio-proxy"
	// IstioStatsPort is where istio-proxy's Envoy serves its own stats in Prometheus
	// format (/stats/prometheus) on the pod's address. Its admin port, which the local
	// profile reads, listens on the pod's loopback only, and the pod's 15020 merges the
	// agent's and the app's metrics into Envoy's.
	IstioStatsPort = 15090
	// istioRequests is Istio's standard request metric, one series per reporter, source
	// and destination; the sidecar of the pod a request arrives at reports it as
	// destination.
	istioRequests = "istio_requests_total"
)

var _ mesh.KubernetesInstaller = (*Profile)(nil)

// Kubernetes describes the Istio install this configuration stands for: Istio in
// sidecar mode as Istio's Helm documentation installs it (the base chart, then istiod,
// into istio-system), namespaces labelled istio-injection=enabled. Options that
// meshmark does not carry over to Istio yet are refused rather than dropped, so that a
// result never claims a setting the cluster did not have.
func (p *Profile) Kubernetes() (meshkube.KubernetesInstall, error) {
	o, def := p.opts, mesh.DefaultOptions()
	switch {
	case len(p.exempt) > 0:
		return meshkube.KubernetesInstall{}, istiohelm.NotCarried(PlaintextServicesOption)
	case o.Telemetry != def.Telemetry:
		return meshkube.KubernetesInstall{}, istiohelm.NotCarried("telemetry")
	case o.RequestID != def.RequestID:
		return meshkube.KubernetesInstall{}, istiohelm.NotCarried("request_id")
	case o.Retries != def.Retries:
		return meshkube.KubernetesInstall{}, istiohelm.NotCarried("retries")
	case o.CircuitBreakers != def.CircuitBreakers:
		return meshkube.KubernetesInstall{}, istiohelm.NotCarried("circuit_breakers")
	case o.TrustDomain != def.TrustDomain:
		return meshkube.KubernetesInstall{}, istiohelm.NotCarried("trust_domain")
	}
	meshConfig := map[string]any{}
	if o.Concurrency != def.Concurrency {
		meshConfig["defaultConfig"] = map[string]any{"concurrency": o.Concurrency}
	}
	if o.AccessLog {
		meshConfig["accessLogFile"] = "/dev/stdout"
	}
	var manifests []string
	switch p.mode {
	case mesh.MTLSStrict:
		manifests = append(manifests, istiohelm.PeerAuthentication("STRICT"))
	case mesh.MTLSOff:
		manifests = append(manifests, istiohelm.PeerAuthentication("DISABLE"))
		meshConfig["enableAutoMtls"] = false
	}
	istiod := istiohelm.Istiod
	if len(meshConfig) > 0 {
		istiod.Values = map[string]any{"meshConfig": meshConfig}
	}
	charts, err := istiohelm.Charts(o, istiohelm.Base, istiod)
	if err != nil {
		return meshkube.KubernetesInstall{}, err
	}
	ingress, err := istiohelm.Ingress(gateway.Port)
	if err != nil {
		return meshkube.KubernetesInstall{}, err
	}
	return meshkube.KubernetesInstall{
		Ingress:   ingress,
		Charts:    charts,
		Manifests: manifests,
		// istio-init writes each pod's iptables with NET_ADMIN and NET_RAW, which Pod
		// Security's baseline level refuses: Istio's docs label such namespaces
		// privileged (or install istio-cni, which this profile does not).
		NamespaceLabels: map[string]string{"istio-injection": "enabled", meshkube.PodSecurityEnforce: meshkube.PodSecurityPrivileged},
		Sidecar:         IstioSidecar,
		// The injection template leaves 15090 out of the redirection: the API server's
		// reads do not pass through the sidecar they read.
		Proxies:         []meshkube.ProxyEndpoint{{Component: Component, Container: IstioSidecar, Port: IstioStatsPort, Path: "/stats/prometheus", Read: ReadIstioStats}},
		ForLocalCluster: istiohelm.ForLocalCluster,
	}, nil
}

// Component names the sidecar among a trial's counters, on either substrate.
const Component = "envoy"

// InboundListenerStat is how Envoy's listener stats name the sidecar's inbound listener
// (istio-iptables redirects every inbound connection to port 15006):
// "listener.0.0.0.0_15006." in the stat's own name, the listener_address label in
// Istio's Prometheus output (envoy_listener_address under Envoy's default tags). A
// connection no filter chain takes (plaintext under strict mTLS) is not among its
// downstream_cx_total.
const InboundListenerStat = "0.0.0.0_15006"

// ReadIstioStats reads istio-proxy's Envoy stats in Prometheus format (meshkube.ProxyEndpoint):
// the requests that arrived at the pod's service (istio_requests_total as the
// destination reports them, which Istio's default telemetry keeps; Envoy's own
// per-listener counters are left out of that output by Istio's stats matcher), every
// counter and gauge as name{label=value,...}, and the proxy's release from istio_build.
//
// An istio-proxy built on upstream Envoy has no Istio telemetry (see
// istiohelm.ForLocalCluster): its requests are counted from Envoy's own counters of the
// inbound clusters, which that install lets through the stats matcher.
//
// What came over mTLS is the destination's connection_security_policy with telemetry;
// without it, the inbound listener's TLS handshakes against its connections, which that
// install lets through too (InboundListenerStat).
func ReadIstioStats(body io.Reader, of meshkube.ProxyScrape) (meshkube.ProxyCounters, error) {
	var inbound, envoyInbound float64
	var mtlsRequests, plainRequests, handshakes, connections float64
	var version string
	telemetry, listener := false, false
	pc, err := mesh.ReadPrometheusText(body, func(name string, labels map[string]string, v float64) {
		if name == istioRequests {
			telemetry = true
			if labels["reporter"] == "destination" {
				inbound += v
				if labels["connection_security_policy"] == "mutual_tls" {
					mtlsRequests += v
				} else {
					plainRequests += v
				}
			}
		}
		if name == "envoy_cluster_upstream_rq_total" && strings.HasPrefix(labels["cluster_name"], "inbound|") {
			envoyInbound += v
		}
		if labels["listener_address"] == InboundListenerStat || labels["envoy_listener_address"] == InboundListenerStat {
			switch name {
			case "envoy_listener_ssl_handshake":
				handshakes += v
				listener = true
			case "envoy_listener_downstream_cx_total":
				connections += v
				listener = true
			}
		}
		if name == "istio_build" && labels["component"] == "proxy" {
			version = labels["tag"]
		}
	})
	if err != nil {
		return meshkube.ProxyCounters{}, fmt.Errorf("istio-proxy stats: %w", err)
	}
	pc.Unit, pc.Version = meshkube.UnitRequests, version
	if !telemetry {
		inbound = envoyInbound
	}
	if of.Service != "" {
		pc.Inbound = map[string]uint64{of.Service: uint64(inbound)}
		switch {
		case telemetry:
			pc.WireUnit = meshkube.UnitRequests
			pc.InboundMTLS = map[string]uint64{of.Service: uint64(mtlsRequests)}
			pc.InboundPlaintext = map[string]uint64{of.Service: uint64(plainRequests)}
		case listener:
			// Every connection the inbound listener accepted either completed a TLS
			// handshake (Istio's mTLS) or did not; a pod serves one service.
			pc.WireUnit = meshkube.UnitConnections
			pc.InboundMTLS = map[string]uint64{of.Service: uint64(handshakes)}
			pc.InboundPlaintext = map[string]uint64{of.Service: uint64(max(connections-handshakes, 0))}
		}
	}
	return pc, nil
}
