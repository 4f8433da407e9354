// Package podcache is what the repair controller's informers hold of the
// objects they watch, and the one way to read it back.
//
// What is kept, and why. The informers' transforms (InjectedPodTransform,
// CNIPodTransform, NodeTransform) run before an object is cached and keep
// only what the judgement (package judge: detector, gate, breaker, race
// lane) and the actions read. Of an injected pod: names, UID and
// resourceVersion (the actions' preconditions), the controlling owner (no
// owner, no action), our markers among the labels and annotations, node,
// restart policy, host network, phase, IP and start time, the conditions
// PodReadyToStartContainers and the node verifier's, the check init
// containers' statuses without messages, one status standing for every
// other container (when the first started, whether any restarted and when
// its previous run ended: what signal C needs) and, of the managed fields,
// the time and manager of the entry that owns the status annotation. Of a
// CNI DaemonSet pod: its readiness and the start of its running containers
// (the node's "CNI ready since"). Of a node: labels, taints, the
// ready-since annotation and the verifier's condition. The rest (specs,
// images, messages, other managed fields) never reaches the cache.
//
// The compact form. An injected pod is then held as a cachedPod, about a
// fifth of the slim corev1.Pod's bytes (a corev1.Pod is a 1,280-byte
// allocation even nearly empty): times as Unix nanoseconds; the UID as the
// UUID's 16 bytes and the resourceVersion as a number, the texts kept as
// they came when either is in another form, beside the deletion time in
// the fields few pods need (one pointer, nil for most); the values many
// pods share (namespace, node, owner, manager, phase, condition types and
// reasons) as unique handles; the marker annotations as one map shared by every pod
// that carries the same ones, cni-applied-at apart. A pod with a time the
// compact form cannot hold stays a slim corev1.Pod. Cached objects are
// immutable and share what they can.
//
// The one read contract. Readers never see the compact form: PodOf (and
// PodIn, which expands into a reused Buffer for passes over every pod)
// gives the very slim corev1.Pod back, whatever the cache holds (a compact
// pod, a slim pod, a tombstone), so the controller and the audit judge one
// type with the same code. UIDOf and KeyOf read a cached pod's UID without
// expanding it; Indexers index the informer by node (judge.IndexByNode).
package podcache
