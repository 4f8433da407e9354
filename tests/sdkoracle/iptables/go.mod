module github.com/consul-cni-repair/consul-cni-repair/tests/sdkoracle/iptables

go 1.26.8

require github.com/hashicorp/consul/sdk v0.18.1
