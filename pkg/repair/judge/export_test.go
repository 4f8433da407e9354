package judge

import "time"

// SetGateClock sets the clock a cni-pod gate measures not-ready spells
// with (NewGate uses time.Now).
func SetGateClock(g Gate, now func() time.Time) { g.(*cniPodGate).now = now }
