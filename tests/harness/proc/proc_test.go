package proc

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Stop must take the whole process group down, including a grandchild that
// ignores SIGTERM.
func TestStopKillsTheGroup(t *testing.T) {
	dir := t.TempDir()
	pidFile := dir + "/pid"
	cmd := exec.Command("sh", "-c", `sh -c 'trap "" TERM; echo $$ > `+pidFile+`; while :; do sleep 1; done' & wait`)
	p, err := Start(cmd, "")
	if err != nil {
		t.Fatal(err)
	}
	var grandchild int
	for i := 0; i < 100 && grandchild == 0; i++ {
		b, _ := os.ReadFile(pidFile)
		grandchild, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		time.Sleep(50 * time.Millisecond)
	}
	if grandchild == 0 {
		t.Fatal("grandchild did not start")
	}
	p.Stop(500 * time.Millisecond)
	for i := 0; i < 100; i++ {
		if syscall.Kill(grandchild, 0) != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if syscall.Kill(grandchild, 0) == nil {
		t.Fatalf("grandchild %d survived Stop", grandchild)
	}
	if code, sig := p.ExitCode(); code != -1 || sig != syscall.SIGTERM {
		t.Fatalf("exit code %d signal %v, want killed by SIGTERM", code, sig)
	}
}

func TestExitCode(t *testing.T) {
	p, err := Start(exec.Command("sh", "-c", "exit 7"), "")
	if err != nil {
		t.Fatal(err)
	}
	if code, sig := p.ExitCode(); code != 7 || sig != 0 {
		t.Fatalf("got %d %v, want 7", code, sig)
	}
	if p.Cmd.SysProcAttr.Pdeathsig != syscall.SIGKILL || !p.Cmd.SysProcAttr.Setpgid {
		t.Fatal("process not started with its own group and a parent-death signal")
	}
}

func TestRemoveStale(t *testing.T) {
	base := t.TempDir()
	mine, dead, unowned := base+"/x-mine", base+"/x-dead", base+"/x-unowned"
	for _, d := range []string{mine, dead, unowned} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := MarkOwned(mine); err != nil {
		t.Fatal(err)
	}
	// A process that has exited: its pid is free.
	c := exec.Command("true")
	if err := c.Run(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dead+"/"+ownerFile, []byte(strconv.Itoa(c.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	RemoveStale(base + "/x-*")
	for d, want := range map[string]bool{mine: true, dead: false, unowned: true} {
		if _, err := os.Stat(d); (err == nil) != want {
			t.Errorf("%s exists=%v, want %v", d, err == nil, want)
		}
	}
}
