//go:build privileged

package testnet

import (
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
)

func TestExternalReachableFromHost(t *testing.T) {
	r := Reserve(t)
	if !r.V4.Contains(r.Subnet4(3, 24).Addr()) || r.V4.Bits() != 20 {
		t.Fatalf("bad range %v", r.V4)
	}
	ext := r.NewExternal(t)
	for _, a := range []netip.Addr{ext.V4, ext.V6} {
		l, err := ext.Listen("tcp", netip.AddrPortFrom(a, 8080).String())
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			c, err := l.Accept()
			if err == nil {
				io.WriteString(c, "external\n")
				c.Close()
			}
		}()
		c, err := net.Dial("tcp", netip.AddrPortFrom(a, 8080).String())
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(c)
		c.Close()
		l.Close()
		if strings.TrimSpace(string(b)) != "external" {
			t.Fatalf("got %q", b)
		}
	}
	// An address of the range with no specific route must be unreachable,
	// never sent towards the machine's default gateway.
	if _, err := net.Dial("tcp", netip.AddrPortFrom(Host(r.Subnet4(9, 24), 7), 80).String()); err == nil || !strings.Contains(err.Error(), "no route to host") {
		t.Fatalf("expected no route to host, got %v", err)
	}
}

// A sweep holds every free slot's lock while it cleans; a process choosing
// a slot at that moment still gets one (sweeps and choices take turns).
func TestReserveFindsASlotWhileAnotherProcessSweeps(t *testing.T) {
	RequireRoot(t)
	stop := make(chan struct{})
	var sweepers sync.WaitGroup
	for i := 0; i < 4; i++ {
		sweepers.Add(1)
		go func() {
			defer sweepers.Done()
			for {
				select {
				case <-stop:
					return
				default:
					Sweep()
				}
			}
		}()
	}
	defer func() { close(stop); sweepers.Wait() }()
	for i := 0; i < 20; i++ {
		r, err := reserve()
		if err != nil {
			t.Fatalf("reserve %d: %v", i, err)
		}
		r.release()
	}
}
