package leave

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// watchedWorld is leaveWorld in a fake API whose watches report when they
// are open, so a change made afterwards reaches the watch.
func watchedWorld(t *testing.T) (*fake.Clientset, func()) {
	t.Helper()
	c := fake.NewClientset(leaveWorld()...)
	var mu sync.Mutex
	open := map[string]bool{}
	chain := c.WatchReactionChain
	c.WatchReactionChain = []k8stesting.WatchReactor{&k8stesting.SimpleWatchReactor{Resource: "*",
		Reaction: func(a k8stesting.Action) (bool, watch.Interface, error) {
			for _, r := range chain {
				if !r.Handles(a) {
					continue
				}
				handled, w, err := r.React(a)
				if handled {
					mu.Lock()
					open[a.GetResource().Resource] = err == nil
					mu.Unlock()
					return handled, w, err
				}
			}
			return false, nil, nil
		}}}
	opened := func() {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			mu.Lock()
			all := open["daemonsets"] && open["namespaces"] && open["nodes"]
			mu.Unlock()
			if all {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the leave watch opened only %v", open)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return c, opened
}

// refuseEverything makes the API refuse every GET, as it does once the
// installer's ServiceAccount and RBAC are deleted.
func refuseEverything(c *fake.Clientset) {
	c.PrependReactor("get", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: a.GetResource().Resource}, "", errors.New("RBAC: the ClusterRoleBinding consul-cni is gone"))
	})
}

// Removing the product deletes the installer's DaemonSet and then its
// RBAC before the installer's pod gets SIGTERM: what the watch saw before
// the credentials went decides then. A GET that answers still wins, and
// with nothing seen an API that does not answer keeps everything.
func TestTheWatchDecidesWhenTheAPIRefusesAtSIGTERM(t *testing.T) {
	bg := context.Background()
	for _, tc := range []struct {
		name    string
		change  func(t *testing.T, c *fake.Clientset, w *Watch)
		refuse  bool
		leaving bool
		why     string
	}{
		{"DaemonSet deleted, then RBAC (helm uninstall --no-hooks, upgrade to repair-only)", func(t *testing.T, c *fake.Clientset, _ *Watch) {
			must(t, c.AppsV1().DaemonSets("ccr").Delete(bg, "consul-cni", metav1.DeleteOptions{}))
		}, true, true, "DaemonSet ccr/consul-cni was deleted (seen by the installer's watch"},
		{"DaemonSet marked for deletion, then RBAC", func(t *testing.T, c *fake.Clientset, _ *Watch) {
			updateDS(t, c, func(ds *appsv1.DaemonSet) { now := metav1.Now(); ds.DeletionTimestamp = &now })
		}, true, true, "is being deleted"},
		{"namespace being deleted, its ServiceAccount gone", func(t *testing.T, c *fake.Clientset, _ *Watch) {
			ns, err := c.CoreV1().Namespaces().Get(bg, "ccr", metav1.GetOptions{})
			must(t, err)
			now := metav1.Now()
			ns.DeletionTimestamp = &now
			_, err = c.CoreV1().Namespaces().Update(bg, ns, metav1.UpdateOptions{})
			must(t, err)
		}, true, true, "namespace ccr is being deleted"},
		{"nodeSelector narrowed to exclude the node, then RBAC", func(t *testing.T, c *fake.Clientset, _ *Watch) {
			updateDS(t, c, func(ds *appsv1.DaemonSet) { ds.Spec.Template.Spec.NodeSelector["pool"] = "b" })
		}, true, true, "does not select node n1"},
		{"node relabelled as Windows, then RBAC", func(t *testing.T, c *fake.Clientset, _ *Watch) {
			n, err := c.CoreV1().Nodes().Get(bg, "n1", metav1.GetOptions{})
			must(t, err)
			n.Labels["kubernetes.io/os"] = "windows"
			_, err = c.CoreV1().Nodes().Update(bg, n, metav1.UpdateOptions{})
			must(t, err)
		}, true, true, "does not select node n1"},
		{"nothing seen and the API refuses: everything stays", func(*testing.T, *fake.Clientset, *Watch) {}, true, false, ""},
		{"the template changed but still places a pod (rolling update), API refuses", func(t *testing.T, c *fake.Clientset, _ *Watch) {
			updateDS(t, c, func(ds *appsv1.DaemonSet) { ds.Spec.Template.Labels = map[string]string{"rev": "2"} })
		}, true, false, ""},
		{"a fresh GET that answers wins over the watch", func(t *testing.T, c *fake.Clientset, w *Watch) {
			updateDS(t, c, func(ds *appsv1.DaemonSet) { ds.Spec.Template.Spec.NodeSelector["pool"] = "b" })
			// Seen excluded; the GET then reads it targeting the node again.
			for _, leaving := w.Leaving(); !leaving; _, leaving = w.Leaving() {
				time.Sleep(10 * time.Millisecond)
			}
			updateDSQuietly(t, c, func(ds *appsv1.DaemonSet) { delete(ds.Spec.Template.Spec.NodeSelector, "pool") })
		}, false, false, "still targets node n1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(bg)
			defer cancel()
			c, opened := watchedWorld(t)
			w := StartWatch(ctx, c, "ccr", "consul-cni-x")
			opened()
			tc.change(t, c, w)
			// The decision waits WatchGrace for an event on its way; a
			// loaded machine may take longer to deliver it, which is not
			// what this test is about.
			for deadline := time.Now().Add(10 * time.Second); tc.leaving && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				if _, seen := w.Leaving(); seen {
					break
				}
			}
			if tc.refuse {
				refuseEverything(c)
			}
			d, err := w.Decider(APIDecider(c, "ccr", "consul-cni-x"))(ctx)
			switch {
			case tc.leaving && (err != nil || !d.Leaving || !strings.Contains(d.Why, tc.why)):
				t.Fatalf("decision %+v, err %v; want leaving because %q", d, err, tc.why)
			case !tc.leaving && tc.refuse && (err == nil || !CredentialsRefused(err)):
				t.Fatalf("decision %+v, err %v; want the refusal kept (everything stays)", d, err)
			case !tc.leaving && !tc.refuse && (err != nil || d.Leaving || !strings.Contains(d.Why, tc.why)):
				t.Fatalf("decision %+v, err %v; want staying because %q", d, err, tc.why)
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func updateDS(t *testing.T, c *fake.Clientset, edit func(*appsv1.DaemonSet)) {
	t.Helper()
	ds, err := c.AppsV1().DaemonSets("ccr").Get(context.Background(), "consul-cni", metav1.GetOptions{})
	must(t, err)
	edit(ds)
	_, err = c.AppsV1().DaemonSets("ccr").Update(context.Background(), ds, metav1.UpdateOptions{})
	must(t, err)
}

// updateDSQuietly changes the stored DaemonSet without an event to the
// watch, so only a fresh GET sees it.
func updateDSQuietly(t *testing.T, c *fake.Clientset, edit func(*appsv1.DaemonSet)) {
	t.Helper()
	gvr := appsv1.SchemeGroupVersion.WithResource("daemonsets")
	o, err := c.Tracker().Get(gvr, "ccr", "consul-cni")
	must(t, err)
	ds := o.(*appsv1.DaemonSet).DeepCopy()
	edit(ds)
	c.PrependReactor("get", "daemonsets", func(k8stesting.Action) (bool, runtime.Object, error) { return true, ds, nil })
}
