package cli

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
)

// TestPlaintextProbeCommandReports runs `meshmark plaintext-probe` as a probe pod runs
// it, against a server that answers and a listener that closes every connection: it
// writes the same report to stdout and to the message file (the pod's termination
// message), served for the one and refused for the other. A malformed target is a
// usage error, and the command is hidden from help: nobody types it.
func TestPlaintextProbeCommandReports(t *testing.T) {
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{"service":"web"}`) }))
	defer web.Close()
	closing, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer closing.Close()
	go func() {
		for {
			conn, err := closing.Accept()
			if err != nil {
				return
			}
			conn.Close()
		}
	}()
	file := filepath.Join(t.TempDir(), "termination-log")

	out, errOut, err := execCLI("plaintext-probe", "--target", "web="+web.Listener.Addr().String(),
		"--target", "db="+closing.Addr().String()+"/grpc", "--message-file", file)

	if err != nil {
		t.Fatalf("plaintext-probe: %v\n%s", err, errOut)
	}
	msg, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(out) != string(msg) {
		t.Errorf("stdout %q, message file %q: want the same report", out, msg)
	}
	var probes []meshprobe.PlaintextProbe
	if err := json.Unmarshal(msg, &probes); err != nil {
		t.Fatalf("report %q: %v", msg, err)
	}
	if len(probes) != 2 || probes[0].Service != "web" || probes[0].Refused || !strings.HasPrefix(probes[0].Observed, "served: HTTP 200") ||
		probes[1].Service != "db" || !probes[1].Refused || !strings.HasPrefix(probes[1].Observed, "refused: ") {
		t.Errorf("report %+v: want web served, db refused", probes)
	}

	_, _, err = execCLI("plaintext-probe", "--target", "web")
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 2 || !strings.Contains(err.Error(), "want SERVICE=HOST:PORT[/PROTOCOL]") {
		t.Errorf("malformed target: %v; want a usage error (exit code 2) saying what a target is", err)
	}
	help, _, _ := execCLI("--help")
	if strings.Contains(help, "plaintext-probe") {
		t.Errorf("help lists the probe pods' command:\n%s", help)
	}
}
