#!/usr/bin/env bash
# Makes one pod of the example Deployment start outside the mesh on the local
# cluster (make cluster), the way the race does on a new node: the pod's
# sandbox is created while the nodes' CNI chain lacks consul-cni, then the
# installer chains the plugin again. Prints the name of that pod on stdout,
# the steps on stderr. Needs kubectl (KUBECONFIG of the local cluster), Go
# (it runs consul-cni-installer from this tree) and the consul-cni DaemonSet.
#
#   NAMESPACE (example) and APP (web): the workload's namespace and app label.
set -euo pipefail
ns=${NAMESPACE:-example}
app=${APP:-web}
cni_ns=consul-cni-repair
cni_ds=consul-cni
cni_pods=app.kubernetes.io/name=consul-cni
paused=consul-cni-repair.example/installer-paused
root_annotation='simnode\.consul-cni-repair\.test/root'

repo=$(cd "$(dirname "$0")/../../.." && pwd)

say() { echo ">> $*" >&2; }

# 1. Stop the installer on every node: a nodeSelector no node matches. On
#    SIGTERM it leaves the plugin chained, as it must on a real node.
say "pausing the $cni_ds DaemonSet (nodeSelector $paused=true)"
kubectl -n "$cni_ns" patch daemonset "$cni_ds" --type merge \
	-p "{\"spec\":{\"template\":{\"spec\":{\"nodeSelector\":{\"$paused\":\"true\"}}}}}" >&2
kubectl -n "$cni_ns" wait --for=delete pod -l "$cni_pods" --timeout=2m >&2

# 2. Take consul-cni out of each node's chain, as on a node the installer
#    has not reached yet. A simulated node's files are under the directory
#    its Node annotation names.
for node in $(kubectl get nodes -o name); do
	root=$(kubectl get "$node" -o jsonpath="{.metadata.annotations.$root_annotation}")
	if [ -z "$root" ]; then
		echo "bypass.sh: $node is not a simulated node of the local cluster (no annotation $root_annotation)" >&2
		exit 1
	fi
	say "removing consul-cni from the chain of ${node#node/} ($root/etc/cni/net.d)"
	go -C "$repo" run ./cmd/consul-cni-installer uninstall \
		--cni-bin-dir "$root/opt/cni/bin" --cni-net-dir "$root/etc/cni/net.d" >&2
done

# 3. Replace one pod of the workload: its replacement's sandbox is created
#    by a chain without the plugin, so its traffic is not redirected.
old=$(kubectl -n "$ns" get pods -l "app=$app" -o name)
victim=$(echo "$old" | head -n 1)
if [ -z "$victim" ]; then
	echo "bypass.sh: no pod with label app=$app in namespace $ns" >&2
	exit 1
fi
say "deleting ${victim#pod/}; its replacement starts without consul-cni"
kubectl -n "$ns" delete "$victim" --wait=true >&2
pod=
for _ in $(seq 120); do
	pod=$(kubectl -n "$ns" get pods -l "app=$app" --field-selector status.phase=Running -o name |
		grep -vxF -e "$old" | head -n 1 || true)
	[ -n "$pod" ] && break
	sleep 1
done
if [ -z "$pod" ]; then
	echo "bypass.sh: no replacement of ${victim#pod/} is running after 2 minutes" >&2
	exit 1
fi
status=$(kubectl -n "$ns" get "$pod" -o jsonpath='{.metadata.annotations.consul\.hashicorp\.com/transparent-proxy-status}')
say "${pod#pod/} runs on $(kubectl -n "$ns" get "$pod" -o jsonpath='{.spec.nodeName}') with transparent-proxy-status \"$status\""

# 4. Let the installer chain the plugin again.
say "resuming the $cni_ds DaemonSet"
kubectl -n "$cni_ns" patch daemonset "$cni_ds" --type json \
	-p "[{\"op\":\"remove\",\"path\":\"/spec/template/spec/nodeSelector/${paused/\//~1}\"}]" >&2
kubectl -n "$cni_ns" rollout status daemonset "$cni_ds" --timeout=3m >&2
if [ "$status" = complete ]; then
	echo "bypass.sh: ${pod#pod/} got its redirection (consul-cni was still in its chain)" >&2
	exit 1
fi
echo "${pod#pod/}"
