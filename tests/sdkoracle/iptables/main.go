// Command sdkoracle-iptables prints what Consul's SDK v0.18.1
// (github.com/hashicorp/consul/sdk/iptables, the version consul-k8s pins
// for its iptables path) does for redirect configurations.
//
// It reads JSON lines {"config": <redirect-traffic-config annotation>,
// "dualStack": bool} on stdin. Each config is decoded with encoding/json
// into iptables.Config, as the consul-k8s plugin decodes the annotation,
// and handed to iptables.Setup with a provider that records every command
// instead of running it. For each input line it writes one JSON line:
// {"commands": [["iptables", "-t", "nat", ...], ...], "error": "..."}:
// the commands the SDK would execute, in order (an IPv4 pass, then in
// dual stack an IPv6 pass), and the error Setup or decoding returned.
//
// With -fields it prints the names and Go types of iptables.Config's
// fields instead, so tests can check the annotation's shape against it.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"reflect"

	"github.com/hashicorp/consul/sdk/iptables"
)

// recorder is an iptables.Provider that keeps what each ApplyRules call
// would have run.
type recorder struct {
	pending [][]string
	applied [][]string
}

func (r *recorder) AddRule(name string, args ...string) {
	r.pending = append(r.pending, append([]string{name}, args...))
}

func (r *recorder) ApplyRules(string) error {
	r.applied = append(r.applied, r.pending...)
	r.pending = nil
	return nil
}

func (r *recorder) Rules() []string {
	var out []string
	for _, c := range r.pending {
		out = append(out, fmt.Sprint(c))
	}
	return out
}

func (r *recorder) ClearAllRules() { r.pending = nil }

type input struct {
	Config    json.RawMessage `json:"config"`
	DualStack bool            `json:"dualStack"`
}

type output struct {
	Commands [][]string `json:"commands"`
	Error    string     `json:"error,omitempty"`
}

func run(in input) output {
	var cfg iptables.Config
	if err := json.Unmarshal(in.Config, &cfg); err != nil {
		return output{Error: "decode: " + err.Error()}
	}
	rec := &recorder{}
	cfg.IptablesProvider = rec
	var out output
	if err := iptables.Setup(cfg, in.DualStack); err != nil {
		out.Error = err.Error()
	}
	out.Commands = rec.applied
	return out
}

func fields(v any) map[string]string {
	t := reflect.TypeOf(v)
	m := map[string]string{}
	for i := 0; i < t.NumField(); i++ {
		m[t.Field(i).Name] = t.Field(i).Type.String()
	}
	return m
}

func main() {
	showFields := flag.Bool("fields", false, "print the fields of iptables.Config as a JSON object and exit")
	flag.Parse()
	if *showFields {
		if err := json.NewEncoder(os.Stdout).Encode(fields(iptables.Config{})); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if err := serve(); err != nil {
		fmt.Fprintln(os.Stderr, "sdkoracle-iptables:", err)
		os.Exit(1)
	}
}

func serve() error {
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	w := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(w)
	for sc.Scan() {
		var in input
		if err := json.Unmarshal(sc.Bytes(), &in); err != nil {
			return fmt.Errorf("input line: %w", err)
		}
		if err := enc.Encode(run(in)); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return w.Flush()
}
