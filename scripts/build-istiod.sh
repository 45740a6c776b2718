#!/usr/bin/env bash
# Builds istiod (pilot-discovery) from Istio's Go module, at a pinned commit, into
# BINDIR, and copies the same commit's Helm charts (manifests/charts) into CHARTDIR. The
# Kubernetes substrate's tests install those charts on the test cluster and run this
# istiod beside it, as Istio's external control plane runs, since pods cannot run there.
#   scripts/build-istiod.sh v0.0.0-20260827124520-eed52ebb66ad .tools/bin .tools/share/istio-charts
set -euo pipefail
version=${1:?istio.io/istio module version}
bindir=$(mkdir -p "${2:?binary directory}" && cd "$2" && pwd)
chartdir=$(mkdir -p "${3:?chart directory}" && cd "$3" && pwd)
work=$(mktemp -d "${TMPDIR:-/var/tmp}/meshmark-istiod.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
go mod init meshmark.local/istiod >/dev/null 2>&1
echo "require istio.io/istio $version" >>go.mod
cat >tools.go <<'GO'
package main

import _ "istio.io/istio/pilot/cmd/pilot-discovery/app"

func main() {}
GO
GOFLAGS=-mod=mod go mod tidy >/dev/null
echo "building istiod (pilot-discovery) from istio.io/istio $version"
GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w -X istio.io/istio/pkg/version.buildVersion=$version" \
  -o "$bindir/pilot-discovery" istio.io/istio/pilot/cmd/pilot-discovery
src=$(go list -m -f '{{.Dir}}' istio.io/istio)
rm -rf "$chartdir" && mkdir -p "$chartdir"
cp -R "$src/manifests/charts/." "$chartdir/"
chmod -R u+w "$chartdir"
"$bindir/pilot-discovery" version --short
