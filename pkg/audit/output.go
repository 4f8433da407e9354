package audit

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/yaml"
)

// Print writes the report in format (table, json or yaml).
func Print(w io.Writer, r *Report, format string) error {
	switch format {
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
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tPOD\tNODE\tOWNER\tREASON\tSINCE\tCONTROLLER WOULD")
	for _, p := range r.Outside {
		node := p.Node
		if node == "" {
			node = "<none>"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Namespace, p.Name, node, p.Owner, p.Reason,
			duration.HumanDuration(r.Time.Sub(p.Since)), p.Action)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.NotJudged) == 0 {
		return nil
	}
	fmt.Fprintln(w, "\nInjected pods the controller never judges (their redirection was never marked complete):")
	tw = tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tPOD\tNODE\tWHY")
	for _, p := range r.NotJudged {
		node := p.Node
		if node == "" {
			node = "<none>"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", p.Namespace, p.Name, node, p.Why)
	}
	return tw.Flush()
}
