package wire

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/afpacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/vishvananda/netns"

	"github.com/meshmark/meshmark/internal/substrate"
)

// Report is what a capture saw.
type Report struct {
	Flows []Flow
	// Packets were read off the taps; KernelDrops are packets the kernel dropped
	// because the capture did not keep up (a non-zero count means flows may have
	// gaps); FlowsDropped are flows beyond the capture's state limit.
	Packets, KernelDrops, FlowsDropped int64
}

// Capture reads every tap until Stop.
type Capture struct {
	mu      sync.Mutex
	tracker *Tracker
	packets int64
	handles []*afpacket.TPacket
	taps    []substrate.WireTap
	stop    chan struct{}
	wg      sync.WaitGroup
	once    sync.Once
	report  Report
	err     error
}

// pollEvery is how often a reader wakes to see whether the capture is stopping.
const pollEvery = 50 * time.Millisecond

// blockTimeout is how long the kernel holds a partly filled ring block before handing
// it over; Stop waits a few of them so the last packets are read, not dropped.
const blockTimeout = 10 * time.Millisecond

// Start opens an AF_PACKET socket on every tap, inside the tap's namespace (never the
// host's), in promiscuous mode so a bridge passes up the frames it forwards between
// its ports, and follows every TCP flow until Stop. Nothing is stored but flow state.
func Start(ctx context.Context, taps []substrate.WireTap) (*Capture, error) {
	if len(taps) == 0 {
		return nil, errors.New("wire: nothing to capture: the substrate has no taps")
	}
	c := &Capture{tracker: NewTracker(), stop: make(chan struct{}), taps: taps}
	for _, tap := range taps {
		if err := ctx.Err(); err != nil {
			c.closeHandles()
			return nil, err
		}
		h, err := openInNetNS(tap)
		if err != nil {
			c.closeHandles()
			return nil, err
		}
		c.handles = append(c.handles, h)
	}
	for i, h := range c.handles {
		c.wg.Add(1)
		go c.read(h, taps[i].Node)
	}
	context.AfterFunc(ctx, func() { c.Stop() })
	return c, nil
}

// openInNetNS creates the socket on a thread that has entered the tap's namespace: a
// socket belongs to the namespace it was created in, and the interface name is
// looked up there too. The thread returns to its own namespace before it is
// released; if it cannot, it stays locked and dies with its goroutine.
func openInNetNS(tap substrate.WireTap) (*afpacket.TPacket, error) {
	type result struct {
		h   *afpacket.TPacket
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			done <- result{nil, fmt.Errorf("wire: current namespace: %w", err)}
			return
		}
		defer orig.Close()
		target, err := netns.GetFromPath(tap.NetNSPath)
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{nil, fmt.Errorf("wire: tap %s: namespace %s: %w", tap.Node, tap.NetNSPath, err)}
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			done <- result{nil, fmt.Errorf("wire: tap %s: enter %s: %w", tap.Node, tap.NetNSPath, err)}
			return
		}
		h, err := afpacket.NewTPacket(afpacket.OptInterface(tap.Interface), afpacket.OptPollTimeout(pollEvery),
			afpacket.OptFrameSize(1<<16), afpacket.OptBlockSize(1<<20), afpacket.OptNumBlocks(16), afpacket.OptBlockTimeout(blockTimeout))
		if err == nil {
			if perr := h.SetPromiscuous(true); perr != nil {
				h.Close()
				h, err = nil, perr
			}
		}
		if err != nil {
			err = fmt.Errorf("wire: tap %s: capture on %s in %s: %w", tap.Node, tap.Interface, tap.NetNSPath, err)
		}
		if serr := netns.Set(orig); serr != nil {
			if h != nil {
				h.Close()
			}
			done <- result{nil, fmt.Errorf("wire: return from %s: %w", tap.NetNSPath, serr)}
			return // the thread stays locked in the wrong namespace and exits with us
		}
		runtime.UnlockOSThread()
		done <- result{h, err}
	}()
	r := <-done
	return r.h, r.err
}

func (c *Capture) read(h *afpacket.TPacket, tap string) {
	defer c.wg.Done()
	var eth layers.Ethernet
	var ip4 layers.IPv4
	var ip6 layers.IPv6
	var tcp layers.TCP
	var payload gopacket.Payload
	parser := gopacket.NewDecodingLayerParser(layers.LayerTypeEthernet, &eth, &ip4, &ip6, &tcp, &payload)
	parser.IgnoreUnsupported = true
	decoded := make([]gopacket.LayerType, 0, 5)
	for {
		select {
		case <-c.stop:
			return
		default:
		}
		data, _, err := h.ZeroCopyReadPacketData()
		if err != nil {
			if errors.Is(err, afpacket.ErrTimeout) {
				continue
			}
			select {
			case <-c.stop:
			default:
				c.mu.Lock()
				c.err = errors.Join(c.err, fmt.Errorf("wire: tap %s: %w", tap, err))
				c.mu.Unlock()
			}
			return
		}
		if err := parser.DecodeLayers(data, &decoded); err != nil && len(decoded) == 0 {
			continue
		}
		seg, ok := segment(decoded, &ip4, &ip6, &tcp)
		if !ok {
			continue
		}
		seg.Tap = tap
		c.mu.Lock()
		c.packets++
		c.tracker.Add(seg) // copies what it keeps: data is reused by the next read
		c.mu.Unlock()
	}
}

func segment(decoded []gopacket.LayerType, ip4 *layers.IPv4, ip6 *layers.IPv6, tcp *layers.TCP) (Segment, bool) {
	var src, dst netip.Addr
	var haveIP, haveTCP bool
	for _, t := range decoded {
		switch t {
		case layers.LayerTypeIPv4:
			src, _ = netip.AddrFromSlice(ip4.SrcIP)
			dst, _ = netip.AddrFromSlice(ip4.DstIP)
			haveIP = true
		case layers.LayerTypeIPv6:
			src, _ = netip.AddrFromSlice(ip6.SrcIP)
			dst, _ = netip.AddrFromSlice(ip6.DstIP)
			haveIP = true
		case layers.LayerTypeTCP:
			haveTCP = true
		}
	}
	if !haveIP || !haveTCP {
		return Segment{}, false
	}
	return Segment{
		Src: netip.AddrPortFrom(src.Unmap(), uint16(tcp.SrcPort)), Dst: netip.AddrPortFrom(dst.Unmap(), uint16(tcp.DstPort)),
		Seq: tcp.Seq, SYN: tcp.SYN, ACK: tcp.ACK, Payload: tcp.Payload,
	}, true
}

// Stop ends the capture, waits for every reader, closes the sockets and returns what
// was seen. It is safe to call more than once; later calls return the same report.
func (c *Capture) Stop() (Report, error) {
	c.once.Do(func() {
		// Packets of the last moments sit in a block the kernel has not handed over
		// yet: let the readers take them first.
		time.Sleep(5*blockTimeout + pollEvery)
		close(c.stop)
		c.wg.Wait()
		var drops int64
		for _, h := range c.handles {
			if _, v3, err := h.SocketStats(); err == nil {
				drops += int64(v3.Drops())
			}
		}
		c.closeHandles()
		c.mu.Lock()
		c.report = Report{Flows: c.tracker.Flows(), Packets: c.packets, KernelDrops: drops, FlowsDropped: c.tracker.Dropped}
		c.mu.Unlock()
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.report, c.err
}

func (c *Capture) closeHandles() {
	for _, h := range c.handles {
		h.Close()
	}
	c.handles = nil
}
