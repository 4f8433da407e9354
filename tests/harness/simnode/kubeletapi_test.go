package simnode

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// logNode is a node with container logs of two pods named web (an old one
// gone from the node and the running one, restarted once) and no process.
func logNode(t *testing.T) *Node {
	t.Helper()
	root := t.TempDir()
	write := func(uid, ctr, inst, body string) {
		dir := filepath.Join(logsDir(root), "ns_web_"+uid, ctr)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, inst+".log"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("old", "app", "0", "old pod\n")
	hourAgo := time.Now().Add(-time.Hour)
	if err := os.Chtimes(filepath.Join(logsDir(root), "ns_web_old", "app", "0.log"), hourAgo, hourAgo); err != nil {
		t.Fatal(err)
	}
	write("live", "app", "0", "first run\n")
	write("live", "app", "1", "a\nb\nc\n")
	n := &Node{cfg: Config{Name: "n1", Root: root}, workers: map[types.UID]*podWorker{}}
	n.workers["live"] = &podWorker{latest: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "live"}}}
	return n
}

func getLogs(t *testing.T, n *Node, query string) (int, string) {
	t.Helper()
	k := &kubeletAPI{n: n}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /containerLogs/{namespace}/{pod}/{container}", k.containerLogs)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/containerLogs/ns/web/" + query)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestContainerLogs(t *testing.T) {
	n := logNode(t)
	for _, tc := range []struct {
		query string
		code  int
		body  string
	}{
		{"app", 200, "a\nb\nc\n"},
		{"app?previous=true", 200, "first run\n"},
		{"app?tailLines=2", 200, "b\nc\n"},
		{"app?tailLines=0", 200, ""},
		{"app?limitBytes=3", 200, "a\nb"},
		{"app?timestamps=true", 400, ""},
		{"app?tailLines=-1", 400, ""},
		{"other", 404, ""},
	} {
		code, body := getLogs(t, n, tc.query)
		if code != tc.code || (code == 200 && body != tc.body) {
			t.Errorf("%s: %d %q, want %d %q", tc.query, code, body, tc.code, tc.body)
		}
	}
	// Once the pod left the node, its last run's logs are served.
	delete(n.workers, "live")
	if code, body := getLogs(t, n, "app"); code != 200 || body != "a\nb\nc\n" {
		t.Errorf("after the pod left: %d %q", code, body)
	}
}
