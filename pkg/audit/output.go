package audit

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/client-go/util/jsonpath"
	"sigs.k8s.io/yaml"
)

// The report's apiVersion and kind in machine output (json, yaml,
// jsonpath). The report is no API object; they say what the document is and
// which version of its fields, so a consumer can check before reading it.
const (
	APIVersion = "audit.consul-cni-repair/v1alpha1"
	Kind       = "AuditReport"
)

// printer writes a report in one of the --output formats, as kubectl's
// printers do: table (wide with more columns, --no-headers without the
// header lines), json and yaml of the whole report, name (pod/NAME of each
// pod outside the mesh) and jsonpath=TEMPLATE over the JSON report.
type printer struct {
	format    string
	noHeaders bool
	jsonpath  *jsonpath.JSONPath
}

// newPrinter parses --output; the error names the bad value.
func newPrinter(output string, noHeaders bool) (*printer, error) {
	p := &printer{format: output, noHeaders: noHeaders}
	switch {
	case output == "table" || output == "wide" || output == "json" || output == "yaml" || output == "name":
	case strings.HasPrefix(output, "jsonpath="):
		p.format = "jsonpath"
		p.jsonpath = jsonpath.New("output").AllowMissingKeys(true)
		if err := p.jsonpath.Parse(strings.TrimPrefix(output, "jsonpath=")); err != nil {
			return nil, fmt.Errorf("%q: %v", output, err)
		}
	default:
		return nil, fmt.Errorf("%q is not one of table, wide, json, yaml, name, jsonpath=TEMPLATE", output)
	}
	return p, nil
}

func (p *printer) print(w io.Writer, r *Report) error {
	switch p.format {
	case "json":
		b, err := json.MarshalIndent(r, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case "yaml":
		b, err := yaml.Marshal(r)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	case "jsonpath":
		return p.printJSONPath(w, r)
	case "name":
		for _, pod := range r.Outside {
			if _, err := fmt.Fprintf(w, "pod/%s\n", pod.Name); err != nil {
				return err
			}
		}
		return nil
	}
	return p.printTables(w, r)
}

// printJSONPath runs the template over the report as its JSON reads
// (field names as in -o json).
func (p *printer) printJSONPath(w io.Writer, r *Report) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	var doc any
	if err := json.Unmarshal(b, &doc); err != nil {
		return err
	}
	return p.jsonpath.Execute(w, doc)
}

// printTables writes the pods outside the mesh and, unless --no-headers,
// the injected pods the controller never judges (a second table under a
// sentence, as kubectl prints one table per kind). ACTION is what the
// controller would do in one word; wide adds why (WHY) and the detector's
// DETAIL.
func (p *printer) printTables(w io.Writer, r *Report) error {
	wide := p.format == "wide"
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	if !p.noHeaders {
		header := "NAMESPACE\tPOD\tNODE\tOWNER\tREASON\tEVIDENCE\tSINCE\tACTION"
		if wide {
			header += "\tWHY\tDETAIL\tINFERRED"
		}
		fmt.Fprintln(tw, header)
	}
	for _, pod := range r.Outside {
		action, why := splitAction(pod.Action)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", pod.Namespace, pod.Name, orNone(pod.Node), pod.Owner, pod.Reason,
			pod.Evidence, duration.HumanDuration(r.Time.Sub(pod.Since)), action)
		if wide {
			fmt.Fprintf(tw, "\t%s\t%s\t%s", orNone(why), orNone(pod.Detail), orNone(pod.Inferred))
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.NotJudged) == 0 || p.noHeaders {
		return nil
	}
	fmt.Fprintln(w, "\nInjected pods the controller never judges (their redirection was never marked complete):")
	tw = tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tPOD\tNODE\tWHY")
	for _, pod := range r.NotJudged {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", pod.Namespace, pod.Name, orNone(pod.Node), pod.Why)
	}
	return tw.Flush()
}

// splitAction splits a Pod's Action ("wait: CNI not ready on the node
// ...") into its word and its reason.
func splitAction(a string) (action, why string) {
	action, why, _ = strings.Cut(a, ":")
	return action, strings.TrimSpace(why)
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}
