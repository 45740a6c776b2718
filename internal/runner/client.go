package runner

import (
	"errors"
	"fmt"
	"net/url"

	"github.com/meshmark/meshmark/internal/load"
	"github.com/meshmark/meshmark/internal/study"
	"github.com/meshmark/meshmark/internal/workload"
)

// clientProtocol resolves an experiment's protocol: as the study says, or (auto) the
// protocol the graph gives the entry service, so a gRPC app is driven with gRPC.
func (r *runner) clientProtocol(e study.Experiment) study.ClientProtocol {
	if e.Protocol != "" && e.Protocol != study.ProtocolAuto {
		return e.Protocol
	}
	if s := r.graph.Service(r.graph.Entrypoint().Service); s != nil {
		switch s.Protocol {
		case workload.ProtocolHTTP2:
			return study.ProtocolH2C
		case workload.ProtocolGRPC:
			return study.ProtocolGRPC
		}
	}
	return study.ProtocolHTTP1
}

// checkClient refuses, before any bring-up, what the study file could not judge alone:
// settings that clash with the protocol auto resolves to.
func (r *runner) checkClient(e study.Experiment) error {
	switch p := r.clientProtocol(e); {
	case p == study.ProtocolGRPC && !e.KeepAlive:
		return errors.New("the entry service speaks gRPC, whose clients keep their channel open: keepAlive: false would measure channel setup (set protocol: h2c or http1 to drive it otherwise)")
	case p == study.ProtocolGRPC && e.Kind == study.KindUsers:
		return errors.New("users experiments drive HTTP tasks (method and path); a gRPC entry service needs another kind, or protocol: h2c")
	case p == study.ProtocolHTTP1 && e.Streams > 1:
		return errors.New("the entry service speaks HTTP/1.1, one request at a time per connection: streams needs protocol h2c or grpc")
	}
	return nil
}

// protocolLabels name a client protocol in stored trial parameters.
var protocolLabels = map[study.ClientProtocol]string{
	study.ProtocolHTTP1: "HTTP/1.1",
	study.ProtocolH2C:   "h2c",
	study.ProtocolGRPC:  "gRPC",
}

// client sets cfg.Client for the experiment's protocol (nil keeps the built-in HTTP/1.1
// client) and turns the request into what that protocol sends: for gRPC, a call of the
// entry path's method (workload.CallMethod unless the path names one).
func (r *runner) client(cfg *load.Config, e study.Experiment) error {
	opts := load.ClientOptions{Dial: cfg.Dial, DisableKeepAlive: cfg.DisableKeepAlive, Streams: e.Streams}
	switch r.clientProtocol(e) {
	case study.ProtocolH2C:
		cfg.Client = load.NewH2Client(opts, nil)
	case study.ProtocolGRPC:
		c, err := load.NewGRPCClient(opts)
		if err != nil {
			return err
		}
		u, err := url.Parse(cfg.Request.URL)
		if err != nil {
			return err
		}
		u.Path = grpcMethodOf(u.Path)
		cfg.Request.URL, cfg.Request.Method, cfg.Client = u.String(), "POST", c
	}
	if cfg.Client != nil {
		if _, err := cfg.Client.Prepare(cfg.Request); err != nil {
			return fmt.Errorf("%s request: %w", protocolLabels[r.clientProtocol(e)], err)
		}
	}
	return nil
}

// grpcMethodOf is the method a gRPC entry path calls, as the workload's callers choose it.
func grpcMethodOf(path string) string {
	if m := workload.GRPCMethod(path); m != "" {
		return m
	}
	return workload.CallMethod
}
