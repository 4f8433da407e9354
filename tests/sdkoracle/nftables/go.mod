module github.com/consul-cni-repair/consul-cni-repair/tests/sdkoracle/nftables

go 1.26.9

toolchain go1.27.3

require github.com/hashicorp/consul/sdk v0.19.0
