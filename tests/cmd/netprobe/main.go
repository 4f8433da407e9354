// Command netprobe is the client side of the traffic tests: run inside a
// pod namespace as a given UID (nsenter --setuid), it connects to an address
// and prints the name the listener that answered announced, so a test sees
// where a connection really landed.
//
//	netprobe tcp 198.18.14.10:8080   connect, print the first line received
//	netprobe udp 127.0.0.1:53        send a datagram, print the reply
package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strings"
	"time"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: netprobe tcp|udp HOST:PORT")
		os.Exit(2)
	}
	name, err := probe(os.Args[1], os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "netprobe:", err)
		os.Exit(1)
	}
	fmt.Println(name)
}

func probe(network, addr string) (string, error) {
	switch network {
	case "tcp":
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return "", fmt.Errorf("read from %s: %w", addr, err)
		}
		return strings.TrimSpace(line), nil
	case "udp":
		c, err := net.Dial("udp", addr)
		if err != nil {
			return "", err
		}
		defer c.Close()
		buf := make([]byte, 512)
		// Datagrams can be lost; ask a few times.
		for i := 0; i < 5; i++ {
			if _, err := c.Write([]byte("probe")); err != nil {
				return "", err
			}
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			n, err := c.Read(buf)
			if err == nil {
				return strings.TrimSpace(string(buf[:n])), nil
			}
			if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
				return "", err
			}
		}
		return "", fmt.Errorf("no reply from %s", addr)
	}
	return "", fmt.Errorf("unknown network %q", network)
}
