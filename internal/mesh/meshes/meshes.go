// Package meshes links every built-in mesh profile into the binary: import it (for its
// side effect) wherever mesh.New must find them, e.g. the study runner and the CLI.
package meshes

import (
	// Each profile registers itself in its init.
	_ "github.com/meshmark/meshmark/internal/mesh/ambient"
	_ "github.com/meshmark/meshmark/internal/mesh/cilium"
	_ "github.com/meshmark/meshmark/internal/mesh/envoysidecar"
	_ "github.com/meshmark/meshmark/internal/mesh/linkerd"
	_ "github.com/meshmark/meshmark/internal/mesh/nodeenvoy"
	_ "github.com/meshmark/meshmark/internal/mesh/none"
	_ "github.com/meshmark/meshmark/internal/mesh/traefikmesh"
)
