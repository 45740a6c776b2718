package security

import (
	"context"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/results"
)

func probeEncryption(ctx context.Context, tgt Target, p mesh.Posture, requests int) results.SecurityProbe {
	return notApplicable(results.ProbeEncryption, "wire capture pending")
}
