package registry

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// Throttled is a relay that forwards the registry into a network namespace,
// as Forward does, but sends the registry's answers to the namespace at no
// more than a given rate of bytes per second (all connections together), as
// a slow link to a remote registry would: a node's pull through it takes
// about its bytes over the rate.
type Throttled struct {
	rate int64

	mu          sync.Mutex
	sent        int64
	first, last time.Time
	next        time.Time // when the bucket allows the next chunk
}

// chunk is how many bytes the relay sends at a time.
const chunk = 16 << 10

// ForwardThrottled makes the registry reachable at r.Host inside the network
// namespace netnsPath, its answers limited to bytesPerSecond, until the test
// ends.
func (r *Registry) ForwardThrottled(t testing.TB, netnsPath string, bytesPerSecond int64) *Throttled {
	t.Helper()
	if bytesPerSecond < chunk {
		t.Fatalf("registry: throttle rate %d B/s is below one chunk (%d B) per second", bytesPerSecond, chunk)
	}
	th := &Throttled{rate: bytesPerSecond}
	r.forward(t, netnsPath, th.relay)
	return th
}

// relay copies the client's requests to the registry at full speed and the
// registry's answers back through the bucket.
func (th *Throttled) relay(c net.Conn, target string) {
	defer c.Close()
	up, err := net.Dial("tcp", target) // from the host's namespace
	if err != nil {
		return
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); halfClose(up); done <- struct{}{} }()
	go func() { th.copySlow(c, up); halfClose(c); done <- struct{}{} }()
	<-done
	<-done
}

func (th *Throttled) copySlow(dst io.Writer, src io.Reader) {
	buf := make([]byte, chunk)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			time.Sleep(th.take(int64(n)))
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// take books n bytes and returns how long to wait before sending them.
func (th *Throttled) take(n int64) time.Duration {
	th.mu.Lock()
	defer th.mu.Unlock()
	now := time.Now()
	if th.next.Before(now) {
		th.next = now
	}
	wait := th.next.Sub(now)
	th.next = th.next.Add(time.Duration(n) * time.Second / time.Duration(th.rate))
	if th.first.IsZero() {
		th.first = now
	}
	th.sent += n
	th.last = th.next
	return wait
}

// Stats returns the bytes sent to the namespace so far and the time from
// the first to the last of them.
func (th *Throttled) Stats() (bytes int64, took time.Duration) {
	th.mu.Lock()
	defer th.mu.Unlock()
	return th.sent, th.last.Sub(th.first)
}

func halfClose(c net.Conn) {
	if t, ok := c.(*net.TCPConn); ok {
		_ = t.CloseWrite()
	}
}
