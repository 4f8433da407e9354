#!/usr/bin/env bash
# doctor.sh: what this host lacks, or has, that breaks `make test` and `make demo`, said before any long build.
# Each line is ok, WARN (the runs may still pass) or FAIL (they will not), and every WARN and FAIL says how to fix it.
# The kernel is probed by doing what the runs do, in a network namespace of the probe's own: a module list cannot
# tell a built-in feature from a missing one. Exit status 1 when anything FAILs. `make doctor` runs it alone; `make
# test` and `make demo` run it first (after installing the packages it probes with: `make deps`).
set -uo pipefail
fails=0
warns=0
ok() { printf '  ok    %s\n' "$1"; }
warn() { printf '  WARN  %s\n        fix: %s\n' "$1" "$2"; warns=$((warns + 1)); }
fail() { printf '  FAIL  %s\n        fix: %s\n' "$1" "$2"; fails=$((fails + 1)); }
have() { command -v "$1" >/dev/null 2>&1; }

echo "doctor: checking this host for what make test and make demo need"

# Privilege: namespaces, veths, iptables, cgroups, mounts.
if [ "$(id -u)" = 0 ]; then ok "running as root"; else fail "not running as root (uid $(id -u))" "run make as root: the runs create network and mount namespaces, veth pairs, iptables rules and cgroups"; fi
[ "$(id -u)" = 0 ] || { echo "doctor: 1 failure"; exit 1; }

# Packages the probes need (make deps installs them; doctor runs after it).
missing=""
for c in ip iptables ip6tables iptables-legacy nft nsenter unshare etcd; do have "$c" || missing="$missing $c"; done
if [ -z "$missing" ]; then ok "tools: iproute2, iptables (nft and legacy), nftables, util-linux, etcd"; else fail "missing commands:$missing" "make deps (apt-get install iptables iproute2 nftables util-linux etcd-server)"; fi

# Memory and disk: a cold build of Kubernetes and the node binaries fills the Go build cache.
mem_kb=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
if [ "${mem_kb:-0}" -ge $((4 * 1024 * 1024)) ]; then ok "memory: $((mem_kb / 1024)) MiB available"; else warn "memory: only $((${mem_kb:-0} / 1024)) MiB available" "free memory: a control plane, two real nodes and the Go compiler need about 4 GiB"; fi
gocache=$(go env GOCACHE 2>/dev/null || echo "$HOME/.cache")
for d in "$(dirname "$gocache")" "${TMPDIR:-/tmp}"; do
	mkdir -p "$d" 2>/dev/null
	free_gb=$(df -Pk "$d" 2>/dev/null | awk 'NR==2 {print int($4 / 1024 / 1024)}')
	if [ "${free_gb:-0}" -ge 15 ]; then ok "disk: ${free_gb} GiB free for $d"; else fail "disk: ${free_gb:-0} GiB free for $d" "free space: a cold build needs about 15 GiB (Go build and module caches, built binaries, images, node roots)"; fi
done

# inotify: kubelet, containerd and the installer each hold instances; the limit is per user.
limit=$(cat /proc/sys/fs/inotify/max_user_instances)
used=$(find /proc/[0-9]*/fd -lname 'anon_inode:inotify' 2>/dev/null | wc -l)
if [ $((limit - used)) -ge 40 ]; then ok "inotify: $used of $limit instances in use"; else warn "inotify: $used of $limit instances in use, fewer than 40 left" "sysctl -w fs.inotify.max_user_instances=512 (real nodes' kubelet, containerd and installer watch directories)"; fi

# cgroups: kubelet needs these controllers (cgroup v1 hierarchies or v2).
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
	mode=v2; have_ctl=$(cat /sys/fs/cgroup/cgroup.controllers)
else
	mode="v1 (hybrid)"; have_ctl=$(ls /sys/fs/cgroup 2>/dev/null | tr '\n' ' ')
fi
lack=""
for c in cpu memory pids cpuset; do case " $have_ctl " in *" $c "* | *" $c,"* | *",$c "*) ;; *) lack="$lack $c" ;; esac; done
if [ -z "$lack" ]; then ok "cgroups $mode with cpu, memory, pids, cpuset"; else fail "cgroups $mode lack:$lack" "mount the missing cgroup controllers (kubelet refuses to start without them)"; fi

# Addresses: the harness uses 198.18.0.0/15 (RFC 2544) and fd63:6372::/32 in slots of its own; routes of killed
# runs are swept, but another network in those ranges would take its traffic.
# (Routes of the harness itself, of a run going on now, go through links named ccr*; older versions added
# unreachable routes.)
foreign=$( { ip -4 -o route show root 198.18.0.0/15; ip -6 -o route show root fd63:6372::/32; } 2>/dev/null | grep -v -e ' dev ccr' -e '^unreachable ' || true)
if [ -z "$foreign" ]; then ok "addresses: 198.18.0.0/15 and fd63:6372::/32 free on the host"; else fail "addresses: the host already routes inside the test ranges: $(echo "$foreign" | head -3 | tr '\n' ';')" "remove those routes or move that network: the harness owns 198.18.0.0/15 and fd63:6372::/32"; fi

# The kernel, probed in a namespace of our own: veth, IPv6, and the rules the plugin writes with each backend.
ns="ccr-doctor-$$"
if have ip && ip netns add "$ns" 2>/dev/null; then
	trap 'ip netns del "$ns" 2>/dev/null' EXIT
	inns() { ip netns exec "$ns" "$@" >/dev/null 2>&1; }
	if inns ip link add d0 type veth peer name d1; then ok "kernel: network namespaces and veth pairs"; else fail "kernel: cannot create a veth pair" "load the veth module (modprobe veth) or use a kernel with CONFIG_VETH"; fi
	if [ -e /proc/sys/net/ipv6 ] && inns ip -6 addr add fd63:6372:ffff::1/64 dev lo; then ok "kernel: IPv6"; else fail "kernel: IPv6 is off" "boot without ipv6.disable=1 and set net.ipv6.conf.default.disable_ipv6=0 (dual-stack tests)"; fi
	probe_ipt() { # probe_ipt NAME IPTABLES LOOPBACK
		if inns "$2" -t nat -N CCR_DOCTOR && inns "$2" -t nat -A OUTPUT -p tcp -j CCR_DOCTOR &&
			inns "$2" -t nat -A CCR_DOCTOR -m owner --uid-owner 5995 -j RETURN &&
			inns "$2" -t nat -A CCR_DOCTOR -d "$3" -j RETURN &&
			inns "$2" -t nat -A CCR_DOCTOR -p tcp --dport 9000:9100 -j RETURN &&
			inns "$2" -t nat -A CCR_DOCTOR -p tcp -j REDIRECT --to-ports 15001 &&
			inns "$2" -t nat -A OUTPUT -p udp --dport 53 -j DNAT --to-destination "$4"; then
			ok "kernel: $1 nat table with owner, tcp/udp ports, REDIRECT and DNAT"
		else
			fail "kernel: $1 cannot write the plugin's nat rules" "load iptable_nat/ip6table_nat, xt_owner, xt_REDIRECT, xt_nat, xt_tcpudp (modprobe each) or use a kernel with those netfilter options"
		fi
	}
	probe_ipt "iptables (nft backend)" iptables 127.0.0.1/32 127.0.0.1:8600
	probe_ipt "ip6tables (nft backend)" ip6tables ::1/128 "[::1]:8600"
	inns iptables -t nat -F && inns iptables -t nat -X
	probe_ipt "iptables-legacy" iptables-legacy 127.0.0.1/32 127.0.0.1:8600
	if inns nft add table inet ccr_doctor && inns nft add chain inet ccr_doctor out '{ type nat hook output priority -100 ; }' &&
		inns nft add rule inet ccr_doctor out meta skuid 5995 return && inns nft add rule inet ccr_doctor out tcp dport 1-65535 redirect to :15001; then
		ok "kernel: nftables (inet nat chain, skuid, redirect)"
	else
		fail "kernel: nftables cannot write the native backend's table" "load nf_tables, nft_nat, nft_redir (modprobe each) or use a kernel with CONFIG_NF_TABLES_INET"
	fi
	if inns unshare --mount true; then ok "kernel: mount namespaces (real nodes' CNI directories)"; else fail "cannot create a mount namespace" "run in a machine or container that allows unshare(CLONE_NEWNS)"; fi
else
	fail "cannot create a network namespace" "run as root on a kernel with network namespaces (and iproute2 installed: make deps)"
fi

# The host's own forwarding switch is reported, never needed: the harness forwards in namespaces of its own.
echo "  info  host forwarding: net.ipv4.ip_forward=$(cat /proc/sys/net/ipv4/ip_forward), net.ipv6.conf.all.forwarding=$(cat /proc/sys/net/ipv6/conf/all/forwarding 2>/dev/null || echo n/a) (not needed, not changed)"

if [ "$fails" -gt 0 ]; then
	echo "doctor: $fails failures, $warns warnings: fix the failures above before make test or make demo"
	exit 1
fi
echo "doctor: ready ($warns warnings)"
