#!/usr/bin/env bash
# Installs promtool (Debian's prometheus package) when it is missing: the
# alert rules' unit tests run `promtool test rules`. Needs root and Debian's
# apt. Debian may start a prometheus service on install; it is stopped, the
# tests only use promtool.
set -euo pipefail

if command -v promtool >/dev/null 2>&1; then
	exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
	echo "missing promtool (Debian package prometheus): run as root (or install it yourself)" >&2
	exit 1
fi
echo ">> installing prometheus (for promtool) with apt-get"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends prometheus >/dev/null
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
	systemctl stop prometheus || true
fi
command -v promtool >/dev/null
