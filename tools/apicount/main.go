// Command apicount counts the exported names of the module's public
// packages: every exported top-level function, type, variable and
// constant, and every exported method of an exported type. Fields and
// interface methods are not counted. Packages under internal/, e2e/,
// cmd/, examples/ and tools/ are not public API and are skipped, as are
// test files.
//
//	go run ./tools/apicount [-v] [dir]
//
// It prints the count per package and the total; -v lists the names.
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// skipped are the top-level directories whose packages are not public API.
var skipped = []string{"internal", "e2e", "cmd", "examples", "tools", "testdata"}

func main() {
	verbose := flag.Bool("v", false, "list the names")
	flag.Parse()
	root := "."
	if flag.NArg() > 0 {
		root = flag.Arg(0)
	}
	counts, err := count(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "apicount:", err)
		os.Exit(1)
	}
	pkgs := make([]string, 0, len(counts))
	for p := range counts {
		pkgs = append(pkgs, p)
	}
	slices.Sort(pkgs)
	total := 0
	for _, p := range pkgs {
		names := counts[p]
		slices.Sort(names)
		total += len(names)
		fmt.Printf("%-24s %4d\n", p, len(names))
		if *verbose {
			for _, n := range names {
				fmt.Printf("    %s\n", n)
			}
		}
	}
	fmt.Printf("%-24s %4d\n", "total", total)
}

// count returns the exported names of every public package under root,
// keyed by the package's directory relative to root.
func count(root string) (map[string][]string, error) {
	out := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			first := strings.Split(filepath.ToSlash(rel), "/")[0]
			if rel != "." && (slices.Contains(skipped, first) || strings.HasPrefix(d.Name(), ".") || slices.Contains(skipped, d.Name())) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if f.Name.Name == "main" {
			return nil
		}
		pkg := filepath.ToSlash(filepath.Dir(rel))
		out[pkg] = append(out[pkg], exported(f)...)
		return nil
	})
	return out, err
}

// exported lists the exported names f declares.
func exported(f *ast.File) []string {
	var names []string
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			if d.Recv == nil {
				names = append(names, d.Name.Name)
				continue
			}
			if recv := receiver(d.Recv.List[0].Type); ast.IsExported(recv) {
				names = append(names, recv+"."+d.Name.Name)
			}
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					if s.Name.IsExported() {
						names = append(names, s.Name.Name)
					}
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if n.IsExported() {
							names = append(names, n.Name)
						}
					}
				}
			}
		}
	}
	return names
}

// receiver returns the type name of a method's receiver expression.
func receiver(e ast.Expr) string {
	for {
		switch t := e.(type) {
		case *ast.StarExpr:
			e = t.X
		case *ast.IndexExpr:
			e = t.X
		case *ast.IndexListExpr:
			e = t.X
		case *ast.Ident:
			return t.Name
		default:
			return ""
		}
	}
}
