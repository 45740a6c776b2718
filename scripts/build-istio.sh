#!/usr/bin/env bash
# Builds Istio's Go parts from Istio's module, at a pinned commit, into DEST: istiod
# (pilot-discovery), pilot-agent (the sidecar's and waypoint's agent, and istio-init's
# rules), install-cni and the istio-cni plugin (ambient's node agent) in DEST/bin, all
# static so that they go into images as they are; and the same commit's Helm charts
# (DEST/share/istio-charts) and Envoy bootstrap template (DEST/share/istio-proxy). A
# local cluster runs them from images meshmark builds; the paper-only test cluster runs
# istiod beside it. Run through scripts/cached-build.sh by setup.
#   scripts/build-istio.sh v0.0.0-20260827124520-eed52ebb66ad DEST
set -euo pipefail
version=${1:?istio.io/istio module version}
dest=$(mkdir -p "${2:?destination directory}" && cd "$2" && pwd)
mkdir -p "$dest/bin" "$dest/share"
work=$(mktemp -d "${TMPDIR:-/var/tmp}/meshmark-istio.XXXXXX")
trap 'rm -rf "$work"' EXIT
export CGO_ENABLED=0
cd "$work"
go mod init meshmark.local/istio >/dev/null 2>&1
echo "require istio.io/istio $version" >>go.mod
cat >tools.go <<'GO'
package main

import (
	_ "istio.io/istio/cni/pkg/cmd"
	_ "istio.io/istio/cni/pkg/plugin"
	_ "istio.io/istio/pilot/cmd/pilot-agent/app"
	_ "istio.io/istio/pilot/cmd/pilot-discovery/app"
)

func main() {}
GO
GOFLAGS=-mod=mod go mod tidy >/dev/null
ldflags="-s -w -X istio.io/istio/pkg/version.buildVersion=$version"
for cmd in pilot/cmd/pilot-discovery pilot/cmd/pilot-agent cni/cmd/install-cni cni/cmd/istio-cni; do
  echo "building $(basename $cmd) from istio.io/istio $version"
  GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$dest/bin/$(basename $cmd)" "istio.io/istio/$cmd"
done
src=$(go list -m -f '{{.Dir}}' istio.io/istio)
cp -R "$src/manifests/charts" "$dest/share/istio-charts"
mkdir -p "$dest/share/istio-proxy"
cp "$src/tools/packaging/common/envoy_bootstrap.json" "$dest/share/istio-proxy/"
chmod -R u+w "$dest/share"
"$dest/bin/pilot-discovery" version --short
