package load

import "unsafe"

// unsafeString views b as a string without copying; only for immediate parsing while b
// is not modified.
func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }
