//go:build race

package load

// raceEnabled: the race detector slows both ends of timing tests several-fold.
const raceEnabled = true
