package integration

import (
	"context"
	"encoding/base64"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// everyCall runs docs/http.md's recipes of "Every other call" (sessions,
// code contexts, file operations, lifecycle, snapshots and images,
// volumes, nodes, PullImage) against the berthd of TestHTTPDocRecipes as
// principal "web" (sandbox sb), and checks what each call answered: its
// values, or the typed error the doc says it gets.
func everyCall(t *testing.T, e *berthEnv, sb string, run func(string) string, want func(string, string, ...string)) {
	t.Helper()
	ok := func(name, out string, calls int) {
		t.Helper()
		if n := strings.Count(out, "HTTP 200"); n != calls {
			t.Errorf("recipe %s: %d calls answered HTTP 200, want %d:\n%s", name, n, calls, out)
		}
	}
	out := run("sessions")
	ok("sessions", out, 5)
	// The second Run prints the directory the first one's cd left.
	want("sessions", out, `"sessionId":"sh-1"`, `"stdout":"`+base64.StdEncoding.EncodeToString([]byte("/tmp\n"))+`"`, `"sessions":[{"sessionId":"sh-1"`)

	out = run("contexts")
	ok("contexts", out, 1) // ListCodeContexts
	want("contexts", out, `"code":"failed_precondition"`, `{"contexts":[]}`)
	// Create fails; a context whose interpreter never started does not
	// exist: ExecuteCode, Interrupt, Restart and Delete are NOT_FOUND.
	var reasons []string
	for _, m := range regexp.MustCompile(`"reason":"(\w+)"`).FindAllStringSubmatch(normJSON(out), -1) {
		reasons = append(reasons, m[1])
	}
	if w := []string{"INTERPRETER_MISSING", "CONTEXT_NOT_FOUND", "CONTEXT_NOT_FOUND", "CONTEXT_NOT_FOUND", "CONTEXT_NOT_FOUND"}; !slices.Equal(reasons, w) {
		t.Errorf("recipe contexts: error reasons %v, want %v:\n%s", reasons, w, out)
	}

	out = run("fileops")
	ok("fileops", out, 4) // MakeDir, Rename, Remove, MakeDir
	want("fileops", out, `"displayPath":"/tmp/ops/a"`, `"execId":"cat-1"`, `"kind":"FILE_EVENT_KIND_CREATE","path":"/tmp/watched/d1"`)
	// ListDir after the rename: b, not a.
	if entries := regexp.MustCompile(`(?m)^\{"entries".*$`).FindString(normJSON(out)); !strings.Contains(entries, `"displayPath":"/tmp/ops/b"`) || strings.Contains(entries, "/tmp/ops/a") {
		t.Errorf("recipe fileops: ListDir of /tmp/ops after the rename: %q, want b alone", entries)
	}
	if _, err := berthv1.NewFileServiceClient(e.conn).Stat(context.Background(), &berthv1.StatRequest{SandboxId: sb, Location: &berthv1.StatRequest_Path{Path: "/tmp/ops"}}); status.Code(err) != codes.NotFound {
		t.Errorf("recipe fileops: Stat of /tmp/ops after Remove: %v, want NOT_FOUND", err)
	}

	out = run("lifecycle")
	ok("lifecycle", out, 5)
	want("lifecycle", out, `"idleExpiresAt":"`, `"state":"SANDBOX_STATE_PAUSED"`, `"state":"SANDBOX_STATE_RUNNING"`,
		`"hibernation":"HIBERNATION_PROCESSES_ENDED"`, `"state":"SANDBOX_STATE_HIBERNATED"`)
	// Woken, the sandbox runs commands again.
	want("run", run("run"), `"stdout":"aGkK"`)

	out = run("snapshots")
	ok("snapshots", out, 8)
	want("snapshots", out, `"sandboxId":"`+sb+`"`, `"labels":{"why":"doc"}`, `"name":"berth.dev/`+sb+`:snap"`, `"layerDigest":"sha256:`)
	snaps, err := e.sandboxes.ListSnapshots(context.Background(), &berthv1.ListSnapshotsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range snaps.GetSnapshots() {
		if s.GetSandboxId() == sb {
			t.Errorf("recipe snapshots: snapshot %s of %s is there after DeleteSnapshot", s.GetId(), sb)
		}
	}
	images, err := e.images.ListImages(context.Background(), &berthv1.ListImagesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range images.GetImages() {
		if i.GetName() == "berth.dev/"+sb+":snap" {
			t.Errorf("recipe snapshots: image %s is there after DeleteImage", i.GetName())
		}
	}
	list, err := e.sandboxes.ListSandboxes(context.Background(), &berthv1.ListSandboxesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(list.GetSandboxes()); n != 1 {
		t.Errorf("recipe snapshots: %d sandboxes after the fork's child was deleted, want 1 (%s)", n, sb)
	}

	out = run("volumes")
	ok("volumes", out, 4)
	want("volumes", out, `"name":"`+sb+`-data"`, `"owner":"web"`, `"quotaBytes":"67108864"`)
	if _, err := e.sandboxes.GetVolume(context.Background(), &berthv1.GetVolumeRequest{Name: sb + "-data"}); status.Code(err) != codes.NotFound {
		t.Errorf("recipe volumes: GetVolume after DeleteVolume: %v, want NOT_FOUND", err)
	}

	out = run("nodes")
	want("nodes", out, `"code":"permission_denied"`, "HTTP 403")
	if n := strings.Count(normJSON(out), `"reason":"NOT_CLUSTERED"`); n != 4 || strings.Count(out, "HTTP 400") != 4 {
		t.Errorf("recipe nodes: want 4 answers 400 NOT_CLUSTERED as root on the socket, got %d:\n%s", n, out)
	}

	want("pull", run("pull"), `"code":"failed_precondition"`, `"reason":"REGISTRY_NOT_ALLOWED"`)
}

// normJSON takes out the spaces protojson puts after some ':' and ',' at
// random (fixed per binary) to keep callers from comparing bytes: the
// checks do not.
func normJSON(s string) string {
	return regexp.MustCompile(`([:,]) +`).ReplaceAllString(s, "$1")
}

// TestHTTPDocCoversEveryRPC fails when a method of a berth.v1 service has
// no recipe in docs/http.md: a "# test:" block (run by TestHTTPDocRecipes)
// that calls it by its path (/berth.v1.Service/Method) or through one of
// the REST routes the doc's tables give it. ImportImage (a client stream)
// and PortForward (a WebSocket for HTTP/1.1 clients) have none, as the
// doc says.
func TestHTTPDocCoversEveryRPC(t *testing.T) {
	doc, err := os.ReadFile("../docs/http.md")
	if err != nil {
		t.Fatal(err)
	}
	var recipes []string
	loop := regexp.MustCompile(`(?s)for m in ([\w ]+); do(.*?)done`)
	for _, m := range regexp.MustCompile("(?s)```sh\n# test: \\w+\n(.*?)```").FindAllStringSubmatch(string(doc), -1) {
		r := strings.ReplaceAll(m[1], "\\\n", " ")
		// A loop over methods calls each: Service/$m becomes Service/Method.
		for _, l := range loop.FindAllStringSubmatch(r, -1) {
			for _, method := range strings.Fields(l[1]) {
				r += "\n" + strings.ReplaceAll(l[2], "$m", method)
			}
		}
		recipes = append(recipes, r)
	}
	routes := docRoutes(string(doc))
	called := func(service, method string) bool {
		// berth.v1.Service/Method, or Service/Method given to the
		// recipes' call and root functions.
		calls := regexp.MustCompile(`\b` + regexp.QuoteMeta(service+"/"+method) + `\b`)
		for _, r := range recipes {
			if calls.MatchString(r) {
				return true
			}
			for _, route := range routes[method] {
				if route.calledIn(r) {
					return true
				}
			}
		}
		return false
	}
	without := []string{"ImportImage", "PortForward"}
	n := 0
	protoregistry.GlobalFiles.RangeFilesByPackage("berth.v1", func(f protoreflect.FileDescriptor) bool {
		for i := range f.Services().Len() {
			s := f.Services().Get(i)
			for j := range s.Methods().Len() {
				m := string(s.Methods().Get(j).Name())
				n++
				if !called(string(s.Name()), m) && !slices.Contains(without, m) {
					t.Errorf("docs/http.md has no recipe calling %s/%s", s.FullName(), m)
				}
			}
		}
		return true
	})
	_ = berthv1.File_berth_v1_sandbox_proto // the registry holds berth.v1
	if n < 50 {
		t.Fatalf("found %d berth.v1 methods, want the protos' 50 and more", n)
	}
}

// docRoute is a REST route of a docs/http.md table: its verb and its path
// with {variables}.
type docRoute struct{ verb, path string }

// docRoutes returns the REST routes of docs/http.md's tables ("|
// `VERB /v1/...` | `Call` ..."), by the call's method name.
func docRoutes(doc string) map[string][]docRoute {
	out := map[string][]docRoute{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(GET|POST|PUT|DELETE) (/v1/[^` ?]*)[^`]*` \\| `(?:FileService\\.)?(\\w+)`").FindAllStringSubmatch(doc, -1) {
		out[m[3]] = append(out[m[3]], docRoute{m[1], m[2]})
	}
	return out
}

// calledIn reports whether a curl command of recipe requests the route:
// its URL matches the path ({variables} any segment) and its verb is the
// route's (-X, else PUT for -T, POST for -d, GET).
func (r docRoute) calledIn(recipe string) bool {
	path := regexp.MustCompile(`\\\{\w+\\\}`).ReplaceAllString(regexp.QuoteMeta(r.path), `[^/?"]+`)
	url := regexp.MustCompile(`\$BERTH_URL` + path + `(\?|")`)
	for _, c := range strings.Split(recipe, "curl ")[1:] {
		c, _, _ = strings.Cut(c, "\n")
		if !url.MatchString(c) {
			continue
		}
		verb := "GET"
		switch {
		case regexp.MustCompile(`-X (\w+)`).MatchString(c):
			verb = regexp.MustCompile(`-X (\w+)`).FindStringSubmatch(c)[1]
		case strings.Contains(c, " -T "):
			verb = "PUT"
		case strings.Contains(c, " -d "):
			verb = "POST"
		}
		if verb == r.verb {
			return true
		}
	}
	return false
}
