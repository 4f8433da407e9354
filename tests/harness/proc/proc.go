// Package proc starts the processes the test harness owns (etcd, the
// control plane, simulated containers) so that none outlives the test
// process: each runs in its own process group, gets SIGKILL when its parent
// dies (Pdeathsig), and is stopped by signalling the whole group.
//
// Pdeathsig fires when the thread that forked the child exits, not the
// process. Go may end threads (a goroutine that locks its thread and returns
// takes the thread with it, which network namespace helpers do), so every
// child is forked from one dedicated thread that never exits. That thread is
// also where a child is placed into a network namespace: it enters the
// namespace, forks, and returns to the original one.
package proc

import (
	"errors"
	"fmt"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
)

var (
	spawnOnce sync.Once
	requests  chan func()
)

func spawner() {
	runtime.LockOSThread() // never unlocked: this thread lives as long as the process
	for f := range requests {
		f()
	}
}

func onSpawner(f func()) {
	spawnOnce.Do(func() {
		requests = make(chan func())
		ready := make(chan struct{})
		go func() {
			close(ready)
			spawner()
		}()
		<-ready
	})
	done := make(chan struct{})
	requests <- func() { f(); close(done) }
	<-done
}

// Process is a started child.
type Process struct {
	Cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start starts cmd in a new process group with SIGKILL as its parent-death
// signal; inside the network namespace at netnsPath unless it is empty.
// Fields already set in cmd.SysProcAttr (such as Credential) are kept.
func Start(cmd *exec.Cmd, netnsPath string) (*Process, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	var err error
	onSpawner(func() { err = startIn(cmd, netnsPath) })
	if err != nil {
		return nil, err
	}
	p := &Process{Cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// startIn runs on the spawner thread.
func startIn(cmd *exec.Cmd, netnsPath string) error {
	if netnsPath == "" {
		return cmd.Start()
	}
	orig, err := netns.Get()
	if err != nil {
		return fmt.Errorf("current netns: %w", err)
	}
	defer orig.Close()
	target, err := netns.GetFromPath(netnsPath)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", netnsPath, err)
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		return fmt.Errorf("enter netns %s: %w", netnsPath, err)
	}
	startErr := cmd.Start()
	if err := netns.Set(orig); err != nil {
		// The spawner thread would fork every later child in the wrong
		// namespace: nothing sane can continue.
		panic(fmt.Sprintf("proc: cannot return to the original netns: %v", err))
	}
	return startErr
}

// Done is closed when the process has exited and its output is copied.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is the result of Wait; valid once Done is closed.
func (p *Process) Err() error {
	<-p.done
	return p.err
}

// ExitCode returns the exit code once exited (-1 when killed by a signal),
// and the signal that killed it, if any.
func (p *Process) ExitCode() (int, syscall.Signal) {
	<-p.done
	st := p.Cmd.ProcessState
	if st == nil {
		return -1, 0
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return -1, ws.Signal()
	}
	return st.ExitCode(), 0
}

// Signal sends sig to the process group.
func (p *Process) Signal(sig syscall.Signal) error {
	err := syscall.Kill(-p.Cmd.Process.Pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// Stop sends SIGTERM to the process group, waits up to grace for the
// process to exit, then sends SIGKILL to the group and waits. Members of the
// group that outlive the leader get SIGKILL too (right after the leader
// exits, while its process group id cannot have been reused).
func (p *Process) Stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
	}
	_ = p.Signal(syscall.SIGKILL)
	<-p.done
}
