#!/usr/bin/env bash
# Installs the system packages the privileged and integration tiers and the
# demo use, when they are missing: iptables (nft and legacy), iproute2,
# nsenter (util-linux), etcd, nft (nftables: tests read the native backend's
# table back with it; the plugin itself needs no nft) and hyperfine (start-up timing). Debian may start an etcd service on install;
# tests start their own on loopback ports, so a packaged one is stopped. Go
# itself is hack/install-go.sh's job.
exec "$(dirname "$0")/apt-install.sh" --stop etcd \
	iptables-restore=iptables ip=iproute2 nsenter=util-linux etcd=etcd-server nft=nftables hyperfine=hyperfine
