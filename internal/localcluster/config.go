package localcluster

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/meshmark/meshmark/internal/prereq"
)

// PauseImage is the sandbox image every node's containerd runs for a pod; `cluster up`
// imports one under this name.
const PauseImage = "registry.k8s.io/pause:3.10"

// containerdConfig is a node's containerd configuration. Its socket is in the cluster's
// directory, where the host finds it (to import images); its state is in the node's own
// /run. containerd 1.6's CRI cannot give the pause container a negative oom_score_adj
// on machines that withhold CAP_SYS_RESOURCE from root, hence restrict_oom_score_adj.
func containerdConfig(nodeDir string) string {
	return fmt.Sprintf(`version = 2
root = %q
state = "/run/containerd"
[grpc]
  address = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
`, filepath.Join(nodeDir, "containerd"), containerdSocket(nodeDir), PauseImage)
}

// containerdSocket is a node's containerd socket.
func containerdSocket(nodeDir string) string { return filepath.Join(nodeDir, "containerd.sock") }

// cniConfig is a node's pod network: its own bridge and /24, with the node's bridge as
// the pods' gateway. Written into the node's /etc before containerd starts, since
// containerd 1.6 loads the configuration only on a write event.
func cniConfig(n Node) string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "meshmark",
  "plugins": [
    {
      "type": "bridge",
      "bridge": %q,
      "isGateway": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, n.Bridge, n.PodCIDR)
}

// kubeletConfig is a node's kubelet configuration. Each kubelet listens on its own node
// address, has its own cgroup root under the cluster's, and keeps images and disk
// whatever their use: image garbage collection on a test machine would only delete
// the images up imported.
func kubeletConfig(n Node, nodeDir, cgroupRoot, caCert string) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: %q
failSwapOn: false
containerRuntimeEndpoint: unix://%s
imageServiceEndpoint: unix://%s
address: %s
port: 10250
healthzBindAddress: %s
healthzPort: 10248
readOnlyPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: %q}
authorization: {mode: AlwaysAllow}
clusterDomain: cluster.local
clusterDNS: [%q]
resolvConf: %q
evictionHard: {memory.available: "100Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
`, cgroupRoot, containerdSocket(nodeDir), containerdSocket(nodeDir), n.Address, n.Address, caCert,
		DNSAddress.String(), filepath.Join(nodeDir, "resolv.conf"))
}

// kubeProxyConfig is a node's kube-proxy: nftables mode, which keeps to its own
// tables of the node's namespace, and no conntrack tuning, which would write the
// host's sysctls.
func kubeProxyConfig(kubeconfig string, n Node) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection: {kubeconfig: %q}
hostnameOverride: %s
bindAddress: %s
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: %s:10256
clusterCIDR: %s
detectLocalMode: ClusterCIDR
nodePortAddresses: [%s/32]
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, kubeconfig, n.Name, n.Address, n.Address, podPrefix, n.Address)
}

// resolvConf is what pods with dnsPolicy Default and CoreDNS's forwarding see: the
// cluster has no way out, so only the cluster's own names resolve.
const resolvConf = "nameserver 127.0.0.1\noptions ndots:1\n"

// writeNodeFiles lays out a node's directory before its containerd starts.
func writeNodeFiles(n Node, nodeDir, cgroupRoot, caCert string) error {
	for _, d := range []string{"containerd", "kubelet", "etc-upper/cni/net.d", "etc-work", "cni-bin", "sysctl"} {
		if err := os.MkdirAll(filepath.Join(nodeDir, d), 0o755); err != nil {
			return err
		}
	}
	// The CNI plugins are copied, not linked: the node's /opt/cni/bin is its own, and
	// istio-cni installs its plugin there.
	src := prereq.CNIPlugins()
	entries, err := os.ReadDir(src)
	if err != nil {
		return fmt.Errorf("CNI plugins: %w (run `meshmark setup --for cluster`)", err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(nodeDir, "cni-bin", e.Name()), data, 0o755); err != nil {
			return err
		}
	}
	files := map[string]string{
		"containerd.toml": containerdConfig(nodeDir),
		"kubelet.yaml":    kubeletConfig(n, nodeDir, cgroupRoot, caCert),
		"etc-upper/cni/net.d/10-meshmark.conflist": cniConfig(n),
		"resolv.conf": resolvConf,
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(nodeDir, name), []byte(body), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// bridgeName is node i's bridge in the cluster's namespace.
func bridgeName(i int) string { return fmt.Sprintf("mmk-br%d", i) }

// nodeName is node i's name: the cluster's, as kind names them.
func nodeName(cluster string, i int) string {
	switch i {
	case 0:
		return cluster + "-control-plane"
	case 1:
		return cluster + "-worker"
	}
	return fmt.Sprintf("%s-worker%d", cluster, i)
}
