package main

// The reference pages that drift when the code changes are checked against
// it here: every flag berthd defines has a row in docs/configuration.md,
// every error reason has a row in docs/errors.md, and README.md stays a
// short front door. Plain go test: no root, no containerd.

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const (
	configurationDoc = "../../docs/configuration.md"
	errorsDoc        = "../../docs/errors.md"
	readme           = "../../README.md"
	errorsProto      = "../../proto/berth/v1/errors.proto"
	rpcstatusDir     = "../../internal/rpcstatus"

	// readmeMaxBytes is issue 20's bound on the front door: 15 KiB.
	readmeMaxBytes = 15 << 10
)

// flagNameArg maps the flag package's defining functions (and a FlagSet's
// methods of the same names) to the index of their name argument and their
// number of arguments.
var flagNameArg = map[string]struct{ index, args int }{
	"Bool":        {0, 3},
	"BoolFunc":    {0, 3},
	"BoolVar":     {1, 4},
	"Duration":    {0, 3},
	"DurationVar": {1, 4},
	"Float64":     {0, 3},
	"Float64Var":  {1, 4},
	"Func":        {0, 3},
	"Int":         {0, 3},
	"Int64":       {0, 3},
	"Int64Var":    {1, 4},
	"IntVar":      {1, 4},
	"String":      {0, 3},
	"StringVar":   {1, 4},
	"TextVar":     {1, 4},
	"Uint":        {0, 3},
	"Uint64":      {0, 3},
	"Uint64Var":   {1, 4},
	"UintVar":     {1, 4},
	"Var":         {1, 3},
}

// definedFlags returns the names of the flags berthd's non-test sources in
// dir define, read from the calls that define them (flag.StringVar(&v,
// "name", ...), flag.Func("name", ...) and the like). A defining call whose
// name is not a string literal fails the test: its flag could not be checked.
func definedFlags(t *testing.T, dir string) []string {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			arg, ok := flagNameArg[sel.Sel.Name]
			if !ok || len(call.Args) != arg.args {
				return true
			}
			lit, ok := call.Args[arg.index].(*ast.BasicLit)
			literal := ok && lit.Kind == token.STRING
			if x, ok := sel.X.(*ast.Ident); (!ok || x.Name != "flag") && !literal {
				return true // not package flag's: a FlagSet's only with a literal name
			}
			if !literal {
				t.Errorf("%s: flag.%s defines a flag whose name is not a string literal; this test cannot check it", fset.Position(call.Pos()), sel.Sel.Name)
				return true
			}
			name, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Fatal(err)
			}
			names = append(names, name)
			return true
		})
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// firstCells returns the first cell of every row of the Markdown tables in
// the file at path, header and separator rows left out.
func firstCells(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cells []string
	inTable := false
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") {
			inTable = false
			continue
		}
		cell, _, _ := strings.Cut(line[1:], "|")
		if !inTable { // the header row
			inTable = true
			continue
		}
		if strings.Trim(cell, "-: ") == "" { // the separator row
			continue
		}
		cells = append(cells, cell)
	}
	return cells
}

var flagInDoc = regexp.MustCompile("`--([a-z0-9][a-z0-9-]*)")

func TestConfigurationDocumentsEveryFlag(t *testing.T) {
	defined := definedFlags(t, ".")
	// The parse must have found main's and clusterFlags' definitions; a
	// change in how berthd defines flags must not pass unnoticed.
	for _, want := range []string{"containerd-address", "listen", "etcd-endpoints", "version"} {
		if !slices.Contains(defined, want) {
			t.Fatalf("definedFlags(cmd/berthd) = %v, want it to hold %q", defined, want)
		}
	}
	documented := namedInFirstCells(t, configurationDoc, flagInDoc)
	for _, name := range defined {
		if !documented[name] {
			t.Errorf("berthd defines --%s, but no table row of docs/configuration.md names it in its first cell", name)
		}
	}
	for name := range documented {
		if !slices.Contains(defined, name) {
			t.Errorf("docs/configuration.md has a row for --%s, which berthd does not define", name)
		}
	}
}

// protoReasons returns the reasons errors.proto's comments name: the rows
// of the reason/code/detail table at the top of the file, and every
// "reason NAME" in a comment.
func protoReasons(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(errorsProto)
	if err != nil {
		t.Fatal(err)
	}
	header := regexp.MustCompile(`^//\s+reason\s+code\s+detail\s*$`)
	row := regexp.MustCompile(`^//\s+([A-Z][A-Z0-9_]+)\s+[A-Z_]+`)
	named := regexp.MustCompile(`\breason ([A-Z][A-Z0-9_]+)`)
	var reasons []string
	inTable, rows := false, 0
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		switch {
		case header.MatchString(line):
			inTable = true
			continue
		case inTable && row.MatchString(line):
			reasons = append(reasons, row.FindStringSubmatch(line)[1])
			rows++
			continue
		}
		inTable = false
		if strings.HasPrefix(line, "//") {
			for _, m := range named.FindAllStringSubmatch(line, -1) {
				reasons = append(reasons, m[1])
			}
		}
	}
	if rows < 7 {
		t.Fatalf("%s: found %d rows in the reason/code/detail comment table, want at least 7: has its form changed?", errorsProto, rows)
	}
	slices.Sort(reasons)
	return slices.Compact(reasons)
}

// rpcstatusReasons returns the values of the Reason... constants of
// internal/rpcstatus.
func rpcstatusReasons(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(rpcstatusDir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var reasons []string
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			gen, ok := decl.(*ast.GenDecl)
			if !ok || gen.Tok != token.CONST {
				continue
			}
			for _, spec := range gen.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if !strings.HasPrefix(name.Name, "Reason") || i >= len(vs.Values) {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						t.Errorf("%s: %s is not a string literal; this test cannot check it", fset.Position(name.Pos()), name.Name)
						continue
					}
					v, err := strconv.Unquote(lit.Value)
					if err != nil {
						t.Fatal(err)
					}
					reasons = append(reasons, v)
				}
			}
		}
	}
	if !slices.Contains(reasons, "FLEET_BUSY") || !slices.Contains(reasons, "FILE_NOT_FOUND") {
		t.Fatalf("rpcstatusReasons() = %v, want FLEET_BUSY and FILE_NOT_FOUND among them", reasons)
	}
	slices.Sort(reasons)
	return slices.Compact(reasons)
}

var reasonInDoc = regexp.MustCompile("`([A-Z][A-Z0-9_]+)`")

func TestErrorsDocumentEveryReason(t *testing.T) {
	fromProto, fromCode := protoReasons(t), rpcstatusReasons(t)
	documented := namedInFirstCells(t, errorsDoc, reasonInDoc)
	for _, r := range fromProto {
		if !documented[r] {
			t.Errorf("proto/berth/v1/errors.proto names reason %s, but no table row of docs/errors.md names it in its first cell", r)
		}
	}
	for _, r := range fromCode {
		if !documented[r] {
			t.Errorf("internal/rpcstatus defines reason %s, but no table row of docs/errors.md names it in its first cell", r)
		}
	}
	for r := range documented {
		if !slices.Contains(fromCode, r) {
			t.Errorf("docs/errors.md has a row for reason %s, which internal/rpcstatus does not define", r)
		}
	}
}

func TestREADMEIsShort(t *testing.T) {
	st, err := os.Stat(readme)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() > readmeMaxBytes {
		t.Errorf("README.md is %d bytes, want at most %d: move reference text to docs/", st.Size(), readmeMaxBytes)
	}
}

// namedInFirstCells returns the first submatch of re in every first cell
// of a table row of the markdown file doc.
func namedInFirstCells(t *testing.T, doc string, re *regexp.Regexp) map[string]bool {
	t.Helper()
	named := map[string]bool{}
	for _, cell := range firstCells(t, doc) {
		for _, m := range re.FindAllStringSubmatch(cell, -1) {
			named[m[1]] = true
		}
	}
	return named
}
