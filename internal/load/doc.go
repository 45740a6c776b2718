// Package load owns meshmark's load engine: arrival schedules (constant, Poisson, steps,
// ramps), the three load models (open, closed, users), the HTTP/1.1 client it drives
// (plaintext or HTTPS, TLS sessions resumed across reconnections as real clients do),
// and the measurement of every request into HDR histograms.
//
// Latency is measured from each request's intended send time, so a stall of the target
// shows up in the results even when the generator had to wait to send (no coordinated
// omission); service time is measured from the actual send. Both are recorded in
// microseconds, 1 µs to 60 s, 3 significant digits, per interval and in total.
package load
