// Package repair is the consul-cni-repair controller: it finds Consul
// transparent-proxy pods whose sandbox was created without the consul-cni
// plugin and gets them recreated by their owner.
//
// A Manager runs everything of the repair Deployment: the shared informers
// (Informers: injected pods, nodes and CNI DaemonSet pods, slimmed to what
// the controllers read before they are cached, listed page by page), the
// metrics (Prometheus names in package metrics) and health endpoints,
// leader election on a Lease (package leader: the controllers run only
// while this replica holds it, the lease is released only once they have
// stopped, and every action ends by the leader's fence, so two replicas
// never act at once) and, on the leader, two controllers: the pod
// Controller here and node readiness (package nodeready). Informers run on
// every replica, so a new leader starts warm.
//
// The Controller follows sample-controller: cheap event handlers put pod keys
// on a rate-limited workqueue, and sync judges one pod from the caches with
// package judge (signals, node gate, circuit breaker, the race lane) and
// makes at most one API call: an eviction, a delete or a label patch, each
// with preconditions on the pod's UID and resourceVersion, or in a dry run
// only an Event. The Limiter bounds the actions: a cluster-wide cap for
// every action, and per-node and global token buckets for pods not of the
// race. Every skip, action and its latency is counted.
package repair

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/leader"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/limit"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/metrics"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/podcache"
)

// Event reasons. They are constant so that Events can be selected by reason.
const (
	// EventBypassedCNI (Warning, pod): the pod was evicted, deleted or
	// labelled because it runs outside the mesh.
	EventBypassedCNI = "BypassedCNI"
	// EventWouldRepair (Normal, pod): dry run, what would have been done.
	EventWouldRepair = "WouldRepair"
	// EventBarePodNotRepaired (Warning, pod): broken, but nothing would
	// recreate it, so it is left alone.
	EventBarePodNotRepaired = "BarePodNotRepaired"
	// EventEvictionBlocked (Warning, pod): a PodDisruptionBudget refused the
	// eviction; it is retried with back-off.
	EventEvictionBlocked = "EvictionBlocked"
	// EventRepairCircuitOpen (Warning, node) and EventRepairCircuitClosed
	// (Normal, node): the circuit breaker stopped / resumed repairs there.
	EventRepairCircuitOpen   = "RepairCircuitOpen"
	EventRepairCircuitClosed = "RepairCircuitClosed"
)

// breakerRecheck is how often pods held by an open breaker are looked at again
// even without any change (a safety net: changes requeue them at once).
const breakerRecheck = time.Minute

// actionTimeout bounds one action's API call, which shutdown does not cancel.
const actionTimeout = 10 * time.Second

// stateSweep is how often the per-pod state of pods no longer in the cache
// is dropped.
const stateSweep = 5 * time.Minute

// Controller finds injected pods that bypassed the CNI plugin and gets them
// recreated. It follows sample-controller: cheap handlers put pod keys on a
// rate-limited workqueue; workers run sync, which only reads the informer
// caches and makes at most one API call.
type Controller struct {
	cfg      Config
	detector judge.Detector
	client   kubernetes.Interface
	podIndex cache.Indexer
	nodes    corelisters.NodeLister
	gate     judge.Gate
	recorder record.EventRecorder
	metrics  *Metrics
	limiter  *limit.Limiter
	actions  *nodeActions
	breaker  *judge.Breaker
	queue    workqueue.TypedRateLimitingInterface[string]
	synced   []cache.InformerSynced
	now      func() time.Time

	mu    sync.Mutex
	state map[types.UID]*podState
	// verifying: the nodes a verifier reported for at the last
	// recheckVerifiers (verified.go).
	verifying map[string]bool
	// cniLook: the looks at nodes' CNI pods observeCNI scheduled, by
	// node; nil once the controller has stopped (stopLooks).
	cniLook map[string]*time.Timer
}

// podState is what the controller remembers about a broken pod, by UID.
type podState struct {
	firstBroken time.Time
	acted       bool
	skip        string
	blocked     bool
}

// newController wires the repair controller to the shared informers.
func newController(cfg Config, client kubernetes.Interface, inf *Informers, recorder record.EventRecorder, m *Metrics) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Controller{
		cfg:      cfg,
		detector: cfg.Detector(),
		client:   client,
		podIndex: inf.Pods.GetIndexer(),
		nodes:    corelisters.NewNodeLister(inf.Nodes.GetIndexer()),
		recorder: recorder,
		metrics:  m,
		limiter:  limit.New(cfg.MaxRepairsPerMinute, cfg.MaxRepairsPerNodePerMinute),
		actions:  newNodeActions(),
		breaker:  judge.NewBreaker(cfg.BreakerThreshold, cfg.BreakerMinPods),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](cfg.BackoffBase, cfg.BackoffMax),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "pods", MetricsProvider: m.Workqueue}),
		synced:  []cache.InformerSynced{inf.Pods.HasSynced, inf.Nodes.HasSynced},
		now:     time.Now,
		state:   map[types.UID]*podState{},
		cniLook: map[string]*time.Timer{},
	}
	c.detector.VerifierHeartbeat = c.verifierHeartbeat
	var cniIndex cache.Indexer
	if inf.CNIPods != nil {
		cniIndex = inf.CNIPods.GetIndexer()
		c.synced = append(c.synced, inf.CNIPods.HasSynced)
	}
	if cfg.Gate == judge.GateCNIPod && cniIndex == nil {
		return nil, errors.New("cni-pod gate needs the CNI pod informer")
	}
	// In a dry run node readiness writes no label: the node-label gate
	// opens where it would have.
	dryRunLabels := cfg.Gate == judge.GateNodeLabel && cfg.DryRun && cfg.NodeReadiness && cniIndex != nil
	c.gate = judge.NewGate(cfg.Gate, c.nodes, cniIndex, time.Now(), dryRunLabels)
	m.initCounters(cfg)
	m.registerBreaker(c.breaker)
	m.stateCollector.brokenCounts = c.brokenCounts
	m.stateCollector.nodeCounts = c.nodeCounts

	if _, err := inf.Pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueuePod,
		UpdateFunc: func(_, obj interface{}) { c.enqueuePod(obj) },
		DeleteFunc: c.podDeleted,
	}); err != nil {
		return nil, err
	}
	if _, err := inf.Nodes.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj interface{}, initial bool) {
			if n, ok := obj.(*corev1.Node); ok {
				c.nodeChanged(n, initial)
			}
		},
		UpdateFunc: func(old, obj interface{}) {
			o, ok1 := old.(*corev1.Node)
			n, ok2 := obj.(*corev1.Node)
			if ok1 && ok2 && (judge.LabelledReady(o) != judge.LabelledReady(n) ||
				o.Annotations[annotations.AnnotationCNIReadySince] != n.Annotations[annotations.AnnotationCNIReadySince]) {
				c.nodeChanged(n, false)
			}
		},
		DeleteFunc: c.nodeDeleted,
	}); err != nil {
		return nil, err
	}
	if inf.CNIPods != nil && (cfg.Gate == judge.GateCNIPod || dryRunLabels) {
		if _, err := inf.CNIPods.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    c.cniPodChanged,
			UpdateFunc: func(_, obj interface{}) { c.cniPodChanged(obj) },
			DeleteFunc: c.cniPodChanged,
		}); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Run starts workers and blocks until ctx is done, then drains the queue.
func (c *Controller) Run(ctx context.Context) error {
	defer utilruntime.HandleCrashWithContext(ctx)
	defer c.queue.ShutDown()
	defer c.stopLooks()
	logger := klog.FromContext(ctx)
	logger.Info("Starting repair controller", "action", c.cfg.Action, "dryRun", c.cfg.DryRun, "gate", c.cfg.Gate, "workers", c.cfg.Workers)
	if !cache.WaitForNamedCacheSyncWithContext(ctx, c.synced...) {
		if ctx.Err() != nil {
			return nil // shut down while waiting
		}
		return errors.New("repair: caches did not sync")
	}
	var wg sync.WaitGroup
	for i := 0; i < c.cfg.Workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wait.UntilWithContext(ctx, c.runWorker, time.Second)
		}()
	}
	if c.cfg.Breaker {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wait.UntilWithContext(ctx, c.recheckBreakers, breakerRecheck)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		wait.UntilWithContext(ctx, func(context.Context) { c.forgetGonePods() }, stateSweep)
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		wait.UntilWithContext(ctx, func(context.Context) { c.recheckVerifiers() }, verifierRecheck)
	}()
	<-ctx.Done()
	logger.Info("Stopping repair controller")
	c.queue.ShutDown()
	wg.Wait()
	return nil
}

func (c *Controller) runWorker(ctx context.Context) {
	for c.processNext(ctx) {
	}
}

func (c *Controller) processNext(ctx context.Context) bool {
	key, shutdown := c.queue.Get()
	if shutdown {
		return false
	}
	defer c.queue.Done(key)
	err := c.sync(ctx, key)
	if err == nil {
		c.queue.Forget(key)
		return true
	}
	var retry *retryError
	if errors.As(err, &retry) {
		klog.FromContext(ctx).V(2).Info("Will retry", "pod", key, "why", err, "attempts", c.queue.NumRequeues(key)+1)
	} else {
		utilruntime.HandleErrorWithContext(ctx, err, "Repairing pod failed; will retry", "pod", key)
	}
	c.queue.AddRateLimited(key)
	return true
}

// retryError is an expected condition that only a later retry can clear (a
// PodDisruptionBudget without budget).
type retryError struct{ msg string }

func (e *retryError) Error() string { return e.msg }

func (c *Controller) enqueuePod(obj interface{}) {
	key, err := cache.MetaNamespaceKeyFunc(obj)
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	if p, ok := podcache.PodOf(obj); ok && annotations.UsesTransparentProxy(p.Labels, p.Annotations) {
		c.metrics.knowNamespace(p.Namespace)
	}
	c.queue.Add(key)
}

func (c *Controller) podDeleted(obj interface{}) {
	if uid, ok := podcache.UIDOf(obj); ok {
		c.mu.Lock()
		delete(c.state, uid)
		c.mu.Unlock()
	}
}

// enqueueNode requeues every injected pod on node (the gate or the breaker
// may have changed there).
func (c *Controller) enqueueNode(node string) {
	objs, err := c.podIndex.ByIndex(judge.IndexByNode, node)
	if err != nil {
		return
	}
	for _, o := range objs {
		c.enqueuePod(o)
	}
}

func (c *Controller) nodeChanged(node *corev1.Node, initial bool) {
	c.gate.Observe(node, initial)
	if !initial {
		c.enqueueNode(node.Name)
	}
}

func (c *Controller) nodeDeleted(obj interface{}) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	node, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	c.gate.Forget(node.Name)
	c.limiter.ForgetNode(node.Name)
	c.breaker.Forget(node.Name)
	c.actions.forget(node.Name)
}

func (c *Controller) cniPodChanged(obj interface{}) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if pod, ok := obj.(*corev1.Pod); ok && pod.Spec.NodeName != "" {
		c.observeCNI(pod.Spec.NodeName)
		c.enqueueNode(pod.Spec.NodeName)
	}
}

// observeCNI lets the gate see node's CNI pods now and, while a not-ready
// spell there is shorter than the flap bound, once more when it reaches it
// (one timer per node at a time): a spell that outlasts the bound with no
// event in it still drops the cni-pod gate's baseline.
func (c *Controller) observeCNI(node string) {
	c.scheduleLook(node, c.gate.ObserveCNI(node), false)
}

// scheduleLook schedules a look at node's CNI pods in again (none when it
// is 0) unless one is scheduled already or the controller has stopped.
// fired says the scheduled look is the caller: it has looked, and its
// place is free.
func (c *Controller) scheduleLook(node string, again time.Duration, fired bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cniLook == nil {
		return
	}
	if fired {
		delete(c.cniLook, node)
	}
	if again <= 0 || c.cniLook[node] != nil {
		return
	}
	c.cniLook[node] = time.AfterFunc(again, func() {
		c.scheduleLook(node, c.gate.ObserveCNI(node), true)
	})
}

// stopLooks cancels the looks observeCNI scheduled, and it schedules no
// more: a stopped controller leaves nothing running behind it.
func (c *Controller) stopLooks() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range c.cniLook {
		t.Stop()
	}
	c.cniLook = nil
}

// sync looks at one pod and acts on it when it is broken and every safety
// check passes. It returns an error only when a retry may help.
func (c *Controller) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		utilruntime.HandleErrorWithContext(ctx, err, "Bad queue key", "key", key)
		return nil
	}
	obj, exists, err := c.podIndex.GetByKey(ns + "/" + name)
	if err != nil {
		return err
	}
	pod, ok := podcache.PodOf(obj)
	if !exists || !ok {
		return nil
	}
	now := c.now()
	v := c.detector.Detect(pod, now)
	if !v.Broken {
		c.mu.Lock()
		delete(c.state, pod.UID)
		c.mu.Unlock()
		if !v.RecheckAt.IsZero() {
			c.queue.AddAfter(key, v.RecheckAt.Sub(now))
		}
		return nil
	}
	logger := klog.FromContext(ctx).WithValues("pod", klog.KObj(pod), "node", pod.Spec.NodeName, "reason", v.Reason)
	c.metrics.knowNamespace(pod.Namespace) // normally done by the event handler already
	st := c.podState(pod.UID, now)

	if st.acted || (c.cfg.Action == judge.ActionLabel && pod.Labels[annotations.LabelUninitialized] == annotations.LabelUninitializedValue) {
		c.skip(st, metrics.SkipAlreadyActed)
		return nil
	}
	if controllerOf(pod) == nil && !c.cfg.AllowBarePods {
		if c.skip(st, metrics.SkipBarePod) {
			logger.Info("Broken bare pod left alone: nothing would recreate it", "detail", v.Detail)
			c.recorder.Eventf(pod, corev1.EventTypeWarning, EventBarePodNotRepaired,
				"Pod runs outside the mesh (%s) but has no controller to recreate it; recreate it yourself", v.Detail)
		}
		return nil
	}
	node := pod.Spec.NodeName
	if node == "" {
		return nil
	}
	open, since := c.gate.Open(node)
	if !open {
		if c.skip(st, metrics.SkipGateClosed) {
			logger.V(1).Info("Broken pod waits: CNI not ready on its node", "gate", c.gate.Mode())
		}
		return nil
	}
	if c.cfg.Breaker && c.breakerOpen(ctx, node, since, now) {
		c.skip(st, metrics.SkipBreakerOpen)
		c.queue.AddAfter(key, breakerRecheck)
		return nil
	}
	race := c.detector.OfTheRace(c.gate, pod, since)
	if ok, wait := c.limiter.Take(pod.Namespace, node, race, now); !ok {
		c.skip(st, metrics.SkipRateLimited)
		c.queue.AddAfter(key, wait)
		return nil
	}
	if err = c.act(ctx, logger.WithValues("race", race), pod, v, st); err == nil && !c.cfg.DryRun {
		c.actions.record(node, pod.UID, c.detector.CountedByBreaker(pod, since), since, now)
	}
	return err
}

// forgetGonePods drops the state of pods the cache no longer holds. The
// delete handler does it for most, but a pod replaced under the same name
// while the watch was down reaches us as an update, and a worker still
// judging a pod when its delete arrives recreates the state afterwards.
// It looks for the few pods with state among all cached ones by podcache.UIDKey, so
// the pass allocates nothing per cached pod.
func (c *Controller) forgetGonePods() {
	c.mu.Lock()
	gone := make(map[podcache.UIDKey]types.UID, len(c.state))
	for uid := range c.state {
		gone[podcache.KeyOfUID(uid)] = uid
	}
	c.mu.Unlock()
	if len(gone) == 0 {
		return
	}
	for _, o := range c.podIndex.List() {
		if k, ok := podcache.KeyOf(o); ok {
			delete(gone, k)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, uid := range gone {
		delete(c.state, uid)
	}
}

func (c *Controller) podState(uid types.UID, now time.Time) *podState {
	c.mu.Lock()
	defer c.mu.Unlock()
	st, ok := c.state[uid]
	if !ok {
		st = &podState{firstBroken: now}
		c.state[uid] = st
	}
	return st
}

// skip counts a skip reason once per pod and reason change; it reports
// whether it was counted.
func (c *Controller) skip(st *podState, reason string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st.skip == reason {
		return false
	}
	st.skip = reason
	c.metrics.Skipped.WithLabelValues(reason).Inc()
	return true
}

// breakerOpen counts the injected pods on node whose latest sandbox was
// created after the node's CNI became ready (CountedByBreaker) and updates
// the breaker.
func (c *Controller) breakerOpen(ctx context.Context, node string, since, now time.Time) bool {
	objs, err := c.podIndex.ByIndex(judge.IndexByNode, node)
	if err != nil {
		return true
	}
	broken, total := 0, 0
	var earliest time.Time // of the counted sandboxes, for the log
	var buf podcache.Buffer
	present := map[types.UID]bool{}
	for _, o := range objs {
		p, ok := podcache.PodIn(o, &buf)
		if !ok || !c.detector.CountedByBreaker(p, since) {
			continue
		}
		present[p.UID] = true
		total++
		if c.detector.Detect(p, now).Broken {
			broken++
		}
		if t, _ := judge.SandboxTime(p); earliest.IsZero() || t.Before(earliest) {
			earliest = t
		}
	}
	// Counted pods acted on are gone but were broken (nodeActions).
	acted := c.actions.countedUnder(node, since, now, present)
	broken += acted
	total += acted
	redated := c.actions.redated(node, now)
	if redated >= c.breaker.MinPods {
		// A flapping node (nodeActions): its actions count as broken pods,
		// enough alone to open the breaker.
		broken += redated
		total = broken
	}
	open, changed := c.breaker.Update(node, broken, total)
	if changed {
		ref := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
		if n, err := c.nodes.Get(node); err == nil {
			ref = n
		}
		logger := klog.FromContext(ctx).WithValues("node", node, "broken", broken, "counted", total, "countedActedOn", acted, "actionsAfterReadinessRedated", redated,
			"cniReadySince", since.UTC().Format(time.RFC3339), "earliestCountedSandbox", earliest.UTC().Format(time.RFC3339))
		if open {
			logger.Info("Circuit breaker open: pods whose sandbox was created after the CNI became ready bypass it too; not repairing on this node")
			c.recorder.Eventf(ref, corev1.EventTypeWarning, EventRepairCircuitOpen,
				"%d of %d injected pods whose sandbox was created since the CNI became ready on this node run outside the mesh: the CNI is misconfigured here, repairs stopped", broken, total)
		} else {
			logger.Info("Circuit breaker closed: repairs resume on this node")
			c.recorder.Eventf(ref, corev1.EventTypeNormal, EventRepairCircuitClosed,
				"Repairs resumed: %d of %d injected pods whose sandbox was created since the CNI became ready run outside the mesh", broken, total)
		}
	}
	return open
}

// recheckBreakers judges every open breaker again. Pods re-examine the
// breaker of their node when they are synced, but once the broken pods of a
// node are gone (deleted by hand, say) none is synced there any more, and
// without this the breaker, its gauge and its alert would stay open.
func (c *Controller) recheckBreakers(ctx context.Context) {
	now := c.now()
	for _, node := range c.breaker.Open() {
		if open, since := c.gate.Open(node); open {
			c.breakerOpen(ctx, node, since, now)
		}
	}
}

// act performs the configured action (or its dry run) once.
func (c *Controller) act(ctx context.Context, logger klog.Logger, pod *corev1.Pod, v judge.Verdict, st *podState) error {
	action := string(c.cfg.Action)
	owner := controllerOf(pod)
	ownerDesc := "no owner"
	if owner != nil {
		ownerDesc = owner.Kind + "/" + owner.Name
	}
	if c.cfg.DryRun {
		c.markActed(st)
		c.metrics.DryRunRepairs.WithLabelValues(pod.Namespace, action, string(v.Reason)).Inc()
		logger.Info("Dry run: would repair pod", "action", action, "detail", v.Detail)
		c.recorder.Eventf(pod, corev1.EventTypeNormal, EventWouldRepair,
			"Dry run: would %s this pod (owner %s): it runs outside the mesh: %s", action, ownerDesc, v.Detail)
		return nil
	}
	// A started action is seen through even when the controller is being
	// stopped: canceled in flight, it may still be applied by the API
	// server while we record neither its Event nor its count.
	deadline, ok := leader.ActionDeadline(ctx, time.Now(), actionTimeout)
	if !ok {
		logger.Info("Not acting: the lease was not renewed in time, another replica may lead now", "fence", deadline)
		return nil
	}
	actx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	err := c.do(actx, pod)
	cancel()
	switch {
	case err == nil:
		c.markActed(st)
		c.metrics.Repairs.WithLabelValues(pod.Namespace, action, string(v.Reason)).Inc()
		c.metrics.Latency.WithLabelValues(action).Observe(c.now().Sub(st.firstBroken).Seconds())
		logger.Info("Repaired pod that bypassed the CNI plugin", "action", action, "owner", ownerDesc, "detail", v.Detail)
		c.recorder.Eventf(pod, corev1.EventTypeWarning, EventBypassedCNI, "%s: pod runs outside the mesh (%s); %s",
			actionVerb(c.cfg.Action), v.Detail, actionEffect(c.cfg.Action, ownerDesc))
		return nil
	case apierrors.IsNotFound(err):
		return nil // gone already
	case apierrors.IsConflict(err):
		// UID/resourceVersion precondition failed: the pod changed or
		// was replaced; its update event brings it back.
		logger.V(2).Info("Pod changed before the action; re-examining", "err", err)
		return nil
	case c.cfg.Action == judge.ActionEvict && apierrors.IsTooManyRequests(err) && apierrors.HasStatusCause(err, policyv1.DisruptionBudgetCause):
		c.metrics.RepairFailures.WithLabelValues(pod.Namespace, action, string(v.Reason), metrics.CausePDBBlocked).Inc()
		c.mu.Lock()
		first := !st.blocked
		st.blocked = true
		c.mu.Unlock()
		if first {
			c.recorder.Eventf(pod, corev1.EventTypeWarning, EventEvictionBlocked,
				"Pod runs outside the mesh (%s) but a PodDisruptionBudget forbids its eviction now; retrying with back-off", v.Detail)
		}
		return &retryError{msg: "eviction blocked by a PodDisruptionBudget"}
	default:
		c.metrics.RepairFailures.WithLabelValues(pod.Namespace, action, string(v.Reason), metrics.CauseError).Inc()
		return fmt.Errorf("%s pod %s/%s: %w", action, pod.Namespace, pod.Name, err)
	}
}

func (c *Controller) markActed(st *podState) {
	c.mu.Lock()
	st.acted = true
	c.mu.Unlock()
}

func actionVerb(a judge.Action) string {
	switch a {
	case judge.ActionDelete:
		return "Deleted"
	case judge.ActionLabel:
		return "Labelled"
	}
	return "Evicted"
}

func actionEffect(a judge.Action, owner string) string {
	if a == judge.ActionLabel {
		return "labelled " + annotations.LabelUninitialized + "=" + annotations.LabelUninitializedValue + " for its owner to handle"
	}
	return "its owner " + owner + " recreates it with a new sandbox"
}

// do makes the single API call of the action, with preconditions on the
// pod's UID and resourceVersion so a replaced or changed pod is never hit.
func (c *Controller) do(ctx context.Context, pod *corev1.Pod) error {
	pre := &metav1.Preconditions{UID: &pod.UID, ResourceVersion: &pod.ResourceVersion}
	switch c.cfg.Action {
	case judge.ActionDelete:
		return c.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{Preconditions: pre})
	case judge.ActionLabel:
		patch, err := labelPatch(pod)
		if err != nil {
			return err
		}
		_, err = c.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		if apierrors.IsInvalid(err) {
			// A different UID is refused as an invalid change of an
			// immutable field: the pod was replaced.
			return apierrors.NewConflict(corev1.Resource("pods"), pod.Name, err)
		}
		return err
	default:
		return c.client.PolicyV1().Evictions(pod.Namespace).Evict(ctx, &policyv1.Eviction{
			ObjectMeta:    metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
			DeleteOptions: &metav1.DeleteOptions{Preconditions: pre},
		})
	}
}

// labelPatch is the merge patch of the label action. It adds our label to
// whatever labels the pod has (the cache holds only ours, so it cannot tell
// which exist); the UID and resourceVersion in it are preconditions: the API
// server refuses the patch when the pod was replaced or changed since it
// was judged.
func labelPatch(pod *corev1.Pod) ([]byte, error) {
	return json.Marshal(map[string]any{"metadata": map[string]any{
		"uid":             pod.UID,
		"resourceVersion": pod.ResourceVersion,
		"labels":          map[string]string{annotations.LabelUninitialized: annotations.LabelUninitializedValue},
	}})
}

// brokenCounts counts the cached pods detected broken, by namespace and
// reason (metrics). Every namespace holding an injected transparent-proxy
// pod is in the result, with zero counts when none is broken.
func (c *Controller) brokenCounts() map[string]map[judge.Reason]int {
	out := map[string]map[judge.Reason]int{}
	now := c.now()
	var buf podcache.Buffer
	for _, o := range c.podIndex.List() {
		p, ok := podcache.PodIn(o, &buf)
		if !ok || !annotations.UsesTransparentProxy(p.Labels, p.Annotations) {
			continue
		}
		counts := out[p.Namespace]
		if counts == nil {
			counts = map[judge.Reason]int{}
			out[p.Namespace] = counts
		}
		if v := c.detector.Detect(p, now); v.Broken {
			counts[v.Reason]++
		}
	}
	return out
}

// nodeCounts counts nodes by the gate's view of their CNI readiness.
func (c *Controller) nodeCounts() (ready, notReady int) {
	nodes, err := c.nodes.List(everything)
	if err != nil {
		return 0, 0
	}
	for _, n := range nodes {
		open := judge.LabelledReady(n)
		if c.cfg.Gate == judge.GateCNIPod {
			open, _ = c.gate.Open(n.Name)
		}
		if open {
			ready++
		} else {
			notReady++
		}
	}
	return ready, notReady
}

// controllerOf returns the controlling owner reference of pod, or nil for a
// bare pod (nothing would recreate it).
func controllerOf(pod *corev1.Pod) *metav1.OwnerReference {
	for i := range pod.OwnerReferences {
		ref := &pod.OwnerReferences[i]
		if ref.Controller != nil && *ref.Controller {
			return ref
		}
	}
	return nil
}
