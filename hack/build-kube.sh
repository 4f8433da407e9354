#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kube-scheduler and kubectl
# (or only the commands named after OUTDIR) from the k8s.io/kubernetes and
# k8s.io/kubectl modules (tests/kube) into OUTDIR. A cold build takes about
# 15 minutes on 2 cores; the Go build cache makes reruns fast. OUTDIR is keyed
# by what the binaries are built from (hack/bin-cache.sh, run by the Makefile),
# so a binary found there that reports the version is kept.
set -euo pipefail
# No cgo unless a build asks for it (runc), as the Makefile sets for every
# Go command: the build cache keys compiled packages on it.
export CGO_ENABLED=${CGO_ENABLED:-0}
out=${1:?usage: build-kube.sh OUTDIR [COMMAND...]}
shift
commands=("$@")
[ ${#commands[@]} -gt 0 ] || commands=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
version=v1.37.2
# Resolve OUTDIR against the caller's directory before moving into the
# module (a relative path would otherwise land under tests/kube).
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../tests/kube"
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=${version} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37"
# built_version prints the version a built command reports.
built_version() {
	case "$1" in
	kubectl) "$out/$1" version --client 2>/dev/null | sed -n 's/^Client Version: //p' ;;
	*) "$out/$1" --version 2>/dev/null | sed -n 's/^Kubernetes //p' ;;
	esac
}
for c in "${commands[@]}"; do
	if [ ! -d "cmd/$c" ]; then
		echo "build-kube.sh: no command $c in tests/kube/cmd" >&2
		exit 2
	fi
	if [ -x "$out/$c" ] && [ "$(built_version "$c")" = "${version}" ]; then
		continue
	fi
	echo ">> building $c ${version} (cold builds take minutes: apiserver ~10, controller-manager ~3, scheduler and kubectl ~1 on 2 cores)"
	start=$(date +%s)
	go build -trimpath -ldflags "$ldflags" -o "$out/$c.tmp" "./cmd/$c"
	mv "$out/$c.tmp" "$out/$c"
	echo ">> built $c in $(( $(date +%s) - start ))s"
done
