package scenario

import (
	"bufio"
	"io"
	"net/netip"
	"os"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Words the prober prints (tests/cmd/podprog).
const (
	resultMeshed = "meshed"
	resultBypass = "bypass"
)

// ProberContainer is the name of the container that runs the prober.
const ProberContainer = "app"

// podTrack is what the prober of one pod (one UID) reported.
type podTrack struct {
	UID           types.UID
	Name          string
	IP            netip.Addr
	Created       time.Time
	Meshed        int
	Bypass        int
	Errors        int
	FirstAt       time.Time // first result
	LastAt        time.Time
	Last          string
	FirstBypassAt time.Time
	// MeshedSince is the first meshed result after the last other one
	// (zero while the last result is not meshed).
	MeshedSince time.Time
	Deleted     bool
}

// tracker reads the probers' output on a node incrementally.
type tracker struct {
	logs    func() ([]LogFile, error)
	ns      string
	pods    map[types.UID]*podTrack
	offsets map[string]int64
	partial map[string]string
	control *podTrack // ControlPod, kept apart
	plain   *podTrack // PlainPod, kept apart
}

func newTracker(logs func() ([]LogFile, error), ns string) *tracker {
	return &tracker{logs: logs, ns: ns, pods: map[types.UID]*podTrack{}, offsets: map[string]int64{}, partial: map[string]string{}}
}

func (t *tracker) pod(uid types.UID, name string) *podTrack {
	p := t.pods[uid]
	if p == nil {
		p = &podTrack{UID: uid, Name: name}
		t.pods[uid] = p
	}
	return p
}

// readLogs consumes the new lines of every prober log of the namespace.
func (t *tracker) readLogs() {
	files, err := t.logs()
	if err != nil {
		return
	}
	for _, f := range files {
		if f.Namespace != t.ns || f.Container != ProberContainer {
			continue
		}
		var p *podTrack
		switch f.Pod {
		case ControlPod:
			if t.control == nil {
				t.control = &podTrack{UID: f.UID, Name: f.Pod}
			}
			p = t.control
		case PlainPod:
			if t.plain == nil {
				t.plain = &podTrack{UID: f.UID, Name: f.Pod}
			}
			p = t.plain
		default:
			p = t.pod(f.UID, f.Pod)
		}
		fh, err := os.Open(f.Path)
		if err != nil {
			continue
		}
		if _, err := fh.Seek(t.offsets[f.Path], io.SeekStart); err != nil {
			fh.Close()
			continue
		}
		b, _ := io.ReadAll(fh)
		fh.Close()
		t.offsets[f.Path] += int64(len(b))
		data := t.partial[f.Path] + string(b)
		lines := strings.Split(data, "\n")
		t.partial[f.Path] = lines[len(lines)-1] // an unfinished line
		for _, l := range lines[:len(lines)-1] {
			t.line(p, l)
		}
	}
}

func (t *tracker) line(p *podTrack, l string) {
	sc := bufio.NewScanner(strings.NewReader(criLine(l)))
	sc.Split(bufio.ScanWords)
	var words []string
	for sc.Scan() && len(words) < 2 {
		words = append(words, sc.Text())
	}
	if len(words) < 2 {
		return
	}
	at, err := time.Parse(time.RFC3339Nano, words[0])
	if err != nil {
		return
	}
	if p.FirstAt.IsZero() {
		p.FirstAt = at
	}
	p.LastAt, p.Last = at, words[1]
	switch words[1] {
	case resultMeshed:
		p.Meshed++
		if p.MeshedSince.IsZero() {
			p.MeshedSince = at
		}
	case resultBypass:
		p.Bypass++
		if p.FirstBypassAt.IsZero() {
			p.FirstBypassAt = at
		}
		p.MeshedSince = time.Time{}
	default:
		p.Errors++
		p.MeshedSince = time.Time{}
	}
}

// observe merges the API's view: live pods, their IPs, deletions.
func (t *tracker) observe(pods []corev1.Pod) (live []*podTrack) {
	alive := map[types.UID]bool{}
	for i := range pods {
		pod := &pods[i]
		p := t.pod(pod.UID, pod.Name)
		p.Created = pod.CreationTimestamp.Time
		if a, err := netip.ParseAddr(pod.Status.PodIP); err == nil {
			p.IP = a
		}
		if pod.DeletionTimestamp == nil {
			alive[pod.UID] = true
			live = append(live, p)
		}
	}
	for uid, p := range t.pods {
		if !alive[uid] && !p.Created.IsZero() {
			p.Deleted = true
		}
	}
	sort.Slice(live, func(i, j int) bool { return live[i].Name < live[j].Name })
	return live
}

// fresh reports whether a pod's last result is recent enough to describe
// its present.
func (p *podTrack) fresh(now time.Time, within time.Duration) bool {
	return !p.LastAt.IsZero() && now.Sub(p.LastAt) <= within
}
