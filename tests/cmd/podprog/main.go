// Command podprog is what simulated nodes run as containers in tests and
// the demo. Subcommands:
//
//	probe   --target host:port [--interval 250ms] [--timeout 1s]
//	        dials the target over and over and prints one line per attempt:
//	        "<RFC3339Nano> meshed|bypass|error <detail>". A reply "proxy"
//	        means the connection was redirected to the pod's outbound proxy
//	        listener (meshed); a reply "external" means it reached the
//	        external service itself (bypass).
//	proxy   [--outbound 15001] [--inbound 20000]
//	        a stand-in for the Envoy sidecar: answers "proxy" on both ports.
//	serve   --listen addr --reply text
//	        answers every connection with text; prints the address it
//	        listens on.
//	connect-init [--delay d]
//	        stands in for consul-k8s's connect-init: waits, exits 0.
//	exit    [--code n] [--message m] [--termination-log path] [--delay d]
//	        writes the message to the termination log and exits with code n.
//	exists  path
//	        exits 0 when the file exists, 1 otherwise (readiness probes).
//	report  --out path [--file path]...
//	        writes a JSON report of the process (uid, gid, KUBECONFIG and the
//	        identity it authenticates as, the named files' contents, the
//	        addresses of the network namespace) to --out.
//	idle    sleeps until SIGTERM.
//
// Run with CNI_COMMAND set, it is instead a chained CNI plugin that records
// its calls (see cni.go).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	if os.Getenv("CNI_COMMAND") != "" {
		cniPlugin()
		return
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: podprog probe|proxy|serve|connect-init|exit|idle [flags]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var err error
	switch os.Args[1] {
	case "probe":
		err = probe(ctx, os.Args[2:])
	case "proxy":
		err = proxy(ctx, os.Args[2:])
	case "serve":
		err = serve(ctx, os.Args[2:])
	case "connect-init":
		fs := flag.NewFlagSet("connect-init", flag.ExitOnError)
		delay := fs.Duration("delay", 0, "time to wait before exiting")
		_ = fs.Parse(os.Args[2:])
		sleep(ctx, *delay)
		fmt.Println("connect-init: done")
	case "exit":
		fs := flag.NewFlagSet("exit", flag.ExitOnError)
		code := fs.Int("code", 0, "exit code")
		msg := fs.String("message", "", "termination message")
		tlog := fs.String("termination-log", "/dev/termination-log", "termination message file")
		delay := fs.Duration("delay", 0, "time to wait before exiting")
		_ = fs.Parse(os.Args[2:])
		sleep(ctx, *delay)
		if *msg != "" {
			if err := os.WriteFile(*tlog, []byte(*msg), 0o644); err != nil {
				fmt.Fprintln(os.Stderr, err)
			}
			fmt.Println(*msg)
		}
		os.Exit(*code)
	case "exists":
		if len(os.Args) < 3 {
			os.Exit(2)
		}
		if _, err := os.Stat(os.Args[2]); err != nil {
			os.Exit(1)
		}
	case "report":
		err = report(ctx, os.Args[2:])
	case "idle":
		<-ctx.Done()
	default:
		err = fmt.Errorf("unknown subcommand %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "podprog:", err)
		os.Exit(1)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// Result words printed by probe.
const (
	Meshed = "meshed"
	Bypass = "bypass"
	Error  = "error"
)

func probe(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("probe", flag.ContinueOnError)
	target := fs.String("target", "", "host:port of the external service")
	interval := fs.Duration("interval", 250*time.Millisecond, "time between attempts")
	timeout := fs.Duration("timeout", time.Second, "timeout of one attempt")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *target == "" {
		return errors.New("--target is required")
	}
	out := bufio.NewWriter(os.Stdout)
	t := time.NewTicker(*interval)
	defer t.Stop()
	for {
		result, detail := attempt(ctx, *target, *timeout)
		fmt.Fprintf(out, "%s %s %s\n", time.Now().UTC().Format(time.RFC3339Nano), result, detail)
		out.Flush()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func attempt(ctx context.Context, target string, timeout time.Duration) (string, string) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", target)
	if err != nil {
		return Error, oneLine(err.Error())
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil && line == "" {
		return Error, oneLine("read: " + err.Error())
	}
	switch strings.TrimSpace(line) {
	case "proxy":
		return Meshed, "via " + c.LocalAddr().String()
	case "external":
		return Bypass, "from " + c.LocalAddr().String()
	}
	return Error, oneLine("unexpected reply " + fmt.Sprintf("%q", line))
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }

func proxy(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
	outbound := fs.Int("outbound", 15001, "outbound listener port")
	inbound := fs.Int("inbound", 20000, "inbound listener port")
	if err := fs.Parse(args); err != nil {
		return err
	}
	errc := make(chan error, 2)
	for _, p := range []int{*outbound, *inbound} {
		l, err := net.Listen("tcp", fmt.Sprintf(":%d", p))
		if err != nil {
			return err
		}
		defer l.Close()
		go func() { errc <- answer(l, "proxy") }()
	}
	fmt.Printf("proxy: listening on %d (outbound) and %d (inbound)\n", *outbound, *inbound)
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return err
	}
}

func serve(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	listen := fs.String("listen", "", "address to listen on")
	reply := fs.String("reply", "", "line sent to every client")
	if err := fs.Parse(args); err != nil {
		return err
	}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	defer l.Close()
	// On stdout, so that the container's log shows the server is up.
	fmt.Printf("serve: listening on %s\n", l.Addr())
	errc := make(chan error, 1)
	go func() { errc <- answer(l, *reply) }()
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return err
	}
}

func answer(l net.Listener, reply string) error {
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			fmt.Fprintf(c, "%s\n", reply)
		}()
	}
}
