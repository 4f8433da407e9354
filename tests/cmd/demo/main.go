// Command demo reproduces the race on an embedded local cluster and shows
// what each layer of consul-cni-repair changes (`make demo`): the no-repair,
// repair and prevention runs of tests/harness/scenario, a live progress line, a
// table, and a JSON report at $DEMO_REPORT (default demo-report.json).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/lifecycle"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/scenario"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/simnode"
)

type options struct {
	Pods      int
	Report    string
	Modes     []string
	CNIDelay  time.Duration
	Observe   time.Duration
	MinPodAge time.Duration
	Log       string
	Nodes     string
}

func (o *options) AddFlags(fs *pflag.FlagSet) {
	report := os.Getenv("DEMO_REPORT")
	if report == "" {
		report = "demo-report.json"
	}
	fs.IntVar(&o.Pods, "pods", 10, "injected pods in each run's Deployment")
	fs.StringVar(&o.Report, "report", report, "JSON report path (default $DEMO_REPORT, else demo-report.json)")
	var runs []string
	for _, m := range scenario.Modes {
		runs = append(runs, string(m))
	}
	fs.StringSliceVar(&o.Modes, "runs", runs, "runs to do, in order")
	fs.DurationVar(&o.CNIDelay, "cni-delay", 5*time.Second, "how long the pods run before consul-cni is chained on their node")
	fs.DurationVar(&o.Observe, "observe", 20*time.Second, "shortest observation after consul-cni is chained")
	fs.DurationVar(&o.MinPodAge, "min-pod-age", 10*time.Second, "the repair controller's --min-pod-age")
	fs.StringVar(&o.Nodes, "nodes", scenario.NodesFromEnv(), "kind of node the runs use: "+strings.Join(scenario.NodeKinds, " or ")+" (default $"+scenario.NodesEnv+", else "+scenario.DefaultNodes+")")
	fs.StringVar(&o.Log, "log", filepath.Join(os.TempDir(), "consul-cni-repair-demo.log"), "detailed log (nodes, controller, plugin)")
}

func (o *options) Validate() error {
	if o.Pods < 1 || o.Pods > 100 {
		return fmt.Errorf("--pods: %d is not between 1 and 100", o.Pods)
	}
	for _, m := range o.Modes {
		if !slices.Contains(scenario.Modes, scenario.Mode(m)) {
			return fmt.Errorf("--runs: %q is not one of %v", m, scenario.Modes)
		}
	}
	if !slices.Contains(scenario.NodeKinds, o.Nodes) {
		return fmt.Errorf("--nodes: %q is not one of %s", o.Nodes, strings.Join(scenario.NodeKinds, ", "))
	}
	if o.Report == "" {
		return errors.New("--report: empty path")
	}
	if os.Geteuid() != 0 {
		return errors.New("the demo creates network namespaces, veth pairs and iptables rules: run it as root")
	}
	return nil
}

// Report is the JSON report.
type Report struct {
	Pods       int                `json:"pods"`
	Kubernetes string             `json:"kubernetes"`
	Nodes      string             `json:"nodes"`
	Scenarios  []*scenario.Result `json:"scenarios"`
	Skipped    map[string]string  `json:"skipped,omitempty"`
	// Verdicts lists, per run, why it does not show what it claims
	// (scenario.Verdict); a run without an entry showed it.
	Verdicts map[string][]string `json:"verdicts,omitempty"`
}

func main() {
	o := &options{}
	o.AddFlags(pflag.CommandLine)
	pflag.Parse()
	if err := o.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "\ndemo:", err)
		os.Exit(1)
	}
}

func run(o *options) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logFile, err := os.Create(o.Log)
	if err != nil {
		return err
	}
	defer logFile.Close()
	logf := func(f string, a ...any) { fmt.Fprintf(logFile, time.Now().Format("15:04:05.000 ")+f+"\n", a...) }

	env := &lifecycle.Env{}
	defer env.Close()
	return env.Run(func() error {
		fmt.Println("consul-cni-repair demo: the race between a node's CNI DaemonSet and the pods that land first")
		fmt.Printf("detailed log: %s\n\n", o.Log)
		step("starting the local control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)")
		c, err := cluster.Start(ctx, cluster.Options{})
		if err != nil {
			return err
		}
		env.Cleanup(c.Stop)
		step("building consul-cni, the installer, the repair controller and what the " + o.Nodes + " nodes run")
		e := scenario.NewEnv(env, c)
		e.Logf = logf
		if err := e.UseNodes(env, o.Nodes); err != nil {
			return err
		}
		rep := &Report{Pods: o.Pods, Kubernetes: simnode.Version, Nodes: o.Nodes, Skipped: map[string]string{}, Verdicts: map[string][]string{}}
		for _, m := range o.Modes {
			mode := scenario.Mode(m)
			if err := e.Supports(mode); err != nil {
				rep.Skipped[m] = err.Error()
				fmt.Printf("skipping %s: %v\n", m, err)
				continue
			}
			step(describe(mode, o))
			live := newLine(os.Stdout)
			cfg := scenario.Config{
				Mode: mode, Pods: o.Pods, CNIDelay: o.CNIDelay, Observe: o.Observe, MinPodAge: o.MinPodAge,
				Progress: func(p scenario.Progress) { live.show(progressLine(p)) },
				// The prevention run's pods also carry the init-container
				// check; a reboot's outcome is clear within 90 s.
				CheckInit: mode == scenario.Prevention,
			}
			if mode == scenario.NodeReboot {
				cfg.Timeout = 90 * time.Second
			}
			res, err := scenario.Run(ctx, e, cfg)
			live.done()
			if err != nil {
				return fmt.Errorf("%s run: %w (see %s)", m, err, o.Log)
			}
			rep.Scenarios = append(rep.Scenarios, res)
			fmt.Printf("  %s\n", summary(res))
			if v := scenario.Verdict(mode, res); len(v) > 0 {
				rep.Verdicts[m] = v
			}
		}
		fmt.Println()
		printTable(os.Stdout, rep)
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(o.Report, append(b, '\n'), 0o644); err != nil {
			return err
		}
		fmt.Printf("\nreport: %s\n", o.Report)
		return verdicts(rep)
	})
}

// verdicts prints why runs did not show what they claim and fails the demo
// if any did not: a table that could not have observed the race is no
// evidence, whatever its numbers say.
func verdicts(rep *Report) error {
	if len(rep.Verdicts) == 0 {
		fmt.Println("verdict: every run showed what it claims (the plain pod without the mesh reached the external service in each)")
		return nil
	}
	fmt.Println("\nverdict: FAILED")
	for _, r := range rep.Scenarios {
		for _, v := range rep.Verdicts[r.Name] {
			fmt.Printf("  %s: %s\n", r.Name, v)
		}
	}
	return fmt.Errorf("%d of %d runs did not show what they claim (above); their numbers are no evidence", len(rep.Verdicts), len(rep.Scenarios))
}

func step(s string) { fmt.Printf(">> %s\n", s) }

func describe(m scenario.Mode, o *options) string {
	switch m {
	case scenario.NoRepair:
		return fmt.Sprintf("run no-repair: %d injected pods start on a node whose CNI chain has only the primary network; consul-cni arrives %s later; nothing else happens", o.Pods, o.CNIDelay)
	case scenario.Repair:
		return fmt.Sprintf("run repair: the same race, with the repair controller running (--min-pod-age=%s): it evicts the pods that bypassed once the node's CNI is ready", o.MinPodAge)
	case scenario.Prevention:
		return "run prevention: the node joins with the startup taint consul.hashicorp.com/cni-not-ready; pods (with the init-container check consul-cni-check) wait until the installer has chained consul-cni and the controller lifts the taint"
	case scenario.NodeReboot:
		return "run node-reboot: meshed pods; kubelet and the runtime restart with every sandbox lost, the conflist rewritten without consul-cni while the node is down; does any pod end outside the mesh, and does the controller find it?"
	}
	return string(m)
}

func progressLine(p scenario.Progress) string {
	cni := "CNI not chained yet"
	if p.SinceCNI >= 0 {
		cni = fmt.Sprintf("CNI chained %4.0fs ago", p.SinceCNI.Seconds())
	}
	return fmt.Sprintf("  [%s %4.0fs] %-44s | pods %2d/%d | meshed %2d | bypassing %2d | ever bypassed %2d | actions %2d | %s",
		p.Mode, p.Elapsed.Seconds(), trunc(p.Phase, 44), p.Live, p.Pods, p.Meshed, p.Bypassing, p.EverBypassed, p.Actions, cni)
}

func trunc(s string, n int) string {
	if len(s) > n {
		return s[:n-1] + "…"
	}
	return s
}

func summary(r *scenario.Result) string {
	t := "never all meshed"
	if r.SecondsToAllMeshed != nil {
		t = fmt.Sprintf("all meshed %.1fs after the CNI was chained", *r.SecondsToAllMeshed)
	}
	s := fmt.Sprintf("%s: %d of %d pods ever bypassed, %d bypassing at the end, %s, %d actions", r.Name, r.EverBypassed, r.Pods, r.BypassingAtEnd, t, r.Actions)
	if r.Name == string(scenario.NodeReboot) {
		s += fmt.Sprintf(" (%d repairs with reason sandbox_recreated)", r.RecreatedActions)
		if c := r.Controller; c != nil {
			s += fmt.Sprintf("; the controller judges %d pods outside the mesh, its circuit breaker is open on %d nodes", c.BrokenPods, c.BreakerOpenNodes)
		}
	}
	if r.Control != nil {
		s += fmt.Sprintf(" (control pod created after the plugin: %d meshed / %d bypass connections)", r.Control.Meshed, r.Control.Bypass)
	}
	return s
}

func printTable(w io.Writer, rep *Report) {
	head := []string{"scenario", "node", "pods", "ever bypassed", "bypassing at end", "s until all meshed", "actions", "verdict"}
	rows := [][]string{head}
	for _, r := range rep.Scenarios {
		t := "never"
		if r.SecondsToAllMeshed != nil {
			t = fmt.Sprintf("%.1f", *r.SecondsToAllMeshed)
		}
		node := "?"
		if r.Node != nil {
			node = r.Node.Kubelet + " " + r.Node.Runtime
		}
		verdict := "ok"
		if len(rep.Verdicts[r.Name]) > 0 {
			verdict = "FAILED"
		}
		rows = append(rows, []string{r.Name, node, fmt.Sprint(r.Pods), fmt.Sprint(r.EverBypassed), fmt.Sprint(r.BypassingAtEnd), t, fmt.Sprint(r.Actions), verdict})
	}
	width := make([]int, len(head))
	for _, row := range rows {
		for i, c := range row {
			width[i] = max(width[i], len(c))
		}
	}
	line := func(row []string) {
		var b strings.Builder
		for i, c := range row {
			if i == 0 {
				fmt.Fprintf(&b, "| %-*s ", width[i], c)
			} else {
				fmt.Fprintf(&b, "| %*s ", width[i], c)
			}
		}
		fmt.Fprintln(w, b.String()+"|")
	}
	sep := func() {
		var b strings.Builder
		for _, n := range width {
			b.WriteString("|" + strings.Repeat("-", n+2))
		}
		fmt.Fprintln(w, b.String()+"|")
	}
	line(rows[0])
	sep()
	for _, r := range rows[1:] {
		line(r)
	}
}

// liveLine rewrites one terminal line in place (or prints a line every
// few seconds when the output is not a terminal).
type liveLine struct {
	w      *os.File
	tty    bool
	last   time.Time
	width  int
	shown  bool
	latest string
}

func newLine(w *os.File) *liveLine {
	st, err := w.Stat()
	return &liveLine{w: w, tty: err == nil && st.Mode()&os.ModeCharDevice != 0}
}

func (l *liveLine) show(s string) {
	l.latest = s
	if l.tty {
		pad := ""
		if n := l.width - len([]rune(s)); n > 0 {
			pad = strings.Repeat(" ", n)
		}
		fmt.Fprintf(l.w, "\r%s%s", s, pad)
		l.width = len([]rune(s))
		l.shown = true
		return
	}
	if time.Since(l.last) >= 5*time.Second {
		fmt.Fprintln(l.w, s)
		l.last = time.Now()
	}
}

func (l *liveLine) done() {
	if l.tty && l.shown {
		fmt.Fprintln(l.w)
	} else if !l.tty && l.latest != "" {
		fmt.Fprintln(l.w, l.latest)
	}
}
