// Package loadgen owns remote load generation: `meshmark generator` serves plans over
// gRPC, each one a `meshmark load` command line and this generator's share of it, and
// streams every interval's histograms back as it ends; a Pool drives several
// generators at once (pods on several nodes) and merges what they measured exactly.
//
// The messages are meshmark's own load.Interval and load.Result in JSON, which already
// carry every histogram in HdrHistogram's lossless V2 compressed encoding, so the service
// keeps no second schema: a JSON codec is registered with gRPC and the service is
// described by hand, as protoc-gen-go-grpc would describe it.
package loadgen

import (
	"encoding/json"
	"time"

	"github.com/meshmark/meshmark/internal/load"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
)

// ServiceName and RunMethod name the service on the wire.
const (
	ServiceName = "meshmark.loadgen.v1.Generator"
	RunMethod   = "/" + ServiceName + "/Run"
)

// Plan is one load run for one generator.
type Plan struct {
	// Args are the arguments of `meshmark load`: the URL and its flags.
	Args []string `json:"args"`
	// Share is this generator's part of the load the arguments describe.
	Share Share `json:"share"`
	// StartAt is when every generator of the run starts, so that interval i of each
	// covers the same time and the intervals merge by index.
	StartAt time.Time `json:"start_at"`
}

// Share says that a generator is number Index (0-based) of Of that share a load.
type Share struct {
	Index int `json:"index"`
	Of    int `json:"of"`
}

// Event is what a generator streams back: an interval as it ends, then the result.
type Event struct {
	Interval *load.Interval `json:"interval,omitempty"`
	InFlight int64          `json:"in_flight,omitempty"`
	Elapsed  time.Duration  `json:"elapsed,omitempty"`
	Total    time.Duration  `json:"total,omitempty"`
	Result   *load.Result   `json:"result,omitempty"`
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
