package testnet

import (
	"context"
	"io"
	"net"
)

// Relay copies between c and a new TCP connection to target until both
// directions have ended, then closes both. It dials from the calling
// goroutine's thread: a goroutine started by a server that never entered
// another network namespace dials in the host's.
func Relay(c net.Conn, target string) {
	defer c.Close()
	var d net.Dialer
	up, err := d.DialContext(context.Background(), "tcp", target)
	if err != nil {
		return
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); closeWrite(up); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); closeWrite(c); done <- struct{}{} }()
	<-done
	<-done
}

// closeWrite half-closes a TCP connection, so the other side sees the end
// of what this side sends.
func closeWrite(c net.Conn) {
	if t, ok := c.(*net.TCPConn); ok {
		_ = t.CloseWrite()
	}
}
