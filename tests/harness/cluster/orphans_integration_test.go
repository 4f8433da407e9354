//go:build integration

package cluster

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestNoOrphansWhenKilled starts a control plane in a child process, kills
// that process with SIGKILL (no cleanup code runs), and checks that etcd and
// the control-plane processes die with it.
func TestNoOrphansWhenKilled(t *testing.T) {
	if os.Getenv("CCR_CLUSTER_CHILD") == "1" {
		return // runs as the child through TestHelperChildCluster
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperChildCluster$", "-test.v")
	cmd.Env = append(os.Environ(), "CCR_CLUSTER_CHILD=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	var pids []int
	var dir string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "CHILD-PIDS "); ok {
			f := strings.Fields(rest)
			dir = f[0]
			for _, s := range f[1:] {
				p, _ := strconv.Atoi(s)
				pids = append(pids, p)
			}
			break
		}
	}
	if len(pids) != 4 {
		t.Fatalf("child did not report 4 component pids (got %v)", pids)
	}
	for _, p := range pids {
		if syscall.Kill(p, 0) != nil {
			t.Fatalf("component %d not running before the kill", p)
		}
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	deadline := time.Now().Add(30 * time.Second)
	for _, p := range pids {
		for syscall.Kill(p, 0) == nil {
			if time.Now().After(deadline) {
				t.Fatalf("component pid %d survived its parent", p)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	os.RemoveAll(dir) // no cleanup code ran in the child
}

func TestHelperChildCluster(t *testing.T) {
	if os.Getenv("CCR_CLUSTER_CHILD") != "1" {
		t.Skip("helper for TestNoOrphansWhenKilled")
	}
	c, err := Start(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	var s []string
	for _, comp := range c.procs {
		s = append(s, strconv.Itoa(comp.p.Cmd.Process.Pid))
	}
	fmt.Printf("CHILD-PIDS %s %s\n", c.Dir, strings.Join(s, " "))
	select {} // killed by the parent
}
