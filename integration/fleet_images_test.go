package integration

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"

	"github.com/berth-sandbox/berth/client"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/cluster"
	"github.com/berth-sandbox/berth/server/runtime"
)

// TestFleetImages imports an image through one node of a two-node fleet
// and creates a sandbox of it on the other (issue 22 part 6: images were
// per node, imported by hand on each). The import goes to every live node
// and says what each made of it; a node it could not reach as an admin
// is named, and holds no image.
func TestFleetImages(t *testing.T) {
	need(t)
	f := startFleetWith(t, []int{5, 5}, true, "", false)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	onN2 := &berthv1.CreateSandboxRequest{SandboxId: "fi-n2", Image: env.image, Labels: map[string]string{cluster.NodeSelectorPrefix + "id": "n2"}}
	if _, err := f.alice[0].CreateSandbox(ctx, onN2); fleetReason(err) != client.ReasonImageNotFound {
		t.Fatalf("create on n2 before any import = %v, want IMAGE_NOT_FOUND", err)
	}

	// As the admin ops (a bearer token) through n1: both nodes get it.
	fh, err := os.Open(env.archive)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	var nodes []*berthv1.ImageNodeResult
	imgs, err := f.ops.ImportImage(ctx, fh, "", client.WithImportNodes(func(r []*berthv1.ImageNodeResult) { nodes = r }))
	if err != nil || len(imgs) == 0 || imgs[0].GetName() != env.image {
		t.Fatalf("import through n1 = %v, %v; want %s", imgs, err, env.image)
	}
	if len(nodes) != 2 || nodes[0].GetNodeId() != "n1" || !nodes[0].GetOk() || nodes[1].GetNodeId() != "n2" || !nodes[1].GetOk() {
		t.Fatalf("import through n1: node results %v, want n1 and n2 ok", nodes)
	}
	// At once (no wait): placed on n2, reached through n1.
	sb, err := f.alice[0].CreateSandbox(ctx, onN2)
	if err != nil || sb.GetNodeId() != "n2" {
		t.Fatalf("create on n2 through n1 right after the import = %v, %v; want a sandbox on n2", sb, err)
	}
	if res, err := f.alice[0].Run(ctx, sb.GetId(), &berthv1.ProcessSpec{Argv: []string{"echo", "on n2"}}); err != nil || string(res.GetStdout()) != "on n2\n" {
		t.Errorf("Run through n1 in the sandbox on n2 = %v, %v", res, err)
	}
	if got, err := f.node("n2").rt.ListImages(ctx); err != nil || !slices.ContainsFunc(got, func(im runtime.Image) bool { return im.Name == env.image }) {
		t.Errorf("containerd of n2 holds %v (%v); want %s", got, err, env.image)
	}
	// ListImages through a node names the nodes holding each image.
	list, err := f.alice[1].ListImages(ctx)
	if err != nil || len(list) != 1 || list[0].GetName() != env.image || list[0].GetDigest() == "" || !slices.Equal(list[0].GetNodeIds(), []string{"n1", "n2"}) {
		t.Errorf("ListImages through n2 = %v, %v; want %s held by n1 and n2", list, err, env.image)
	}

	// Root on n1's socket is an admin on n1 only: n1 imports, n2 refuses
	// (PERMISSION_DENIED) and is named.
	c, err := client.Dial(ctx, "unix://"+f.nodes[0].sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := fh.Seek(0, 0); err != nil {
		t.Fatal(err)
	}
	nodes = nil
	if _, err := c.ImportImage(ctx, fh, "berth.dev/fleet-images:root", client.WithImportNodes(func(r []*berthv1.ImageNodeResult) { nodes = r })); err != nil {
		t.Fatalf("import as root on n1: %v", err)
	}
	if len(nodes) != 2 || !nodes[0].GetOk() || nodes[1].GetOk() || nodes[1].GetNodeId() != "n2" || nodes[1].GetErrorCode() != "PERMISSION_DENIED" || nodes[1].GetErrorReason() != client.ReasonNotPermitted {
		t.Errorf("import as root on n1: node results %v, want n1 ok and n2 PERMISSION_DENIED %s", nodes, client.ReasonNotPermitted)
	}
	pinned := &berthv1.CreateSandboxRequest{SandboxId: "fi-root", Image: "berth.dev/fleet-images:root", Labels: onN2.Labels}
	if _, err := f.alice[0].CreateSandbox(ctx, pinned); fleetReason(err) != client.ReasonImageNotFound {
		t.Errorf("create of the image n2 did not get, on n2 = %v, want IMAGE_NOT_FOUND", err)
	}

	// A private image on n2 (one committed by bob before n2 joined: a
	// fleet refuses commits) stays off n2's record, so ListImages through
	// n1 does not name it to alice. A shared image made at the same time
	// shows when n2's record has been published.
	cc, err := containerd.New(f.node("n2").containerd, containerd.WithDefaultNamespace(f.node("n2").ns))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	base, err := cc.ImageService().Get(ctx, env.image)
	if err != nil {
		t.Fatal(err)
	}
	for name, labels := range map[string]map[string]string{
		"berth.test/bob-private:1":  {runtime.LabelPrefix + "image.private-to": "bob"},
		"berth.test/shared-probe:1": nil,
	} {
		if _, err := cc.ImageService().Create(ctx, images.Image{Name: name, Target: base.Target, Labels: labels}); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		list, err := f.alice[0].ListImages(ctx)
		if err != nil {
			t.Fatal(err)
		}
		names := make([]string, 0, len(list))
		for _, im := range list {
			names = append(names, im.GetName())
		}
		if slices.Contains(names, "berth.test/bob-private:1") {
			t.Fatalf("ListImages through n1 names bob's private image on n2 to alice: %v", names)
		}
		if slices.Contains(names, "berth.test/shared-probe:1") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("n2's record never named berth.test/shared-probe:1: %v", names)
		}
	}
}
