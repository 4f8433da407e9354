package consulk8s

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Writes counts the writes of one file, told apart by how they were made:
// in place (an open for writing closed: consul-k8s's installer truncates
// and writes) or by a rename onto the name (an atomic write).
type Writes struct {
	InPlace, Renamed int
}

// Total is every write.
func (w Writes) Total() int { return w.InPlace + w.Renamed }

func (w Writes) String() string {
	return fmt.Sprintf("%d (%d in place, %d by rename)", w.Total(), w.InPlace, w.Renamed)
}

// WriteCounter counts the writes of a file with inotify on its directory
// (IN_CLOSE_WRITE for writes in place, IN_MOVED_TO for renames onto it),
// so that no write is missed however fast they follow each other.
type WriteCounter struct {
	fd   int
	name string
	mu   sync.Mutex
	w    Writes
	done chan struct{}
}

// CountWrites starts counting the writes of path.
func CountWrites(path string) (*WriteCounter, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	if _, err := unix.InotifyAddWatch(fd, filepath.Dir(path), unix.IN_CLOSE_WRITE|unix.IN_MOVED_TO); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("inotify watch on %s: %w", filepath.Dir(path), err)
	}
	c := &WriteCounter{fd: fd, name: filepath.Base(path), done: make(chan struct{})}
	go c.read()
	return c, nil
}

func (c *WriteCounter) read() {
	defer close(c.done)
	buf := make([]byte, 64*1024)
	for {
		n, err := unix.Read(c.fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameBytes := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			name := string(bytes.TrimRight(nameBytes, "\x00"))
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if name != c.name {
				continue
			}
			c.mu.Lock()
			if ev.Mask&unix.IN_CLOSE_WRITE != 0 {
				c.w.InPlace++
			}
			if ev.Mask&unix.IN_MOVED_TO != 0 {
				c.w.Renamed++
			}
			c.mu.Unlock()
		}
	}
}

// Count returns the writes counted so far.
func (c *WriteCounter) Count() Writes {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.w
}

// Reset returns the writes counted so far and starts again from zero.
func (c *WriteCounter) Reset() Writes {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.w
	c.w = Writes{}
	return w
}

// Close stops counting.
func (c *WriteCounter) Close() {
	unix.Close(c.fd)
	// A blocked read returns once the descriptor is closed; do not wait
	// for it longer than a moment.
	select {
	case <-c.done:
	case <-time.After(100 * time.Millisecond):
	}
}

// Samples is what a runtime reading the file every so often would have
// seen.
type Samples struct {
	// N is the number of reads.
	N int
	// Changes is the number of reads that differed from the read before.
	Changes int
	// Broken is the number of reads of a file that was missing, empty or not
	// a JSON object: a runtime would have failed to load the network then.
	Broken int
	// Distinct is the number of different contents seen.
	Distinct int
}

func (s Samples) String() string {
	return fmt.Sprintf("%d changes, %d broken reads, %d distinct contents in %d reads", s.Changes, s.Broken, s.Distinct, s.N)
}

// Sample reads path every interval for d, as a runtime creating sandboxes
// without pause would, and reports what it saw.
func Sample(path string, interval, d time.Duration) Samples {
	var s Samples
	seen := map[string]bool{}
	var prev []byte
	first := true
	tick := time.NewTicker(interval)
	defer tick.Stop()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		b, err := os.ReadFile(path)
		s.N++
		var v map[string]any
		if err != nil || json.Unmarshal(b, &v) != nil || v == nil {
			s.Broken++
		}
		if !first && !bytes.Equal(b, prev) {
			s.Changes++
		}
		if !seen[string(b)] {
			seen[string(b)] = true
			s.Distinct++
		}
		prev, first = b, false
		<-tick.C
	}
	return s
}
