// Package manifests checks what the project ships to a cluster: the kustomize
// overlays and the Helm chart (the chart renders what the overlays do), RBAC,
// pod templates, the admission policies, the alert rules (on data, with
// promtool), the runbook and the dashboard's queries. With
// the build tag integration it applies them to the local control plane
// (server-side dry-run, RBAC by impersonation, helm install, upgrade and
// uninstall on simulated and real nodes, migration from consul-k8s's CNI, the
// README's install path after make publish to a real registry on loopback).
//
// It is a module of its own so that Helm and kustomize stay out of the
// product's go.mod (ARCHITECTURE.md, Modules).
//
//	cd tests/suites/manifests && go test ./...
package manifests
