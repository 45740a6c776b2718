package envoysidecar

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/prereq"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

// Authorize puts Istio's ALLOW AuthorizationPolicy in place (mesh.Authorizer): the
// sidecars of every service named in allowed let through only callers whose mTLS
// identity belongs to one of the listed caller services, and answer everyone else
// 403 "RBAC: access denied". istiod would push the new listener over xDS; this
// profile's sidecars run from a static bootstrap, so each sidecar whose policy
// changes is restarted with the new one (its interception stays; connections in the
// second it takes are refused), and Authorize returns once every one is ready.
func (p *Profile) Authorize(ctx context.Context, sub substrate.Substrate, app *topology.App, allowed map[string][]string) error {
	if p.mode == mesh.MTLSOff {
		return errors.New("authorization by caller identity needs mtls permissive or strict: with mtls off no caller presents an identity")
	}
	callerPods, err := mesh.CallerPods(app, allowed)
	if err != nil {
		return err
	}
	envoy, err := prereq.Envoy()
	if err != nil {
		return fmt.Errorf("%s: %w", Name, err)
	}
	p.mu.Lock()
	scs := make([]*sidecar, 0, len(p.sidecars))
	for _, sc := range p.sidecars {
		scs = append(scs, sc)
	}
	p.mu.Unlock()
	var errs []error
	for _, sc := range scs {
		var allow []string
		if callers, ok := callerPods[sc.pod.Service]; ok && sc.pod.Service != "" {
			allow = []string{} // a policy that names no caller denies everyone
			for _, ep := range callers {
				if id := p.identity(app, ep); !slices.Contains(allow, id) {
					allow = append(allow, id)
				}
			}
			slices.Sort(allow)
		}
		if slices.Equal(allow, sc.allow) && (allow == nil) == (sc.allow == nil) {
			continue
		}
		if sc.proc != nil {
			if err := sc.proc.Stop(); err != nil {
				errs = append(errs, fmt.Errorf("pod %s: stop envoy: %w", sc.pod.Name, err))
				continue
			}
		}
		sc.allow = allow
		if err := p.startEnvoy(ctx, sub, app, sc, envoy); err != nil {
			errs = append(errs, fmt.Errorf("pod %s: %w", sc.pod.Name, err))
		}
	}
	return errors.Join(errs...)
}
