package results

// Security probes, in the order reports show them.
const (
	ProbeEncryption    = "encryption"
	ProbePlaintext     = "plaintext-refused"
	ProbeAuthorization = "authorization"
	ProbeBypass        = "bypass"
	ProbeIdentity      = "identity"
)

// SecurityProbes lists every probe the security experiment knows.
var SecurityProbes = []string{ProbeEncryption, ProbePlaintext, ProbeAuthorization, ProbeBypass, ProbeIdentity}

// SecurityOutcome is one probe's verdict for one mesh.
type SecurityOutcome string

const (
	// SecurityPass: the mesh promises the property and it held on every check.
	SecurityPass SecurityOutcome = "pass"
	// SecurityFail: the mesh promises the property and at least one check broke it.
	SecurityFail SecurityOutcome = "fail"
	// SecurityExpected: the mesh, with these options, does not promise the property,
	// and it indeed did not hold (permissive mTLS accepting plaintext).
	SecurityExpected SecurityOutcome = "expected"
	// SecurityNotApplicable: the probe means nothing here (no mesh, no identities,
	// a substrate that cannot capture) or could not be run; Summary says which.
	SecurityNotApplicable SecurityOutcome = "n/a"
)

// SecurityProbe is one probe's result for one mesh, with the evidence behind it.
type SecurityProbe struct {
	Probe   string          `json:"probe"`
	Outcome SecurityOutcome `json:"outcome"`
	// Promised is what the profile, with its options, claims ("mTLS between meshed
	// pods", "plaintext accepted (permissive)").
	Promised string `json:"promised,omitempty"`
	// Summary is one line: what was observed.
	Summary string `json:"summary"`
	// Checks are the individual observations, each marked whether it kept the
	// promise.
	Checks []SecurityCheck `json:"checks,omitempty"`
}

// SecurityCheck is one observation: one flow on the wire, one refused call, one
// certificate.
type SecurityCheck struct {
	Target   string `json:"target"`
	Observed string `json:"observed"`
	// Held is whether this observation kept the property the probe tests (encrypted,
	// refused, denied, chained...), whatever the mesh promised.
	Held bool `json:"held"`
	// Documented marks a path the mesh documents as outside its protection (a port its
	// interception excludes by design): shown as evidence, not judged.
	Documented bool `json:"documented,omitempty"`
}

// RegressedFrom reports whether the probe fails now where it did not before.
func (p SecurityProbe) RegressedFrom(before SecurityProbe) bool {
	return p.Outcome == SecurityFail && before.Outcome != SecurityFail
}
