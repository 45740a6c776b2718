// Package loadgen owns remote load generation: a generator (`meshmark-pod generator`,
// also `meshmark generator`) serves plans over gRPC, each a versioned load.Spec and this
// generator's share of it, and streams every interval's histograms back as it ends; a
// Pool drives several generators at once (pods on several nodes, or the one generator
// process of a local testbed) and merges what they measured exactly.
//
// The messages are meshmark's own load.Spec, load.Interval and load.Result in JSON,
// which already carry every histogram in HdrHistogram's lossless V2 compressed
// encoding, so the service keeps no second schema: a JSON codec is registered with
// gRPC and the service is described by hand, as protoc-gen-go-grpc would describe it.
// The result that ends a stream carries no interval: they came before it one by one,
// so that no message grows with the length of the run (gRPC refuses messages over
// 4 MiB by default), and the generator keeps no interval's histograms, only the figures
// it judges the run by.
package loadgen

import (
	"encoding/json"
	"time"

	"github.com/meshmark/meshmark/internal/load"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
)

// ServiceName and RunMethod name the service on the wire. v2 plans carry a load.Spec;
// v1's carried a command line.
const (
	ServiceName = "meshmark.loadgen.v2.Generator"
	RunMethod   = "/" + ServiceName + "/Run"
)

// Plan is one load run for one generator.
type Plan struct {
	// Load is the load.Spec in JSON. It stays raw here so that the generator reads it
	// with load.ParseSpec, which refuses a version it does not know by name.
	Load json.RawMessage `json:"load"`
	// Share is this generator's part of the load the spec describes.
	Share Share `json:"share"`
	// StartAt is when every generator of the run starts, so that interval i of each
	// covers the same time and the intervals merge by index; zero starts at once.
	StartAt time.Time `json:"start_at"`
}

// Share says that a generator is number Index (0-based) of Of that share a load.
type Share struct {
	Index int `json:"index"`
	Of    int `json:"of"`
}

// Event is what a generator streams back: every interval as it ends, then the result.
type Event struct {
	Interval *load.Interval `json:"interval,omitempty"`
	InFlight int64          `json:"in_flight,omitempty"`
	Elapsed  time.Duration  `json:"elapsed,omitempty"`
	Total    time.Duration  `json:"total,omitempty"`
	// Result ends the stream: the run's totals without its intervals, and Intervals,
	// how many intervals came before it, so that the driver knows it has them all.
	Result    *load.Result `json:"result,omitempty"`
	Intervals int          `json:"intervals,omitempty"`
}

// codecName is the gRPC content subtype of the service's messages.
const codecName = "json"

type jsonCodec struct{}

func (jsonCodec) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (jsonCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
func (jsonCodec) Name() string                       { return codecName }

func init() { encoding.RegisterCodec(jsonCodec{}) }

// runner is what the service's handler calls; Server implements it.
type runner interface {
	run(plan *Plan, stream grpc.ServerStream) error
}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: ServiceName,
	HandlerType: (*runner)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName:    "Run",
		ServerStreams: true,
		Handler: func(srv any, stream grpc.ServerStream) error {
			var p Plan
			if err := stream.RecvMsg(&p); err != nil {
				return err
			}
			return srv.(runner).run(&p, stream)
		},
	}},
	Metadata: "internal/loadgen",
}
