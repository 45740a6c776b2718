#!/usr/bin/env bash
# Builds Linkerd's control plane and the proxy image's helpers from Linkerd's source at
# one release tag, into DEST, as the release's Dockerfile.controller and Dockerfile.proxy
# build them: in DEST/bin the Go controllers (linkerd-controller: destination, identity,
# proxy-injector, heartbeat, ... as subcommands; static), the Rust policy controller
# (linkerd-policy-controller), the proxy's identity agent (linkerd2-proxy-identity;
# static) and linkerd2-proxy-init (static, from github.com/linkerd/linkerd2-proxy-init at
# the ref the release's Dockerfile.proxy names). The proxy itself is not built here: a
# local cluster uses the linkerd2-proxy release build in the tools directory. Run through
# scripts/cached-build.sh by setup.
#   scripts/build-linkerd.sh edge-26.8.3 DEST
#
# Sources: Linkerd's repositories are not Go modules the proxy serves (the module proxy
# refuses github.com/linkerd/linkerd2), so they are fetched with git: from
# https://github.com/linkerd/NAME.git, or from NAME's git directory under
# $MESHMARK_GIT_MIRROR (laid out OWNER+NAME/repo) where there is one, for a machine that
# reaches no git host. The policy controller's one git dependency (kubert, from
# linkerd/linkerd-kubert at the tag its Cargo.toml names) is fetched the same way and
# built as a path dependency; everything else comes from crates.io and the Go module
# proxy. The repository pins Rust 1.90, which may not be installable here; the build
# uses the toolchain rustup calls stable (RUSTUP_TOOLCHAIN overrides).
set -euo pipefail
tag=${1:?linkerd2 release tag, like edge-26.8.3}
dest=$(mkdir -p "${2:?destination directory}" && cd "$2" && pwd)
mkdir -p "$dest/bin" "$dest/share/linkerd"
work=$(mktemp -d "${TMPDIR:-/var/tmp}/meshmark-linkerd.XXXXXX")
trap 'rm -rf "$work"' EXIT
export PATH="$PATH:$HOME/.cargo/bin"

# checkout NAME REF DIR: the tree of linkerd/NAME at REF (a tag) in DIR; prints the commit.
checkout() {
  local src="https://github.com/linkerd/$1.git"
  if [ -n "${MESHMARK_GIT_MIRROR:-}" ] && [ -d "$MESHMARK_GIT_MIRROR/linkerd+$1/repo" ]; then
    src="$MESHMARK_GIT_MIRROR/linkerd+$1/repo"
  fi
  local git="$work/git-$1"
  git init -q --bare "$git"
  git --git-dir="$git" fetch -q --depth 1 "$src" "refs/tags/$2:refs/tags/$2"
  mkdir -p "$3"
  git --git-dir="$git" archive "refs/tags/$2" | tar -x -C "$3"
  git --git-dir="$git" rev-parse "refs/tags/$2^{commit}"
}

src="$work/linkerd2"
commit=$(checkout linkerd2 "$tag" "$src")
echo "linkerd2 $tag: commit $commit"
{
  echo "linkerd2 $tag $commit"
  echo "linkerd2-proxy (from the release): $(cat "$src/.proxy-version")"
} >"$dest/share/linkerd/SOURCES"
cp "$src/LICENSE" "$dest/share/linkerd/LICENSE"

export CGO_ENABLED=0
echo "building linkerd-controller (Go) from linkerd2 $tag"
(cd "$src" && go build -trimpath -o "$dest/bin/linkerd-controller" -tags prod -mod=readonly -ldflags "-s -w" ./controller/cmd)
echo "building linkerd2-proxy-identity (Go) from linkerd2 $tag"
(cd "$src" && go build -trimpath -o "$dest/bin/linkerd2-proxy-identity" -mod=readonly -ldflags "-s -w" ./proxy-identity)

# proxy-init at the ref the release's proxy image is built with.
init_ref=$(sed -n 's/^ARG PROXY_INIT_REF="\(.*\)"$/\1/p' "$src/Dockerfile.proxy")
[ -n "$init_ref" ] || { echo "no PROXY_INIT_REF in linkerd2 $tag's Dockerfile.proxy" >&2; exit 1; }
init_commit=$(checkout linkerd2-proxy-init "$init_ref" "$work/proxy-init")
echo "building linkerd2-proxy-init (Go) from linkerd2-proxy-init $init_ref ($init_commit)"
(cd "$work/proxy-init" && go build -trimpath -o "$dest/bin/linkerd2-proxy-init" -mod=readonly -ldflags "-s -w" ./proxy-init)
echo "linkerd2-proxy-init $init_ref $init_commit" >>"$dest/share/linkerd/SOURCES"

# The policy controller, with kubert's git dependency made a path dependency on the same
# tag's source.
kubert_tag=$(sed -n '/^\[workspace.dependencies.kubert\]/,/^\[/s/^tag = "\(.*\)"$/\1/p' "$src/Cargo.toml")
[ -n "$kubert_tag" ] || { echo "no kubert tag in linkerd2 $tag's Cargo.toml" >&2; exit 1; }
kubert_commit=$(checkout linkerd-kubert "$kubert_tag" "$work/kubert")
echo "linkerd-kubert $kubert_tag $kubert_commit (as a path dependency)" >>"$dest/share/linkerd/SOURCES"
sed -i -e '/^\[workspace.dependencies.kubert\]/,/^\[/{s|^git = .*$|path = "'"$work"'/kubert/kubert"|;/^tag = /d}' "$src/Cargo.toml"
grep -q "path = \"$work/kubert/kubert\"" "$src/Cargo.toml" || { echo "could not point kubert at its source" >&2; exit 1; }
export RUSTUP_TOOLCHAIN=${RUSTUP_TOOLCHAIN:-stable}
echo "building linkerd-policy-controller (Rust, $(rustc --version)) from linkerd2 $tag; this takes a while"
start=$(date +%s)
(cd "$src" && RUSTFLAGS="--cfg tokio_unstable" nice cargo build --release --package linkerd-policy-controller)
echo "linkerd-policy-controller built in $(( $(date +%s) - start )) s"
target=${CARGO_TARGET_DIR:-$src/target}
cp "$target/release/linkerd-policy-controller" "$dest/bin/linkerd-policy-controller"
strip "$dest/bin/linkerd-policy-controller" 2>/dev/null || true
echo "rustc: $(rustc --version)" >>"$dest/share/linkerd/SOURCES"
echo "$tag" >"$dest/share/linkerd/VERSION"
cat "$dest/share/linkerd/SOURCES"
