//go:build integration

package audit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
)

// BenchmarkAudit10000 runs the repair binary's audit against 10,000 injected
// pods on 20 nodes, one pod in ten outside the mesh, and reports its wall
// time and peak RSS.
func BenchmarkAudit10000(b *testing.B) { benchAudit(b, 10000, 20) }

func benchAudit(b *testing.B, pods, nodes int) {
	c := cluster.Shared(b)
	cfg := rest.CopyConfig(c.Config)
	cfg.QPS, cfg.Burst = 5000, 5000
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	client := kubernetes.NewForConfigOrDie(cfg)
	ns := c.Namespace(b)
	owner, err := client.CoreV1().ConfigMaps(ns).Create(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owner"}}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < nodes; i++ {
		createNode(b, client, readyNode(fmt.Sprintf("%s-n%02d", ns, i)))
	}
	start := time.Now()
	if err := cluster.Parallel(pods, 32, func(i int) error {
		p := injected(fmt.Sprintf("p-%05d", i), fmt.Sprintf("%s-n%02d", ns, i%nodes))
		if i%10 == 0 {
			initFailed(p)
		}
		return tryCreatePod(client, ns, owner, p)
	}); err != nil {
		b.Fatal(err)
	}
	b.Logf("created %d pods in %s", pods, time.Since(start).Round(time.Second))
	bin := testbin.Project(b, "repair")
	for iter := 0; iter < b.N; iter++ {
		var out, stderr bytes.Buffer
		cmd := exec.Command(bin, "audit", "--kubeconfig="+c.Kubeconfig, "-n", ns)
		cmd.Stdout, cmd.Stderr = &out, &stderr
		b.ResetTimer()
		start := time.Now()
		err := cmd.Run()
		wall := time.Since(start)
		b.StopTimer()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != ExitOutside {
			b.Fatalf("repair audit: %v, want exit %d; stderr %s", err, ExitOutside, stderr.String())
		}
		if rows := strings.Count(out.String(), "init_check_failed"); rows != pods/10 {
			b.Fatalf("%d pods reported outside the mesh, want %d; stderr %s", rows, pods/10, stderr.String())
		}
		rss := float64(cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss) / 1024 // KiB on Linux
		b.ReportMetric(wall.Seconds(), "wall-s")
		b.ReportMetric(rss, "peak-rss-MiB")
		fmt.Printf("repair audit of %d injected pods on %d nodes (%d outside the mesh): wall %.2f s, peak RSS %.1f MiB\n",
			pods, nodes, pods/10, wall.Seconds(), rss)
	}
}
