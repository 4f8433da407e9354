#!/usr/bin/env bash
# Installs what `make test-images` runs the built images with, when missing:
# podman, conmon and runc (Debian's crun 1.8 refuses hybrid cgroup
# hierarchies, so the tests run runc), from Debian's packages. Needs root
# and apt.
set -euo pipefail

need=()
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v runc >/dev/null 2>&1 || need+=(runc)
command -v conmon >/dev/null 2>&1 || need+=(conmon)

if [ ${#need[@]} -eq 0 ]; then
	exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
	echo "missing packages ${need[*]}: run as root (or install them yourself)" >&2
	exit 1
fi
echo ">> installing ${need[*]} with apt-get"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
