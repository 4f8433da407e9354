// Command funclen fails when a function declared in a non-test Go file under
// the given directories is longer than -max lines (from the func keyword to
// the closing brace). make lint runs it on pkg/ and cmd/.
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Long is a function over the limit.
type Long struct {
	Pos   token.Position
	Name  string
	Lines int
}

func (l Long) String() string {
	return fmt.Sprintf("%s:%d %s: %d lines", l.Pos.Filename, l.Pos.Line, l.Name, l.Lines)
}

// funcName is Name for functions, (Recv).Name or (*Recv).Name for methods.
func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	t := fn.Recv.List[0].Type
	star := ""
	if s, ok := t.(*ast.StarExpr); ok {
		star, t = "*", s.X
	}
	switch x := t.(type) {
	case *ast.IndexExpr:
		t = x.X
	case *ast.IndexListExpr:
		t = x.X
	}
	recv := "?"
	if id, ok := t.(*ast.Ident); ok {
		recv = id.Name
	}
	return "(" + star + recv + ")." + fn.Name.Name
}

// checkFile returns the functions of one Go source over max lines.
func checkFile(fset *token.FileSet, name string, src any, max int) ([]Long, error) {
	f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var long []Long
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Body == nil {
			continue
		}
		start, end := fset.Position(fn.Pos()), fset.Position(fn.End())
		if n := end.Line - start.Line + 1; n > max {
			long = append(long, Long{Pos: start, Name: funcName(fn), Lines: n})
		}
	}
	return long, nil
}

// skipDir names directories the go tool ignores as well.
func skipDir(name string) bool {
	return name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")
}

// check walks roots and returns every function over max lines outside _test.go files.
func check(roots []string, max int) ([]Long, error) {
	fset := token.NewFileSet()
	var long []Long
	for _, root := range roots {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if path != root && skipDir(d.Name()) {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			l, err := checkFile(fset, path, nil, max)
			long = append(long, l...)
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	return long, nil
}

func run(args []string, out io.Writer) int {
	fl := flag.NewFlagSet("funclen", flag.ContinueOnError)
	fl.SetOutput(out)
	max := fl.Int("max", 80, "longest function allowed, in lines")
	if err := fl.Parse(args); err != nil {
		return 2
	}
	if fl.NArg() == 0 || *max < 1 {
		fmt.Fprintln(out, "usage: funclen [-max N] DIR...")
		return 2
	}
	long, err := check(fl.Args(), *max)
	if err != nil {
		fmt.Fprintln(out, "funclen:", err)
		return 2
	}
	for _, l := range long {
		fmt.Fprintf(out, "%s (max %d)\n", l, *max)
	}
	if len(long) > 0 {
		return 1
	}
	return 0
}

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}
