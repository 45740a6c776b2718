package kubetest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	"github.com/meshmark/meshmark/internal/prereq"
)

// Istiod is istiod (pilot-discovery, built by `meshmark setup --for test`) running beside
// a test cluster, as Istio's external control plane runs: pods cannot run istiod here. It
// reads the mesh and injection configuration the charts put in istio-system and serves
// its webhooks on WebhookURL, which the charts' istiodRemote.injectionURL and
// base.validationURL must name. Its serving certificate names localhost
// (ISTIOD_CUSTOM_HOST), and istiod itself puts its CA into the webhook configurations.
type Istiod struct {
	cmd *exec.Cmd
	// Log is istiod's log file.
	Log string
}

// IstiodBinary is where setup puts pilot-discovery.
func IstiodBinary() string { return filepath.Join(prereq.ToolsDir(), "bin", "pilot-discovery") }

// WebhookURL is the base URL of the webhooks of an istiod serving on port.
func WebhookURL(port int) string { return fmt.Sprintf("https://localhost:%d", port) }

// StartIstiod starts istiod against the cluster, its webhooks on port, its other
// listeners on free loopback ports, logging into dir.
func (c *Cluster) StartIstiod(port int, dir string) (*Istiod, error) {
	ports, err := freePorts(4)
	if err != nil {
		return nil, err
	}
	args := []string{"discovery", "--kubeconfig", c.Kubeconfig, "--httpsAddr", "127.0.0.1:" + strconv.Itoa(port), "--ctrlz_port", "0"}
	for i, flag := range []string{"--httpAddr", "--grpcAddr", "--secureGRPCAddr", "--monitoringAddr"} {
		args = append(args, flag, "127.0.0.1:"+strconv.Itoa(ports[i]))
	}
	logf, err := os.CreateTemp(dir, "istiod-*.log")
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(IstiodBinary(), args...)
	cmd.Env = append(os.Environ(), "POD_NAMESPACE=istio-system", "POD_NAME=istiod-test", "REVISION=default", "ISTIOD_CUSTOM_HOST=localhost")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start istiod: %w", err)
	}
	return &Istiod{cmd: cmd, Log: logf.Name()}, nil
}

// Stop ends istiod.
func (i *Istiod) Stop() {
	_ = i.cmd.Process.Kill()
	_ = i.cmd.Wait()
}

// FreePort is a loopback port nothing listened on a moment ago.
func FreePort() (int, error) {
	ports, err := freePorts(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}
