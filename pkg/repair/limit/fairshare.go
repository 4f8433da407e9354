package limit

import "time"

// fairShare is how many of the cap's actions in the window namespace may
// hold at once. While other namespaces wait (a take of theirs was refused
// and none served since), the cap is split evenly between them and it (at
// least one each). While none waits, a namespace may take the cap less a
// tenth (headroom; none for a cap under 10): the first pods of
// another namespace then find room at once instead of waiting for the
// window to pass, which a namespace whose pods all look broken (200 made to
// look so, or a misconfigured workload) would otherwise hold.
func (l *Limiter) fairShare(namespace string) int {
	others := 0
	for ns := range l.waiting {
		if ns != namespace {
			others++
		}
	}
	if others == 0 {
		return l.cap - headroom(l.cap)
	}
	share := l.cap / (others + 1)
	if share < 1 {
		share = 1
	}
	return share
}

// headroom is the part of the cap one namespace alone leaves for others: a
// tenth, none for a cap under 10 (such a small cap is a deliberate slow pace).
func headroom(limit int) int { return limit / 10 }

// shareWait returns how long until namespace is within its fair share again
// (0: it is): until its oldest action in the window leaves it.
func (l *Limiter) shareWait(namespace string, now time.Time) time.Duration {
	used := 0
	var oldest time.Time
	for _, a := range l.recent {
		if a.namespace == namespace {
			if used == 0 {
				oldest = a.at
			}
			used++
		}
	}
	if used < l.fairShare(namespace) {
		return 0
	}
	return oldest.Add(capWindow).Sub(now)
}
