#!/usr/bin/env bash
# Builds what a real test node runs into OUTDIR: containerd, ctr and
# containerd-shim-runc-v2, and runc (with seccomp: containerd always applies
# the runtime-default profile), pinned as tools in tests/node/go.mod, and
# kubelet from tests/kube (the module and flags of the control plane, so the
# compiled Kubernetes packages are shared; hack/build-kube.sh). libseccomp-dev
# is installed with apt-get when missing. OUTDIR is keyed by what the binaries
# are built from (hack/bin-cache.sh, run by the Makefile), so a binary found
# there is kept: a rerun with everything built takes seconds.
# Cold: containerd ~3 min, runc ~1, kubelet ~1 with a warm control-plane cache.
set -euo pipefail
# No cgo unless a build asks for it (runc), as the Makefile sets for every
# Go command: the build cache keys compiled packages on it.
export CGO_ENABLED=${CGO_ENABLED:-0}
out=${1:?usage: build-node.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
hack=$(cd "$(dirname "$0")" && pwd)
node_mod="$hack/../tests/node"

# fresh BIN: BIN was built into this keyed directory.
fresh() {
	[ -x "$out/$1" ]
}

# build NAME PACKAGE [GO BUILD FLAGS...] (run inside the module)
build() {
	local name=$1 pkg=$2
	shift 2
	echo ">> building $name"
	local start
	start=$(date +%s)
	go build -trimpath "$@" -o "$out/$name.tmp" "$pkg"
	mv "$out/$name.tmp" "$out/$name"
	echo ">> built $name in $(($(date +%s) - start))s"
}

cd "$node_mod"
containerd_version=$(go list -m -f '{{.Version}}' github.com/containerd/containerd/v2)
ctrd_ldflags="-s -w -X github.com/containerd/containerd/v2/version.Version=${containerd_version#v}"
for c in containerd ctr containerd-shim-runc-v2; do
	fresh "$c" || build "$c" "github.com/containerd/containerd/v2/cmd/$c" \
		-tags no_btrfs -ldflags "$ctrd_ldflags"
done
if ! fresh runc; then
	"$hack/apt-install.sh" /usr/include/seccomp.h=libseccomp-dev gcc=gcc /usr/include/stdio.h=libc6-dev pkg-config=pkg-config
	CGO_ENABLED=1 build runc github.com/opencontainers/runc -tags seccomp -ldflags "-s -w"
fi
"$hack/build-kube.sh" "$out" kubelet
