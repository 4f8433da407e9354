// Command sdkoracle-nftables prints what Consul's SDK v0.19.0
// (github.com/hashicorp/consul/sdk/nftables) does for redirect
// configurations.
//
// It reads JSON lines {"config": <redirect-traffic-config annotation>,
// "dualStack": bool} on stdin. Each config is decoded with encoding/json
// into nftables.Config and handed to nftables.Setup with a provider that
// records the script instead of applying it. For each input line it writes
// one JSON line {"script": "...", "error": "..."}: the nft script the SDK
// would pipe to `nft -f -` (its lines joined with newlines, as the SDK's
// own executor joins them), and the error Setup or decoding returned.
//
// With -fields it prints the names and Go types of nftables.Config's
// fields instead.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"reflect"
	"strings"

	"github.com/hashicorp/consul/sdk/nftables"
)

// recorder is an nftables.Provider that keeps the script ApplyRules would
// have applied.
type recorder struct {
	lines   []string
	applied []string
}

func (r *recorder) AddRule(_ string, args ...string) {
	r.lines = append(r.lines, strings.Join(args, " "))
}

func (r *recorder) ApplyRules(string) error {
	r.applied = append(r.applied, strings.Join(r.lines, "\n"))
	r.lines = nil
	return nil
}

func (r *recorder) Rules() []string {
	var out []string
	for _, l := range r.lines {
		out = append(out, "nft "+l)
	}
	return out
}

func (r *recorder) ClearAllRules() { r.lines = nil }

type input struct {
	Config    json.RawMessage `json:"config"`
	DualStack bool            `json:"dualStack"`
}

type output struct {
	Script string `json:"script"`
	Error  string `json:"error,omitempty"`
}

func run(in input) output {
	var cfg nftables.Config
	if err := json.Unmarshal(in.Config, &cfg); err != nil {
		return output{Error: "decode: " + err.Error()}
	}
	rec := &recorder{}
	cfg.NftablesProvider = rec
	var out output
	if err := nftables.Setup(cfg, in.DualStack); err != nil {
		out.Error = err.Error()
	}
	if len(rec.applied) > 1 {
		out.Error = fmt.Sprintf("the SDK applied %d scripts, want one", len(rec.applied))
	}
	out.Script = strings.Join(rec.applied, "\n")
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
	showFields := flag.Bool("fields", false, "print the fields of nftables.Config as a JSON object and exit")
	flag.Parse()
	if *showFields {
		if err := json.NewEncoder(os.Stdout).Encode(fields(nftables.Config{})); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if err := serve(); err != nil {
		fmt.Fprintln(os.Stderr, "sdkoracle-nftables:", err)
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
