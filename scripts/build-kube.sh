#!/usr/bin/env bash
# Builds the Kubernetes binaries meshmark's clusters run, from the Go module proxy, into
# DEST/bin: kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and
# kube-proxy from k8s.io/kubernetes, and kwok (fake nodes that run pods only on paper,
# for tests that need more nodes than a machine holds). k8s.io/kubernetes requires its
# staging modules at v0.0.0 and replaces them with directories its module zip leaves
# out, so a scratch module requires it and points each staging module at its published
# release of the same minor version. Run through scripts/cached-build.sh by setup.
#   scripts/build-kube.sh v1.37.2 v0.8.0 DEST
set -euo pipefail
version=${1:?kubernetes version, e.g. v1.37.2}
kwok=${2:?kwok version, e.g. v0.8.0}
dest=$(mkdir -p "${3:?destination directory}/bin" && cd "$3/bin" && pwd)
staging="v0.${version#v1.}"
work=$(mktemp -d "${TMPDIR:-/var/tmp}/meshmark-kube.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
go mod init meshmark.local/kube >/dev/null 2>&1
modfile=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
{
  echo "require k8s.io/kubernetes $version"
  sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => \./staging/.*#replace \1 => \1 '"$staging"'#p' "$modfile"
} >>go.mod
cat >tools.go <<'GO'
package main

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	_ "k8s.io/kubernetes/cmd/kube-proxy/app"
	_ "k8s.io/kubernetes/cmd/kube-scheduler/app"
	_ "k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {}
GO
GOFLAGS=-mod=mod go mod tidy >/dev/null
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$version"
for cmd in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do
  echo "building $cmd $version"
  GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$dest/$cmd" "k8s.io/kubernetes/cmd/$cmd"
done
echo "building kwok $kwok"
GOBIN="$dest" GOFLAGS= go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$kwok"
"$dest/kube-apiserver" --version
