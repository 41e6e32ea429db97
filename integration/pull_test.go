package integration

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// registry is a read-only OCI distribution registry on 127.0.0.1 serving
// one repository from an OCI image layout archive (distribution-spec
// "pull" endpoints only).
type registry struct {
	repo     string
	tag      string
	manifest ocidesc // the tag's descriptor, from index.json
	blobs    map[string][]byte
	requests int
}

type ocidesc struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
}

// serveRegistry serves archive's first image as repo:tag and returns the
// registry's host:port.
func serveRegistry(t *testing.T, archive, repo, tag string) (string, *registry) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	reg := &registry{repo: repo, tag: tag, blobs: map[string][]byte{}}
	tr := tar.NewReader(f)
	var index struct{ Manifests []ocidesc }
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case h.Name == "index.json":
			if err := json.Unmarshal(b, &index); err != nil {
				t.Fatal(err)
			}
		case strings.HasPrefix(h.Name, "blobs/sha256/") && h.Typeflag == tar.TypeReg:
			reg.blobs["sha256:"+strings.TrimPrefix(h.Name, "blobs/sha256/")] = b
		}
	}
	if len(index.Manifests) == 0 {
		t.Fatalf("%s: index.json lists no manifest", archive)
	}
	reg.manifest = index.Manifests[0]

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: reg}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String(), reg
}

func (reg *registry) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	reg.requests++
	if r.URL.Path == "/v2/" {
		w.WriteHeader(http.StatusOK)
		return
	}
	prefix := "/v2/" + reg.repo + "/"
	rest, ok := strings.CutPrefix(r.URL.Path, prefix)
	if !ok {
		http.NotFound(w, r)
		return
	}
	var (
		digest    string
		mediaType = "application/octet-stream"
	)
	switch {
	case rest == "manifests/"+reg.tag || rest == "manifests/"+reg.manifest.Digest:
		digest, mediaType = reg.manifest.Digest, reg.manifest.MediaType
	case strings.HasPrefix(rest, "blobs/"):
		digest = strings.TrimPrefix(rest, "blobs/")
	default:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}`)
		return
	}
	b, ok := reg.blobs[digest]
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", mediaType)
	w.Header().Set("Docker-Content-Digest", digest)
	w.Header().Set("Content-Length", fmt.Sprint(len(b)))
	if r.Method == http.MethodHead {
		return
	}
	w.Write(b)
}

// TestPullImage pulls the base image from a registry on localhost, which
// berthd reaches only when its operator names it (--pull-registry), with
// progress, creates a sandbox from it, and checks that pulls from an
// unreachable registry fail fast with UNAVAILABLE and from a missing
// repository with NOT_FOUND.
func TestPullImage(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	host, _ := serveRegistry(t, archivePath(), "berth/pulled", "v1")
	ref := host + "/berth/pulled:v1"
	conn, err := grpc.NewClient(startServer(t, server.Config{PullRegistries: []string{host, "127.0.0.1:1", "*"}, TaskRestartLimit: -1}),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	images := berthv1.NewImageServiceClient(conn)
	stream, err := images.PullImage(ctx, &berthv1.PullImageRequest{Reference: ref})
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := recvAll(stream.Recv)
	if err != nil {
		t.Fatalf("PullImage(%s): %v", ref, err)
	}
	last := msgs[len(msgs)-1]
	if last.GetImage().GetName() != ref || !strings.HasPrefix(last.GetImage().GetDigest(), "sha256:") {
		t.Fatalf("PullImage(%s) last message = %v, want the image %s", ref, last, ref)
	}
	var progress *berthv1.PullImageResponse
	for _, m := range msgs {
		if len(m.GetLayers()) > 0 {
			progress = m
		}
	}
	// manifest, config and one layer, all done.
	if progress == nil || len(progress.GetLayers()) != 3 || progress.GetDownloadedBytes() != progress.GetTotalBytes() || progress.GetTotalBytes() == 0 {
		t.Errorf("last progress = %v, want 3 blobs fully downloaded", progress)
	}
	t.Cleanup(func() { env.images.DeleteImage(context.Background(), &berthv1.DeleteImageRequest{Name: ref}) })
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{Image: ref})
	if got := run(t, sb.GetId(), "echo", "pulled"); string(got.GetStdout()) != "pulled\n" {
		t.Errorf("echo in a sandbox of the pulled image: %q %q", got.GetStdout(), got.GetStderr())
	}

	for _, tc := range []struct {
		ref        string
		code       codes.Code
		reason     string
		within     time.Duration
		msgContain string
	}{
		// .invalid never resolves (RFC 6761); nothing listens on port 1.
		{"registry.invalid/team/tool:v1", codes.Unavailable, rpcstatus.ReasonRegistry, 15 * time.Second, "registry.invalid"},
		{"127.0.0.1:1/team/tool:v1", codes.Unavailable, rpcstatus.ReasonRegistry, 15 * time.Second, "127.0.0.1:1"},
		{host + "/berth/missing:v1", codes.NotFound, rpcstatus.ReasonImageNotFound, 15 * time.Second, "missing"},
		{"not a reference", codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, time.Second, "reference"},
	} {
		start := time.Now()
		stream, err := images.PullImage(ctx, &berthv1.PullImageRequest{Reference: tc.ref})
		if err == nil {
			_, err = recvAll(stream.Recv)
		}
		took := time.Since(start)
		if status.Code(err) != tc.code || rpcstatus.Reason(err) != tc.reason || took > tc.within || !strings.Contains(status.Convert(err).Message(), tc.msgContain) {
			t.Errorf("PullImage(%s) = %v (reason %s) after %v; want %v %s within %v, naming %q", tc.ref, err, rpcstatus.Reason(err), took, tc.code, tc.reason, tc.within, tc.msgContain)
		}
	}
}

// TestPullRegistryNotAllowed: by default berthd pulls from no registry on
// its own host — a caller could otherwise make it send requests to any
// local port — and one not on its list when it has one: FAILED_PRECONDITION
// REGISTRY_NOT_ALLOWED naming the registry, with nothing sent to it.
func TestPullRegistryNotAllowed(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	host, reg := serveRegistry(t, archivePath(), "berth/pulled", "v1")
	_, port, _ := net.SplitHostPort(host)
	listed, err := grpc.NewClient(startServer(t, server.Config{PullRegistries: []string{"registry.example.com"}, TaskRestartLimit: -1}),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer listed.Close()
	plain, err := grpc.NewClient(startServer(t, server.Config{TaskRestartLimit: -1}), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	byDefault := berthv1.NewImageServiceClient(plain)
	for _, tc := range []struct {
		images berthv1.ImageServiceClient
		ref    string
	}{
		{byDefault, host + "/berth/pulled:v1"},
		{byDefault, "localhost:" + port + "/berth/pulled:v1"},
		{byDefault, "[::1]:" + port + "/berth/pulled:v1"},
		{berthv1.NewImageServiceClient(listed), host + "/berth/pulled:v1"},
		{berthv1.NewImageServiceClient(listed), "docker.io/library/busybox:latest"},
	} {
		stream, err := tc.images.PullImage(ctx, &berthv1.PullImageRequest{Reference: tc.ref})
		if err == nil {
			_, err = recvAll(stream.Recv)
		}
		wantStatus(t, err, codes.FailedPrecondition, rpcstatus.ReasonRegistryNotAllowed, "", "not")
	}
	if reg.requests != 0 {
		t.Errorf("the registry on localhost got %d requests from pulls berthd may not make", reg.requests)
	}
}
