package repair

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/configkey"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/leader"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/nodeready"
)

// Component is the Event source and the default lease name.
const Component = "consul-cni-repair"

// ManagerConfig adds process-level settings to Config.
type ManagerConfig struct {
	Config

	LeaderElect    bool
	LeaseNamespace string
	LeaseName      string
	// Identity of this replica in the lease; default hostname_random.
	Identity      string
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration

	// MetricsAddr and HealthAddr are listen addresses; "" or "0" disables
	// the server.
	MetricsAddr     string
	HealthAddr      string
	ShutdownTimeout time.Duration
	// Profiling serves net/http/pprof under /debug/pprof/ on the metrics
	// address.
	Profiling bool
}

// DefaultManagerConfig returns the documented defaults.
func DefaultManagerConfig() ManagerConfig {
	cfg := defaultConfig()
	return ManagerConfig{
		Config:          cfg,
		LeaderElect:     true,
		LeaseNamespace:  cfg.CNINamespace,
		LeaseName:       Component,
		LeaseDuration:   15 * time.Second,
		RenewDeadline:   10 * time.Second,
		RetryPeriod:     2 * time.Second,
		MetricsAddr:     ":8080",
		HealthAddr:      ":8081",
		ShutdownTimeout: 10 * time.Second,
	}
}

// Validate checks the process-level settings and Config.
func (c *ManagerConfig) Validate() error {
	if err := c.Config.Validate(); err != nil {
		return err
	}
	if c.LeaderElect {
		if c.LeaseNamespace == "" {
			return configkey.New("LeaseNamespace", nil, "must not be empty")
		}
		if c.LeaseName == "" {
			return configkey.New("LeaseName", nil, "must not be empty")
		}
		if !(c.RetryPeriod > 0 && c.RetryPeriod < c.RenewDeadline && c.RenewDeadline < c.LeaseDuration) {
			return configkey.Errorf(strings.Join([]string{"RetryPeriod", "RenewDeadline", "LeaseDuration"}, configkey.Sep), "%s/%s/%s: want 0 < retry < renew < lease",
				c.RetryPeriod, c.RenewDeadline, c.LeaseDuration)
		}
	}
	return nil
}

// Manager runs the informers, the HTTP endpoints, leader election and, on
// the leader only, the repair and node-readiness controllers.
type Manager struct {
	cfg       ManagerConfig
	client    kubernetes.Interface
	Metrics   *Metrics
	Informers *Informers
	Repair    *Controller
	Readiness *nodeready.Controller

	broadcaster record.EventBroadcaster
	// rights reviews the rights cfg needs; /readyz fails while one is
	// denied (rights.go).
	rights       *rightsChecker
	rightsPeriod time.Duration
	// elected sequences leadership; nil without leader election.
	elected *leader.Runner

	metricsLn, healthLn net.Listener
}

// NewManager builds everything; nothing runs until Run.
func NewManager(client kubernetes.Interface, cfg ManagerConfig) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Identity == "" {
		host, _ := os.Hostname()
		cfg.Identity = host + "_" + utilrand.String(8)
	}
	m := &Manager{cfg: cfg, client: client, Metrics: newMetrics()}
	inf, err := newInformers(client, cfg.Config)
	if err != nil {
		return nil, err
	}
	m.Informers = inf
	m.rights, m.rightsPeriod = newRightsChecker(client, requiredRights(cfg.Config), m.Metrics.MissingRights), rightsCheckPeriod
	m.broadcaster = record.NewBroadcaster()
	recorder := m.broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: Component})
	if m.Repair, err = newController(cfg.Config, client, inf, recorder, m.Metrics); err != nil {
		return nil, err
	}
	if cfg.NodeReadiness {
		if m.Readiness, err = newNodeReadiness(cfg.Config, client, inf, recorder, m.Metrics); err != nil {
			return nil, err
		}
	}
	if cfg.LeaderElect {
		m.elected = leader.New(leaderelection.LeaderElectionConfig{
			Lock: &resourcelock.LeaseLock{
				LeaseMeta:  metav1ObjectMeta(cfg.LeaseNamespace, cfg.LeaseName),
				Client:     client.CoordinationV1(),
				LockConfig: resourcelock.ResourceLockConfig{Identity: cfg.Identity},
			},
			LeaseDuration: cfg.LeaseDuration,
			RenewDeadline: cfg.RenewDeadline,
			RetryPeriod:   cfg.RetryPeriod,
			Name:          Component,
		}, actionTimeout)
	}
	if m.metricsLn, err = listen(cfg.MetricsAddr); err != nil {
		return nil, &configkey.Error{Key: "MetricsAddr", Value: cfg.MetricsAddr, Reason: "cannot be listened on", Err: err}
	}
	if m.healthLn, err = listen(cfg.HealthAddr); err != nil {
		if m.metricsLn != nil {
			m.metricsLn.Close()
		}
		return nil, &configkey.Error{Key: "HealthAddr", Value: cfg.HealthAddr, Reason: "cannot be listened on", Err: err}
	}
	return m, nil
}

// newNodeReadiness wires the node-readiness controller to the shared
// informers (inf.CNIPods must exist) and the metrics.
func newNodeReadiness(cfg Config, client kubernetes.Interface, inf *Informers, recorder record.EventRecorder, m *Metrics) (*nodeready.Controller, error) {
	return nodeready.New(nodeready.Config{
		DryRun:             cfg.DryRun,
		CNINamespace:       cfg.CNINamespace,
		CNIPodSelector:     cfg.CNIPodSelector,
		StartupTaintKey:    cfg.StartupTaintKey,
		ReaddStartupTaint:  cfg.ReaddStartupTaint,
		StartupTaintEffect: cfg.StartupTaintEffect,
	}, client, inf.Nodes, inf.CNIPods, inf.CNIDaemonSets, recorder, nodeready.Metrics{Changes: m.NodeReadinessChanges, Workqueue: m.Workqueue})
}

func listen(addr string) (net.Listener, error) {
	if addr == "" || addr == "0" {
		return nil, nil
	}
	return net.Listen("tcp", addr)
}

// MetricsAddr is the bound metrics address ("" when disabled).
func (m *Manager) MetricsAddr() string { return lnAddr(m.metricsLn) }

// HealthAddr is the bound health address ("" when disabled).
func (m *Manager) HealthAddr() string { return lnAddr(m.healthLn) }

func lnAddr(l net.Listener) string {
	if l == nil {
		return ""
	}
	return l.Addr().String()
}

// Run blocks until ctx is done (graceful shutdown: controllers stop, then
// the lease is released, then the servers stop) or leadership is lost
// (leader.ErrLeaseLost: the process should exit and be restarted).
// Whatever ends it, every informer and controller has stopped when it
// returns.
func (m *Manager) Run(ctx context.Context) error {
	servers := m.startServers(ctx)
	defer stopServers(servers, m.cfg.ShutdownTimeout)

	m.broadcaster.StartStructuredLogging(3)
	m.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: m.client.CoreV1().Events("")})
	defer m.broadcaster.Shutdown()

	// Informers run on every replica so a new leader starts warm. They
	// stop when Run returns, also after a lost lease (Shutdown waits for
	// them, so they must be told to stop first: defers run in reverse).
	infCtx, stopInformers := context.WithCancel(ctx)
	m.Informers.Factory.Start(infCtx.Done())
	defer m.Informers.Factory.Shutdown()
	defer stopInformers()
	rightsDone := make(chan struct{})
	go func() {
		defer close(rightsDone)
		m.rights.run(infCtx, m.rightsPeriod)
	}()
	defer func() { stopInformers(); <-rightsDone }()
	go func() {
		// The initial lists decode full objects page by page before they
		// are slimmed; once the caches hold only slim objects, hand the
		// pages that held them back to the OS instead of keeping them
		// resident until the scavenger gets to them.
		if cache.WaitForCacheSync(infCtx.Done(), m.Informers.HasSynced) {
			debug.FreeOSMemory()
		}
	}()

	if m.elected == nil {
		return m.lead(ctx)
	}
	err := m.elected.Run(ctx, m.lead)
	if errors.Is(err, leader.ErrLeaseLost) {
		klog.FromContext(ctx).Error(err, "Lease lost; stopping", "identity", m.cfg.Identity)
	}
	return err
}

// lead runs the controllers, counted as leading, until ctx is done.
func (m *Manager) lead(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	logger.Info("Leading", "identity", m.cfg.Identity)
	m.Metrics.Leader.Set(1)
	defer func() {
		m.Metrics.Leader.Set(0)
		logger.Info("Not leading", "identity", m.cfg.Identity)
	}()
	return m.runControllers(ctx)
}

// startServers serves the metrics and health endpoints on the listeners
// NewManager bound.
func (m *Manager) startServers(ctx context.Context) []*http.Server {
	var servers []*http.Server
	if m.metricsLn != nil {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttpHandler(m))
		if m.cfg.Profiling {
			mux.HandleFunc("/debug/pprof/", pprof.Index)
			mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
			mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
			mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
			mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		}
		servers = append(servers, serve(ctx, m.metricsLn, mux))
	}
	if m.healthLn != nil {
		mux := http.NewServeMux()
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
			if m.elected != nil {
				if err := m.elected.Check(r); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
			}
			_, _ = w.Write([]byte("ok"))
		})
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
			if !m.Informers.HasSynced() {
				http.Error(w, "informers not synced", http.StatusServiceUnavailable)
				return
			}
			if err := m.rights.ready(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			_, _ = w.Write([]byte("ok"))
		})
		servers = append(servers, serve(ctx, m.healthLn, mux))
	}
	return servers
}

func stopServers(servers []*http.Server, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for _, s := range servers {
		_ = s.Shutdown(ctx)
	}
}

func (m *Manager) runControllers(ctx context.Context) error {
	var wg sync.WaitGroup
	errs := make([]error, 2)
	wg.Add(1)
	go func() {
		defer wg.Done()
		errs[0] = m.Repair.Run(ctx)
	}()
	if m.Readiness != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[1] = m.Readiness.Run(ctx, 2)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func serve(ctx context.Context, ln net.Listener, h http.Handler) *http.Server {
	s := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := s.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, "HTTP server stopped", "addr", ln.Addr().String())
		}
	}()
	return s
}

func promhttpHandler(m *Manager) http.Handler {
	return promhttp.HandlerFor(m.Metrics.Registry, promhttp.HandlerOpts{Registry: m.Metrics.Registry})
}
