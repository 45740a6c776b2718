// Package load owns meshmark's load engine: arrival schedules (constant, Poisson, steps,
// ramps), the three load models (open, closed, users), the clients they drive, and the
// measurement of every request into HDR histograms.
//
// The models see a protocol only through Client and Session, one session being one
// connection used by one goroutine at a time. The clients: the lean HTTP/1.1 client
// (the default, plaintext or HTTPS with TLS sessions resumed across reconnections as
// real clients do, with its own epoll loops for plaintext keep-alive runs), net/http
// over HTTP/1.1, HTTP/2 (h2c with prior knowledge, or TLS with ALPN h2; a session
// carries one request at a time, alone on its connection or as one of its streams;
// closed runs in cleartext with keep-alive take an epoll loop of their own), and unary
// gRPC calls through grpc-go with a pass-through codec (a session is one channel).
// Results keep HTTP statuses for every protocol; gRPC codes are mapped (GRPCHTTPStatus)
// and failures' exact codes and messages are kept among the error samples
// (Outcome.Detail).
//
// Latency is measured from each request's intended send time, so a stall of the target
// shows up in the results even when the generator had to wait to send (no coordinated
// omission); service time is measured from the actual send. Both are recorded in
// microseconds, 1 µs to 60 s, 3 significant digits, per interval and in total.
package load
