package server_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/berth-sandbox/berth/"

// The layers of server/, top down: the composition root, the services (one
// per public gRPC service), the error boundary, and the engines. What a
// package may import follows from its layer (see docs/architecture.md).
var (
	root     = "server"
	services = []string{"server/sandboxsvc", "server/execsvc", "server/filesvc", "server/imagesvc"}
	boundary = "server/status"
	// apierr holds the domain errors as plain data: it stands on nothing of
	// server/.
	leaf = "server/apierr"
)

// TestImportRules checks server/'s layering on the real import graph (go
// list, transitive): services never import each other, the composition
// root or the boundary; engines never import a service, the boundary or
// the root; server/apierr imports no server package. A new package under
// server/ is an engine unless listed above.
func TestImportRules(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg, ok := strings.CutPrefix(f[0], module)
		if !ok || (pkg != root && !strings.HasPrefix(pkg, root+"/")) {
			continue
		}
		for _, d := range f[1:] {
			if d, ok := strings.CutPrefix(d, module); ok {
				deps[pkg] = append(deps[pkg], d)
			}
		}
	}
	if len(deps) < 10 {
		t.Fatalf("go list found %d packages under server/: the test reads nothing", len(deps))
	}
	isService := func(p string) bool { return slices.Contains(services, p) }
	under := func(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }
	checked := 0
	for pkg, ds := range deps {
		for _, d := range ds {
			var why string
			switch {
			case pkg == root:
				continue
			case isService(pkg) && isService(d):
				why = "a service imports another service"
			case isService(pkg) && (d == root || d == boundary):
				why = "a service imports the composition root or the error boundary"
			case pkg == leaf && under(d, root):
				why = "server/apierr must stand on no server package"
			case !isService(pkg) && pkg != boundary && (isService(d) || d == boundary || d == root):
				why = "an engine imports a service, the error boundary or the composition root"
			}
			checked++
			if why != "" {
				t.Errorf("%s imports %s: %s", pkg, d, why)
			}
		}
	}
	for _, s := range services {
		if _, ok := deps[s]; !ok {
			t.Errorf("service package %s is missing: update the layers in this test", s)
		}
	}
	t.Logf("%d imports checked in %d packages", checked, len(deps))
}
