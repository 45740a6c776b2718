#!/usr/bin/env bash
# Runs a build script once per cache key and links what it built into the tools
# directory: a clean checkout (CI's, or a second one) finds the binaries built before
# instead of spending minutes on them again. The build script gets the directory to
# build into as its last argument and puts executables in its bin/ and other files in
# its share/; they are linked into TOOLS/bin and TOOLS/share.
#   scripts/cached-build.sh CACHE_DIR TOOLS_DIR SCRIPT ARGS...
set -euo pipefail
cache=${1:?cache directory (one per build, named by its versions)}
tools=${2:?tools directory}
shift 2
if [ ! -f "$cache/.complete" ]; then
  rm -rf "$cache.partial"
  mkdir -p "$(dirname "$cache")"
  "$@" "$cache.partial"
  touch "$cache.partial/.complete"
  rm -rf "$cache"
  mv "$cache.partial" "$cache"
else
  echo "using the build cached in $cache"
fi
for kind in bin share; do
  [ -d "$cache/$kind" ] || continue
  mkdir -p "$tools/$kind"
  for f in "$cache/$kind"/*; do
    link="$tools/$kind/$(basename "$f")"
    # An earlier layout may have left a real file or directory there.
    [ -L "$link" ] || rm -rf "$link"
    ln -sfn "$f" "$link"
  done
done
