#!/usr/bin/env bash
# Installs Debian packages for the commands that are missing, with apt-get,
# and stops any service a package started on install (tests start their own
# daemons on loopback ports). Needs root.
#
#   apt-install.sh [--stop SERVICE]... COMMAND=PACKAGE...
#
# COMMAND is a command looked up on PATH, or an absolute path that must
# exist (a header of a -dev package).
#
# Example: apt-install.sh --stop etcd ip=iproute2 etcd=etcd-server /usr/include/seccomp.h=libseccomp-dev
set -euo pipefail

stop=()
need=()
while [ $# -gt 0 ]; do
	case "$1" in
	--stop)
		stop+=("$2")
		shift 2
		;;
	/*=*)
		[ -e "${1%%=*}" ] || need+=("${1#*=}")
		shift
		;;
	*=*)
		command -v "${1%%=*}" >/dev/null 2>&1 || need+=("${1#*=}")
		shift
		;;
	*)
		echo "apt-install.sh: want COMMAND=PACKAGE or --stop SERVICE, got $1" >&2
		exit 2
		;;
	esac
done

if [ ${#need[@]} -eq 0 ]; then
	exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
	echo "missing packages ${need[*]}: run as root (or install them yourself)" >&2
	exit 1
fi
echo ">> installing ${need[*]} with apt-get"
export DEBIAN_FRONTEND=noninteractive
# Wait for another apt-get or dpkg (unattended upgrades on a fresh machine)
# rather than fail.
lock=(-o DPkg::Lock::Timeout=600)
apt-get "${lock[@]}" update -qq
apt-get "${lock[@]}" install -y -qq --no-install-recommends "${need[@]}" >/dev/null
for s in "${stop[@]}"; do
	if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$s" 2>/dev/null; then
		systemctl stop "$s" || true
	fi
done
