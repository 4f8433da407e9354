package main

import (
	"bytes"
	"fmt"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// body returns a function declaration of exactly n lines.
func body(decl string, n int) string {
	var b strings.Builder
	b.WriteString(decl + " {\n")
	for i := 0; i < n-2; i++ {
		b.WriteString("\t_ = 0\n")
	}
	b.WriteString("}\n")
	return b.String()
}

func TestCheckFileLimit(t *testing.T) {
	src := "package p\n\ntype T[K any] struct{}\n\n" +
		body("func atLimit()", 5) +
		body("func over()", 6) +
		body("func (t *T[K]) method()", 7) +
		body("func (T[K]) value()", 6) +
		"func decl()\n"
	long, err := checkFile(token.NewFileSet(), "p.go", src, 5)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range long {
		got = append(got, fmt.Sprintf("%s=%d", l.Name, l.Lines))
	}
	want := "over=6 (*T).method=7 (T).value=6"
	if strings.Join(got, " ") != want {
		t.Fatalf("got %q, want %q", strings.Join(got, " "), want)
	}
	if long[0].Pos.Line != 10 {
		t.Fatalf("over reported at line %d, want 10", long[0].Pos.Line)
	}
}

func TestRunSkipsTestFilesAndTestdata(t *testing.T) {
	dir := t.TempDir()
	write := func(name, src string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a/ok.go", "package a\n\n"+body("func short()", 3))
	write("a/a_test.go", "package a\n\n"+body("func TestLong()", 50))
	write("a/testdata/x.go", "package x\n\n"+body("func long()", 50))

	var out bytes.Buffer
	if code := run([]string{"-max", "3", dir}, &out); code != 0 {
		t.Fatalf("exit %d, output %q", code, out.String())
	}

	write("a/b/long.go", "package b\n\n"+body("func long()", 4))
	out.Reset()
	if code := run([]string{"-max", "3", dir}, &out); code != 1 {
		t.Fatalf("exit %d, want 1; output %q", code, out.String())
	}
	want := filepath.Join(dir, "a/b/long.go") + ":3 long: 4 lines (max 3)\n"
	if out.String() != want {
		t.Fatalf("output %q, want %q", out.String(), want)
	}
}

func TestRunErrors(t *testing.T) {
	var out bytes.Buffer
	if code := run(nil, &out); code != 2 {
		t.Fatalf("no directory: exit %d, want 2", code)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "bad.go"), []byte("package p\nfunc {"), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if code := run([]string{dir}, &out); code != 2 || !strings.Contains(out.String(), "bad.go") {
		t.Fatalf("syntax error: exit %d, output %q", code, out.String())
	}
}
