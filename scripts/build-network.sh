#!/usr/bin/env bash
# Builds the network of `meshmark cluster up`'s nodes from the Go module proxy, into
# DEST: the CNI plugins each node's bridge network uses (DEST/share/cni/bin) and CoreDNS
# (DEST/bin), static, so that CoreDNS goes into an image as it is. Run through
# scripts/cached-build.sh by setup.
#   scripts/build-network.sh v1.9.1 v1.15.0 DEST
set -euo pipefail
cni=${1:?CNI plugins version, e.g. v1.9.1}
coredns=${2:?CoreDNS version, e.g. v1.15.0}
dest=$(mkdir -p "${3:?destination directory}" && cd "$3" && pwd)
mkdir -p "$dest/bin" "$dest/share/cni/bin"
work=$(mktemp -d "${TMPDIR:-/var/tmp}/meshmark-network.XXXXXX")
trap 'rm -rf "$work"' EXIT
export CGO_ENABLED=0
cd "$work"
go mod init meshmark.local/cni >/dev/null 2>&1
echo "require github.com/containernetworking/plugins $cni" >>go.mod
cat >tools.go <<'GO'
package main

import (
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/bridge"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
	_ "github.com/containernetworking/plugins/plugins/meta/portmap"
)

func main() {}
GO
GOFLAGS=-mod=mod go mod tidy >/dev/null
for p in ipam/host-local main/bridge main/loopback meta/portmap; do
  echo "building CNI plugin ${p#*/} $cni"
  GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$cni" \
    -o "$dest/share/cni/bin/${p#*/}" "github.com/containernetworking/plugins/plugins/$p"
done
echo "building coredns $coredns"
GOBIN="$dest/bin" GOFLAGS= go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@$coredns"
"$dest/bin/coredns" -version | head -1
