// Command dashboard writes the Grafana dashboard built by package dashboard
// (make dashboard).
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/consul-cni-repair/consul-cni-repair/tools/dashboard"
)

func main() {
	out := flag.String("o", "", "file to write (default: standard output)")
	flag.Parse()
	b, err := dashboard.JSON()
	if err != nil {
		fmt.Fprintln(os.Stderr, "dashboard:", err)
		os.Exit(1)
	}
	if *out == "" {
		_, err = os.Stdout.Write(b)
	} else {
		err = os.WriteFile(*out, b, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "dashboard:", err)
		os.Exit(1)
	}
}
