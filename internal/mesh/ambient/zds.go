package ambient

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/meshmark/meshmark/internal/mesh/ambient/zdsapi"
	"google.golang.org/protobuf/proto"
)

// netnsDir is where named network namespaces are bound (iproute2's convention, which
// the testbed follows).
const netnsDir = "/run/netns"

// nodeAgent is meshmark playing istio-cni's node agent for one node: it serves the ZDS
// socket a shared-mode ztunnel connects to, and hands it each pod's network namespace
// (an open fd passed with SCM_RIGHTS), after which ztunnel listens inside the pod.
// The protocol is zds.proto's: hello from ztunnel, the agent's snapshot (here empty,
// then SnapshotSent), then one AddWorkload per pod, each acknowledged.
type nodeAgent struct {
	path string
	ln   *net.UnixListener

	mu   sync.Mutex
	conn *net.UnixConn
	// connected is closed once ztunnel has said hello and acked the snapshot.
	connected chan struct{}
	err       error
}

func listenNodeAgent(path string) (*nodeAgent, error) {
	_ = os.Remove(path)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("ZDS socket %s: %w", path, err)
	}
	a := &nodeAgent{path: path, ln: ln, connected: make(chan struct{})}
	go a.accept()
	return a, nil
}

// accept takes ztunnel's one connection. A ztunnel that reconnects (it restarted)
// is not served again: the pods it held lost their proxy, which the check and the
// counters then report.
func (a *nodeAgent) accept() {
	c, err := a.ln.AcceptUnix()
	if err == nil {
		err = handshake(c)
	}
	a.mu.Lock()
	a.conn, a.err = c, err
	a.mu.Unlock()
	close(a.connected)
}

func handshake(c *net.UnixConn) error {
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	defer c.SetDeadline(time.Time{})
	buf := make([]byte, 1024)
	n, err := c.Read(buf)
	if err != nil {
		return fmt.Errorf("ZDS hello: %w", err)
	}
	var hello zdsapi.ZdsHello
	if err := proto.Unmarshal(buf[:n], &hello); err != nil {
		return fmt.Errorf("ZDS hello: %w", err)
	}
	if hello.Version != zdsapi.Version_V1 {
		return fmt.Errorf("ZDS hello: ztunnel speaks version %v, want V1", hello.Version)
	}
	return exchange(c, &zdsapi.WorkloadRequest{Payload: &zdsapi.WorkloadRequest_SnapshotSent{SnapshotSent: &zdsapi.SnapshotSent{}}}, -1)
}

// exchange sends one request (with fd attached when fd >= 0) and waits for its ack.
func exchange(c *net.UnixConn, req *zdsapi.WorkloadRequest, fd int) error {
	b, err := proto.Marshal(req)
	if err != nil {
		return err
	}
	var oob []byte
	if fd >= 0 {
		oob = syscall.UnixRights(fd)
	}
	if _, _, err := c.WriteMsgUnix(b, oob, nil); err != nil {
		return fmt.Errorf("ZDS send: %w", err)
	}
	buf := make([]byte, 1024)
	n, err := c.Read(buf)
	if err != nil {
		return fmt.Errorf("ZDS ack: %w", err)
	}
	var resp zdsapi.WorkloadResponse
	if err := proto.Unmarshal(buf[:n], &resp); err != nil {
		return fmt.Errorf("ZDS ack: %w", err)
	}
	if e := resp.GetAck().GetError(); e != "" {
		return fmt.Errorf("ztunnel refused: %s", e)
	}
	return nil
}

// waitConnected waits for ztunnel's handshake.
func (a *nodeAgent) waitConnected(ctx context.Context) (*net.UnixConn, error) {
	select {
	case <-a.connected:
	case <-ctx.Done():
		return nil, fmt.Errorf("ztunnel did not connect to %s: %w", a.path, ctx.Err())
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.conn, a.err
}

// addPod hands the pod's network namespace to ztunnel.
func (a *nodeAgent) addPod(ctx context.Context, uid string, netns string, info *zdsapi.WorkloadInfo) error {
	c, err := a.waitConnected(ctx)
	if err != nil {
		return err
	}
	f, err := os.Open(filepath.Join(netnsDir, netns))
	if err != nil {
		return fmt.Errorf("open netns: %w", err)
	}
	defer f.Close()
	a.mu.Lock()
	defer a.mu.Unlock()
	if d, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(d)
		defer c.SetDeadline(time.Time{})
	}
	return exchange(c, &zdsapi.WorkloadRequest{Payload: &zdsapi.WorkloadRequest_Add{Add: &zdsapi.AddWorkload{Uid: uid, WorkloadInfo: info}}}, int(f.Fd()))
}

// close stops serving and removes the socket file.
func (a *nodeAgent) close() error {
	err := a.ln.Close()
	a.mu.Lock()
	if a.conn != nil {
		a.conn.Close()
	}
	a.mu.Unlock()
	if rerr := os.Remove(a.path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	return err
}
