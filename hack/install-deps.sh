#!/usr/bin/env bash
# Installs the system packages the privileged and integration tiers and the
# demo use, when they are missing: iptables (nft and legacy), iproute2,
# nsenter (util-linux) and etcd. Needs root and Debian's apt. Go itself is
# hack/install-go.sh's job.
set -euo pipefail

need=()
command -v iptables-restore >/dev/null 2>&1 || need+=(iptables)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v nsenter >/dev/null 2>&1 || need+=(util-linux)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)

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
# Debian may start an etcd service on install; tests start their own on
# loopback ports, so stop a packaged one if it runs.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet etcd 2>/dev/null; then
	systemctl stop etcd || true
fi
