#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager and kube-scheduler from the
# k8s.io/kubernetes module (tests/kube) into the given directory. A cold build
# takes about 15 minutes on 2 cores; the Go build cache makes reruns fast.
set -euo pipefail
out=${1:?usage: build-kube.sh OUTDIR}
version=v1.37.2
# Resolve OUTDIR against the caller's directory before moving into the
# module (a relative path would otherwise land under tests/kube).
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../tests/kube"
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=${version} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37"
for c in kube-apiserver kube-controller-manager kube-scheduler; do
	if [ -x "$out/$c" ] && [ "$("$out/$c" --version 2>/dev/null)" = "Kubernetes ${version}" ] && [ "$out/$c" -nt go.sum ]; then
		continue
	fi
	echo ">> building $c ${version} (cold builds take minutes: apiserver ~10, controller-manager ~3, scheduler <1 on 2 cores)"
	start=$(date +%s)
	go build -trimpath -ldflags "$ldflags" -o "$out/$c.tmp" "./cmd/$c"
	mv "$out/$c.tmp" "$out/$c"
	echo ">> built $c in $(( $(date +%s) - start ))s"
done
