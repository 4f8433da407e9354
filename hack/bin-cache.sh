#!/usr/bin/env bash
# bin-cache.sh LINK NAME FILE...
#
# Built Kubernetes and node binaries are kept once per user, not once per clone: the directory is
# ${CCR_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/consul-cni-repair}/NAME-KEY, where KEY hashes the Go toolchain
# and the FILEs the binaries are built from (the modules' go.mod and go.sum, the build scripts). A second clone,
# or this one after `make clean`, finds them built. LINK (a path in the clone, such as .cache/kube/bin) becomes a
# symbolic link to that directory, which is printed.
set -euo pipefail
link=${1:?usage: bin-cache.sh LINK NAME FILE...}
name=${2:?usage: bin-cache.sh LINK NAME FILE...}
shift 2
root=${CCR_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/consul-cni-repair}
key=$( { go env GOVERSION GOOS GOARCH CGO_ENABLED GOFLAGS; cat "$@"; } | sha256sum | cut -c1-16)
dir="$root/$name-$key"
mkdir -p "$dir" "$(dirname "$link")"
if [ -d "$link" ] && [ ! -L "$link" ]; then
	rm -rf "$link" # a directory of binaries from before the per-user cache
fi
ln -sfn "$dir" "$link"
echo "$dir"
