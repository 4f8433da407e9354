// Package simnode runs simulated Kubernetes nodes that behave like a kubelet
// with containerd where this project's behaviour depends on it:
//
//   - the Node registers with the labels and taints it is given, renews its
//     Lease and Ready condition (Ready only while its CNI configuration
//     directory holds a network, as kubelet reports NetworkReady);
//   - each pod bound to it gets a network namespace and a CNI ADD through
//     libcni, run from the node's own conf and bin dirs read at sandbox
//     creation (so a plugin appended to the conflist later is not applied to
//     sandboxes made before), with the CNI_ARGS containerd sends; a failed
//     ADD is undone and retried;
//   - init and app containers run as real processes inside the pod's network
//     namespace, follow restartPolicy with back-off, and are reported with
//     honest states, exit codes, termination messages and conditions;
//   - on deletion, containers are stopped within the grace period, CNI DEL
//     runs, the namespace is removed and the pod is finalized.
//
// See docs/design/test-harness.md "Simulated nodes" for volumes, path rebasing,
// KUBECONFIG and probes.
package simnode

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

// Version is reported as the node's kubelet version.
const Version = "v1.37.2"

// Config describes one simulated node.
type Config struct {
	Name       string
	Client     kubernetes.Interface
	RestConfig *rest.Config
	// Root is the node's root directory: a hostPath P is Root+P, the CNI
	// configuration is read from Root/etc/cni/net.d and plugins from
	// Root/opt/cni/bin. SetupRoot prepares it with a primary network.
	Root   string
	Labels map[string]string
	// Taints the node registers with (for example the startup taint).
	Taints []corev1.Taint
	// Programs maps an image repository basename to the executable run for
	// containers of that image; other images run IdleCommand. A key
	// "<basename>:<tag>" takes precedence for images with that tag.
	Programs map[string]string
	// Range names the node's pod network namespaces after the test
	// process's address slot, so leftovers of a killed run are cleaned
	// when the slot is reserved again. PodSubnet is the node's pod CIDR.
	Range     *testnet.Range
	PodSubnet netip.Prefix

	// NodeIP is the node's InternalIP and the IP of hostNetwork pods.
	// Default: the first address of PodSubnet (the ptp gateway).
	NodeIP netip.Addr
	// IdleCommand runs for images with no program. Default: sleep infinity.
	// Init containers of such images exit 0 at once (InitIdleCommand,
	// default: true), since an init container must finish.
	IdleCommand     []string
	InitIdleCommand []string
	// RestartBackoff and MaxRestartBackoff bound the crash-loop back-off
	// (kubelet: 10s doubling up to 5m).
	RestartBackoff, MaxRestartBackoff time.Duration
	// SyncRetry is how long a pod whose sandbox or volumes failed waits
	// before the next attempt (kubelet: 10s).
	SyncRetry time.Duration
	// LeaseDuration (default 40s) and HeartbeatInterval (default 10s).
	LeaseDuration, HeartbeatInterval time.Duration
	// Logf receives the node's own log lines. Default: discarded.
	Logf func(format string, args ...any)
	// KeepNode leaves the Node object in place on Stop (default: deleted,
	// so the pod garbage collector removes its pods).
	KeepNode bool
}

// RootAnnotation is the Node annotation that names the node's root directory
// (Config.Root) on the machine: scripts of the local cluster find a node's
// CNI configuration (Root/etc/cni/net.d) through it.
const RootAnnotation = "simnode.consul-cni-repair.test/root"

// Node is a running simulated node.
type Node struct {
	cfg      Config
	client   kubernetes.Interface
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	recorder record.EventRecorder
	bcast    record.EventBroadcaster

	mu      sync.Mutex
	workers map[types.UID]*podWorker
	stopped bool

	netReady    bool
	netReadyMsg string
	stopOnce    sync.Once
	net         *nodeNetwork
	api         *apiProxy
	kubelet     *kubeletAPI
	cniLog      *os.File
}

func (c *Config) defaults() error {
	if c.Name == "" || c.Client == nil || c.RestConfig == nil || c.Root == "" {
		return errors.New("simnode: Name, Client, RestConfig and Root are required")
	}
	if !c.PodSubnet.IsValid() || c.Range == nil {
		return errors.New("simnode: PodSubnet and Range are required")
	}
	if !c.NodeIP.IsValid() {
		c.NodeIP = testnet.Host(c.PodSubnet.Masked(), 1)
	}
	if len(c.IdleCommand) == 0 {
		c.IdleCommand = []string{"sleep", "infinity"}
	}
	if len(c.InitIdleCommand) == 0 {
		c.InitIdleCommand = []string{"true"}
	}
	if c.RestartBackoff == 0 {
		c.RestartBackoff = 10 * time.Second
	}
	if c.MaxRestartBackoff == 0 {
		c.MaxRestartBackoff = 5 * time.Minute
	}
	if c.SyncRetry == 0 {
		c.SyncRetry = 10 * time.Second
	}
	if c.LeaseDuration == 0 {
		c.LeaseDuration = 40 * time.Second
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = 10 * time.Second
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	return nil
}

// Start registers the node and begins running the pods bound to it.
func Start(ctx context.Context, cfg Config) (*Node, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	for _, d := range []string{cfg.Root, confDir(cfg.Root), binDir(cfg.Root), podsDir(cfg.Root), logsDir(cfg.Root)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
		// Containers may run as any user: they must reach their files.
		if err := os.Chmod(d, 0o755); err != nil {
			return nil, err
		}
	}
	n := &Node{cfg: cfg, client: cfg.Client, workers: map[types.UID]*podWorker{}}
	var err error
	if n.cniLog, err = os.OpenFile(n.CNILog(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
		return nil, err
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.bcast = record.NewBroadcaster(record.WithContext(n.ctx))
	n.bcast.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cfg.Client.CoreV1().Events("")})
	n.recorder = n.bcast.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kubelet", Host: cfg.Name})
	n.checkNetwork()
	if err := n.startEndpoints(ctx); err != nil {
		n.cancel()
		n.bcast.Shutdown()
		n.cniLog.Close()
		return nil, err
	}
	n.wg.Add(1)
	go n.heartbeat()

	factory := informers.NewSharedInformerFactoryWithOptions(cfg.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", cfg.Name).String()
		}))
	inf := factory.Core().V1().Pods().Informer()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { n.podChanged(obj) },
		UpdateFunc: func(_, obj any) { n.podChanged(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				n.podGone(p.UID)
			}
		},
	})
	factory.Start(n.ctx.Done())
	syncCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if !cache.WaitForCacheSync(syncCtx.Done(), inf.HasSynced) {
		n.Stop()
		return nil, fmt.Errorf("simnode %s: pod informer did not sync", cfg.Name)
	}
	cfg.Logf("node %s registered (pod subnet %s, root %s)", cfg.Name, cfg.PodSubnet, cfg.Root)
	return n, nil
}

// startEndpoints makes the node's network, its node-local API endpoint and
// kubelet API, and registers the Node; on failure it undoes what it made.
func (n *Node) startEndpoints(ctx context.Context) (err error) {
	cfg := n.cfg
	if n.net, err = startNetwork(cfg.Range, cfg.PodSubnet, cfg.NodeIP); err != nil {
		return fmt.Errorf("simnode %s: %w", cfg.Name, err)
	}
	if n.api, err = startAPIProxy(n.net, cfg.NodeIP, cfg.RestConfig.Host); err != nil {
		n.net.remove()
		return fmt.Errorf("simnode %s: node-local API endpoint: %w", cfg.Name, err)
	}
	if n.kubelet, err = startKubeletAPI(n, cfg.NodeIP, cfg.RestConfig); err != nil {
		n.api.close()
		n.net.remove()
		return fmt.Errorf("simnode %s: kubelet API: %w", cfg.Name, err)
	}
	if err := n.register(ctx); err != nil {
		n.kubelet.close()
		n.api.close()
		n.net.remove()
		return err
	}
	return nil
}

// APIServer is the node-local API endpoint pods use (reachable from pod
// network namespaces and from the host).
func (n *Node) APIServer() string { return n.api.URL() }

// KubernetesService is the API endpoint at the kubernetes Service's address
// in the node's namespace (its pods reach it too), what kubelet gives
// containers as KUBERNETES_SERVICE_HOST and _PORT.
func (n *Node) KubernetesService() string { return n.api.ServiceURL() }

// Name is the node's name.
func (n *Node) Name() string { return n.cfg.Name }

// Root is the node's root directory.
func (n *Node) Root() string { return n.cfg.Root }

// ConfDir and BinDir are the node's CNI directories.
func (n *Node) ConfDir() string { return confDir(n.cfg.Root) }
func (n *Node) BinDir() string  { return binDir(n.cfg.Root) }

func confDir(root string) string  { return filepath.Join(root, "etc", "cni", "net.d") }
func binDir(root string) string   { return filepath.Join(root, "opt", "cni", "bin") }
func podsDir(root string) string  { return filepath.Join(root, "var", "lib", "kubelet", "pods") }
func logsDir(root string) string  { return filepath.Join(root, "var", "log", "pods") }
func cacheDir(root string) string { return filepath.Join(root, "var", "lib", "cni", "cache") }

func (n *Node) nodeObject() *corev1.Node {
	labels := map[string]string{
		"kubernetes.io/hostname": n.cfg.Name,
		"kubernetes.io/os":       "linux",
		"kubernetes.io/arch":     runtime.GOARCH,
		"beta.kubernetes.io/os":  "linux",
	}
	for k, v := range n.cfg.Labels {
		labels[k] = v
	}
	capacity := corev1.ResourceList{
		corev1.ResourcePods:             resource.MustParse("110"),
		corev1.ResourceCPU:              resource.MustParse("8"),
		corev1.ResourceMemory:           resource.MustParse("16Gi"),
		corev1.ResourceEphemeralStorage: resource.MustParse("100Gi"),
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.cfg.Name, Labels: labels, Annotations: map[string]string{RootAnnotation: n.cfg.Root}},
		Spec: corev1.NodeSpec{
			PodCIDR:  n.cfg.PodSubnet.Masked().String(),
			PodCIDRs: []string{n.cfg.PodSubnet.Masked().String()},
			Taints:   n.cfg.Taints,
		},
		Status: corev1.NodeStatus{
			Capacity:    capacity,
			Allocatable: capacity,
			Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalIP, Address: n.cfg.NodeIP.String()},
				{Type: corev1.NodeHostName, Address: n.cfg.Name},
			},
			NodeInfo: corev1.NodeSystemInfo{
				KubeletVersion:          Version,
				ContainerRuntimeVersion: "simnode://" + Version,
				OperatingSystem:         "linux",
				Architecture:            runtime.GOARCH,
				KernelVersion:           "simulated",
				OSImage:                 "consul-cni-repair simulated node",
			},
			Conditions:      n.conditions(nil),
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: n.kubelet.port()}},
		},
	}
}

// conditions returns the node conditions, keeping transition times of
// those that did not change.
func (n *Node) conditions(old []corev1.NodeCondition) []corev1.NodeCondition {
	now := metav1.Now()
	n.mu.Lock()
	ready, msg := n.netReady, n.netReadyMsg
	n.mu.Unlock()
	readyStatus, reason := corev1.ConditionTrue, "KubeletReady"
	if !ready {
		readyStatus, reason = corev1.ConditionFalse, "KubeletNotReady"
	} else {
		msg = "kubelet is posting ready status"
	}
	want := []corev1.NodeCondition{
		{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientMemory", Message: "kubelet has sufficient memory available"},
		{Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasNoDiskPressure", Message: "kubelet has no disk pressure"},
		{Type: corev1.NodePIDPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientPID", Message: "kubelet has sufficient PID available"},
		{Type: corev1.NodeReady, Status: readyStatus, Reason: reason, Message: msg},
	}
	for i := range want {
		want[i].LastHeartbeatTime = now
		want[i].LastTransitionTime = now
		for _, o := range old {
			if o.Type == want[i].Type && o.Status == want[i].Status {
				want[i].LastTransitionTime = o.LastTransitionTime
			}
		}
	}
	return want
}

// checkNetwork does what kubelet learns from the runtime's NetworkReady: the
// node is not ready while its CNI conf dir holds no usable network.
func (n *Node) checkNetwork() {
	_, err := loadNetwork(confDir(n.cfg.Root))
	n.mu.Lock()
	defer n.mu.Unlock()
	n.netReady = err == nil
	n.netReadyMsg = ""
	if err != nil {
		n.netReadyMsg = "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized: " + err.Error()
	}
}

func (n *Node) register(ctx context.Context) error {
	want := n.nodeObject()
	created, err := n.client.CoreV1().Nodes().Create(ctx, want, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		// A node of that name is left from an earlier run: take it over as
		// kubelet does, with our labels and taints.
		cur, gerr := n.client.CoreV1().Nodes().Get(ctx, n.cfg.Name, metav1.GetOptions{})
		if gerr != nil {
			return gerr
		}
		cur.Labels, cur.Spec.Taints = want.Labels, want.Spec.Taints
		if cur.Annotations == nil {
			cur.Annotations = map[string]string{}
		}
		cur.Annotations[RootAnnotation] = n.cfg.Root
		created, err = n.client.CoreV1().Nodes().Update(ctx, cur, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("simnode %s: register node: %w", n.cfg.Name, err)
	}
	for i := 0; ; i++ {
		created.Status = want.Status
		_, err = n.client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
		if err == nil || !apierrors.IsConflict(err) || i == 5 {
			break
		}
		if created, err = n.client.CoreV1().Nodes().Get(ctx, n.cfg.Name, metav1.GetOptions{}); err != nil {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("simnode %s: node status: %w", n.cfg.Name, err)
	}
	return n.renewLease(ctx)
}

func (n *Node) renewLease(ctx context.Context) error {
	leases := n.client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	l, err := leases.Get(ctx, n.cfg.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		node, nerr := n.client.CoreV1().Nodes().Get(ctx, n.cfg.Name, metav1.GetOptions{})
		if nerr != nil {
			return nerr
		}
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Name: n.cfg.Name, Namespace: corev1.NamespaceNodeLease,
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}},
			},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       ptr.To(n.cfg.Name),
				LeaseDurationSeconds: ptr.To(int32(n.cfg.LeaseDuration / time.Second)),
				RenewTime:            &now,
			},
		}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	l.Spec.RenewTime = &now
	l.Spec.HolderIdentity = ptr.To(n.cfg.Name)
	_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	return err
}

// heartbeat renews the Lease and the node conditions.
func (n *Node) heartbeat() {
	defer n.wg.Done()
	t := time.NewTicker(n.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(n.ctx, n.cfg.HeartbeatInterval)
		if err := n.renewLease(ctx); err != nil && n.ctx.Err() == nil {
			n.cfg.Logf("node %s: renew lease: %v", n.cfg.Name, err)
		}
		n.checkNetwork()
		if err := n.updateConditions(ctx); err != nil && n.ctx.Err() == nil {
			n.cfg.Logf("node %s: update status: %v", n.cfg.Name, err)
		}
		cancel()
	}
}

func (n *Node) updateConditions(ctx context.Context) error {
	node, err := n.client.CoreV1().Nodes().Get(ctx, n.cfg.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	node.Status.Conditions = n.conditions(node.Status.Conditions)
	_, err = n.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
	return err
}

func (n *Node) podChanged(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopped {
		return
	}
	w := n.workers[pod.UID]
	if w == nil {
		if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			if pod.DeletionTimestamp == nil {
				return // a finished pod from before this node process: nothing to run
			}
		}
		w = newPodWorker(n, pod)
		n.workers[pod.UID] = w
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			w.run()
			n.mu.Lock()
			if n.workers[pod.UID] == w {
				delete(n.workers, pod.UID)
			}
			n.mu.Unlock()
		}()
	}
	w.update(pod)
}

// RecreateSandbox makes the pod with uid lose its sandbox as in a node
// reboot: its containers stop, the sandbox is torn down and, on the pod's
// next sync, created again with the node's network configuration of that
// moment, and the containers start again. It fails when the node runs no
// such pod.
func (n *Node) RecreateSandbox(uid types.UID) error {
	n.mu.Lock()
	w := n.workers[uid]
	n.mu.Unlock()
	if w == nil {
		return fmt.Errorf("node %s runs no pod with uid %s", n.cfg.Name, uid)
	}
	w.mu.Lock()
	w.recreate = true
	w.mu.Unlock()
	w.poke()
	return nil
}

func (n *Node) podGone(uid types.UID) {
	n.mu.Lock()
	w := n.workers[uid]
	n.mu.Unlock()
	if w != nil {
		w.gone()
	}
}

// WaitReady waits until the node is Ready and schedulable: the node
// lifecycle controller has removed its not-ready taint.
func (n *Node) WaitReady(ctx context.Context) error {
	var last string
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		node, err := n.client.CoreV1().Nodes().Get(ctx, n.cfg.Name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		ready := false
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				ready = c.Status == corev1.ConditionTrue
				last = fmt.Sprintf("Ready=%s %s", c.Status, c.Message)
			}
		}
		for _, t := range node.Spec.Taints {
			if t.Key == corev1.TaintNodeNotReady || t.Key == corev1.TaintNodeUnreachable {
				last += "; taint " + t.Key
				return false, nil
			}
		}
		return ready, nil
	})
	if err != nil {
		return fmt.Errorf("node %s not ready (%s): %w", n.cfg.Name, last, err)
	}
	return nil
}

// LogFile is one container instance's output on the node.
type LogFile struct {
	Namespace, Pod string
	UID            types.UID
	Container      string
	Instance       int
	Path           string
}

// LogFiles lists the container logs on the node, also of pods deleted
// since (they stay until the node stops), ordered by pod and instance.
func (n *Node) LogFiles() ([]LogFile, error) {
	return LogFiles(n.cfg.Root)
}

// LogFiles lists the container logs under a node root.
func LogFiles(root string) ([]LogFile, error) { return PodLogFiles(logsDir(root)) }

// PodLogFiles lists the container logs in a directory laid out as
// kubelet's podLogsDir (<namespace>_<pod>_<uid>/<container>/<n>.log).
func PodLogFiles(dir string) ([]LogFile, error) {
	pods, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []LogFile
	for _, p := range pods {
		parts := strings.Split(p.Name(), "_")
		if len(parts) != 3 {
			continue
		}
		ctrs, _ := os.ReadDir(filepath.Join(dir, p.Name()))
		for _, c := range ctrs {
			files, _ := os.ReadDir(filepath.Join(dir, p.Name(), c.Name()))
			for _, f := range files {
				i, err := strconv.Atoi(strings.TrimSuffix(f.Name(), ".log"))
				if err != nil || !strings.HasSuffix(f.Name(), ".log") {
					continue
				}
				out = append(out, LogFile{Namespace: parts[0], Pod: parts[1], UID: types.UID(parts[2]), Container: c.Name(),
					Instance: i, Path: filepath.Join(dir, p.Name(), c.Name(), f.Name())})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Namespace+a.Pod+string(a.UID)+a.Container != b.Namespace+b.Pod+string(b.UID)+b.Container {
			return a.Namespace+a.Pod+string(a.UID)+a.Container < b.Namespace+b.Pod+string(b.UID)+b.Container
		}
		return a.Instance < b.Instance
	})
	return out, nil
}

// Stop stops every pod (containers killed, CNI DEL, namespaces removed),
// stops the heartbeat and, unless KeepNode is set, deletes the Node.
func (n *Node) Stop() {
	n.stopOnce.Do(func() {
		n.mu.Lock()
		n.stopped = true
		ws := make([]*podWorker, 0, len(n.workers))
		for _, w := range n.workers {
			ws = append(ws, w)
		}
		n.mu.Unlock()
		for _, w := range ws {
			w.shutdown()
		}
		n.cancel()
		n.wg.Wait()
		n.bcast.Shutdown()
		n.kubelet.close()
		n.api.close()
		n.net.remove()
		n.cniLog.Close()
		if !n.cfg.KeepNode {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := n.client.CoreV1().Nodes().Delete(ctx, n.cfg.Name, metav1.DeleteOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				n.cfg.Logf("node %s: delete: %v", n.cfg.Name, err)
			}
		}
	})
}
