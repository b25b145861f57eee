package readmetest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// readme is the file whose Go blocks are compiled, relative to this
// package's directory, which is where go test runs the test.
const readme = "../../README.md"

// block is one fenced ```go block of the README.
type block struct {
	line int // the line of its opening fence, 1-based
	src  string
}

// goBlocks returns every block fenced as ```go in md, in order. A fence
// is a line that starts with three backticks; a block ends at the next
// line that is only a fence.
func goBlocks(md string) ([]block, error) {
	var (
		blocks []block
		cur    *block
		inside bool // inside a fenced block of any language
		body   strings.Builder
	)
	for i, line := range strings.Split(md, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case !inside && strings.HasPrefix(trimmed, "```"):
			inside = true
			if info := strings.TrimSpace(strings.TrimPrefix(trimmed, "```")); info == "go" || strings.HasPrefix(info, "go ") {
				cur = &block{line: i + 1}
				body.Reset()
			}
		case inside && trimmed == "```":
			inside = false
			if cur != nil {
				cur.src = body.String()
				blocks = append(blocks, *cur)
				cur = nil
			}
		case cur != nil:
			body.WriteString(line)
			body.WriteByte('\n')
		}
	}
	if inside {
		return nil, fmt.Errorf("a fenced block is not closed before the end of the file")
	}
	return blocks, nil
}

// goCommand returns the path of the go command on PATH (go test puts its
// own toolchain's bin directory first).
func goCommand(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to compile the README's Go blocks, and it is not on PATH: %v", err)
	}
	return p
}

func TestGoBlocksCompile(t *testing.T) {
	md, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := goBlocks(string(md))
	if err != nil {
		t.Fatalf("%s: %v", readme, err)
	}
	if len(blocks) == 0 {
		t.Fatalf("%s has no ```go block: nothing would be checked", readme)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("the module root %s: %v", root, err)
	}
	goBin := goCommand(t)
	work := t.TempDir()
	for i, b := range blocks {
		name := fmt.Sprintf("block%d", i+1)
		t.Run(fmt.Sprintf("%s_line%d", name, b.line), func(t *testing.T) {
			where := fmt.Sprintf("README.md:%d", b.line)
			f, err := parser.ParseFile(token.NewFileSet(), name+".go", b.src, parser.PackageClauseOnly)
			if err != nil {
				t.Fatalf("%s: every ```go block of the README must be a complete Go file, beginning with its package clause: %v", where, err)
			}
			if formatted, err := format.Source([]byte(b.src)); err != nil {
				t.Fatalf("%s: %v", where, err)
			} else if !bytes.Equal(formatted, []byte(b.src)) {
				t.Errorf("%s: the block is not gofmt-formatted", where)
			}

			// The block becomes the one file of a package that exists
			// only in the overlay, inside the module, so that it
			// imports the module's packages as a user's program does.
			src := filepath.Join(work, name+".go")
			if err := os.WriteFile(src, []byte(b.src), 0o600); err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(root, "internal", "readmetest", "readme-"+name)
			overlay, err := json.Marshal(map[string]map[string]string{
				"Replace": {filepath.Join(dir, "main.go"): src},
			})
			if err != nil {
				t.Fatal(err)
			}
			ovFile := filepath.Join(work, name+".json")
			if err := os.WriteFile(ovFile, overlay, 0o600); err != nil {
				t.Fatal(err)
			}
			args := []string{"build", "-overlay", ovFile}
			if f.Name.Name == "main" {
				args = append(args, "-o", os.DevNull)
			}
			args = append(args, "./"+filepath.ToSlash(mustRel(t, root, dir)))
			cmd := exec.Command(goBin, args...)
			cmd.Dir = root
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Errorf("%s does not compile (go %s):\n%s%v\nthe block, as compiled:\n%s",
					where, strings.Join(args, " "), out, err, numbered(b.src))
			}
		})
	}
}

func mustRel(t *testing.T, base, target string) string {
	t.Helper()
	rel, err := filepath.Rel(base, target)
	if err != nil {
		t.Fatal(err)
	}
	return rel
}

// numbered returns src with each line prefixed by its number, as the
// compiler's positions count them.
func numbered(src string) string {
	var b strings.Builder
	for i, line := range strings.Split(strings.TrimSuffix(src, "\n"), "\n") {
		fmt.Fprintf(&b, "%4d  %s\n", i+1, line)
	}
	return b.String()
}

func TestGoBlocksParser(t *testing.T) {
	md := "text\n```go\npackage a\n```\n\n```\nnot go\n```\n```sh\n```go\n```\n  ```go\npackage b\n\n// x\n  ```\n"
	blocks, err := goBlocks(md)
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) != 2 || blocks[0].src != "package a\n" || blocks[0].line != 2 ||
		blocks[1].src != "package b\n\n// x\n" || blocks[1].line != 12 {
		t.Fatalf("blocks: %+v", blocks)
	}
	if _, err := goBlocks("```go\npackage a\n"); err == nil {
		t.Fatal("an unclosed block accepted")
	}
}
