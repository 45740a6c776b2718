package runner

import (
	"errors"

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

// grpcMethodOf is the method a gRPC entry path calls, as the workload's callers choose it.
func grpcMethodOf(path string) string {
	if m := workload.GRPCMethod(path); m != "" {
		return m
	}
	return workload.CallMethod
}
