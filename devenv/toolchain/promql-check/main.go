// Command promql-check checks Prometheus rule files and PromQL expressions with Prometheus's own
// code, as `promtool check rules` does (model/rulefmt: groups, names, durations, labels,
// annotation templates and every expression parsed), and lists the metric names each
// expression selects, so tests can hold them against a real scrape.
//
//	promql-check rules FILE...   rule files; prints {"file": ..., "exprs": [{"expr", "metrics"}]}
//	promql-check exprs           a JSON list of expressions on stdin; prints one result each
//
// Exit 1 with the errors on stderr when anything does not parse.
package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

type result struct {
	Expr    string   `json:"expr"`
	Alert   string   `json:"alert,omitempty"`
	Metrics []string `json:"metrics"`
	Error   string   `json:"error,omitempty"`
}

// The parser Prometheus itself runs rules with (no experimental functions).
var promql = parser.NewParser(parser.Options{})

func metrics(expr string) ([]string, error) {
	node, err := promql.ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	names := []string{}
	parser.Inspect(node, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			names = append(names, vs.Name)
		}
		return nil
	})
	return names, nil
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: promql-check rules FILE... | promql-check exprs < exprs.json")
		os.Exit(2)
	}
	failed := false
	out := json.NewEncoder(os.Stdout)
	switch os.Args[1] {
	case "rules":
		for _, file := range os.Args[2:] {
			groups, errs := rulefmt.ParseFile(file, false, model.UTF8Validation, promql, slog.New(slog.DiscardHandler))
			for _, err := range errs {
				fmt.Fprintf(os.Stderr, "%s: %v\n", file, err)
				failed = true
			}
			if groups == nil {
				continue
			}
			results := []result{}
			for _, group := range groups.Groups {
				for _, rule := range group.Rules {
					names, err := metrics(rule.Expr)
					r := result{Expr: rule.Expr, Alert: rule.Alert, Metrics: names}
					if err != nil {
						r.Error = err.Error()
						failed = true
					}
					results = append(results, r)
				}
			}
			_ = out.Encode(map[string]any{"file": file, "exprs": results})
		}
	case "exprs":
		var exprs []string
		if err := json.NewDecoder(os.Stdin).Decode(&exprs); err != nil {
			fmt.Fprintln(os.Stderr, "stdin: a JSON list of expressions:", err)
			os.Exit(2)
		}
		results := []result{}
		for _, expr := range exprs {
			names, err := metrics(expr)
			r := result{Expr: expr, Metrics: names}
			if err != nil {
				r.Error = err.Error()
				fmt.Fprintf(os.Stderr, "%q: %v\n", expr, err)
				failed = true
			}
			results = append(results, r)
		}
		_ = out.Encode(results)
	default:
		fmt.Fprintln(os.Stderr, "unknown command", os.Args[1])
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}
