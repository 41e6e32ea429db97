package auth_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/testcerts"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/auth"
)

// whoami is an ImageService that answers with what its handlers see:
// ListImages and PullImage return one image named after the caller's
// principal, its digest describing the rest.
type whoami struct {
	berthv1.UnimplementedImageServiceServer
}

func describe(ctx context.Context) (*berthv1.Image, error) {
	p, ok := auth.FromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "the handler got no principal")
	}
	md, _ := metadata.FromIncomingContext(ctx)
	return &berthv1.Image{Name: p.Name, Digest: fmt.Sprintf("admin=%v via=%s method=%s metadata=%d", p.Admin, p.Via, p.Method, md.Len())}, nil
}

func (whoami) ListImages(ctx context.Context, _ *berthv1.ListImagesRequest) (*berthv1.ListImagesResponse, error) {
	img, err := describe(ctx)
	if err != nil {
		return nil, err
	}
	return &berthv1.ListImagesResponse{Images: []*berthv1.Image{img}}, nil
}

func (whoami) PullImage(_ *berthv1.PullImageRequest, stream berthv1.ImageService_PullImageServer) error {
	img, err := describe(stream.Context())
	if err != nil {
		return err
	}
	return stream.Send(&berthv1.PullImageResponse{Image: img})
}

func (whoami) DeleteImage(context.Context, *berthv1.DeleteImageRequest) (*berthv1.DeleteImageResponse, error) {
	return &berthv1.DeleteImageResponse{}, nil
}

// Tokens of the tests' token file: 64 hex-like characters each.
var (
	aliceToken = strings.Repeat("a1", 32)
	nodeToken  = strings.Repeat("n0", 32)
	adminToken = strings.Repeat("ad", 32)
)

// fixture is an Authenticator serving whoami on a unix socket and on TLS
// TCP, with a token file and a client CA.
type fixture struct {
	dir       string
	authn     *auth.Authenticator
	tokenFile string
	unixAddr  string
	tcpAddr   string
	ca        *testcerts.CA
	caFile    string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{dir: t.TempDir()}
	set, err := testcerts.NewSet(f.dir)
	if err != nil {
		t.Fatal(err)
	}
	f.ca, f.caFile = set.CA, set.CAFile
	f.tokenFile = filepath.Join(f.dir, "tokens")
	f.writeTokens(t, auth.TokenHash(aliceToken)+" alice\n"+auth.TokenHash(nodeToken)+" node-2\n"+auth.TokenHash(adminToken)+" ops\n")
	f.authn, err = auth.New(auth.Config{TokenFile: f.tokenFile, TLSCertFile: set.CertFile, TLSKeyFile: set.KeyFile, ClientCAFile: f.caFile,
		Admins: []string{"ops"}, Nodes: []string{"node-2"}}, nil)
	if err != nil {
		t.Fatalf("auth.New: %v", err)
	}
	srv := grpc.NewServer(grpc.Creds(f.authn.TransportCredentials()),
		grpc.ChainUnaryInterceptor(f.authn.UnaryInterceptors()...), grpc.ChainStreamInterceptor(f.authn.StreamInterceptors()...))
	berthv1.RegisterImageServiceServer(srv, whoami{})
	berthv1.RegisterSandboxServiceServer(srv, sandboxWhoami{})
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	sock := filepath.Join(f.dir, "b.sock")
	ul, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.authn.CheckListen("tcp", tl.Addr().String()); err != nil {
		t.Fatalf("CheckListen(tcp) with TLS: %v", err)
	}
	go srv.Serve(ul)
	go srv.Serve(tl)
	t.Cleanup(srv.Stop)
	f.unixAddr, f.tcpAddr = "unix://"+sock, tl.Addr().String()
	return f
}

func (f *fixture) writeTokens(t *testing.T, content string) {
	t.Helper()
	if err := os.WriteFile(f.tokenFile, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// clientCert returns a TLS configuration trusting the fixture's CA with a
// client certificate of common name cn signed by ca.
func (f *fixture) clientCert(t *testing.T, ca *testcerts.CA, cn string) *tls.Config {
	t.Helper()
	certPEM, keyPEM, err := ca.Client(cn)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, err := testcerts.Write(t.TempDir(), "client", certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := client.TLSConfigFromFiles(f.caFile, certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func (f *fixture) trustOnly(t *testing.T) *tls.Config {
	t.Helper()
	cfg, err := client.TLSConfigFromFiles(f.caFile, "", "")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// whoIs calls ListImages through the real client and returns the image the
// server described, or the error.
func whoIs(t *testing.T, addr string, opts ...client.Option) (*berthv1.Image, error) {
	t.Helper()
	c, err := client.Dial(t.Context(), addr, opts...)
	if err != nil {
		t.Fatalf("Dial(%s): %v", addr, err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	imgs, err := c.ListImages(ctx)
	if err != nil {
		return nil, err
	}
	return imgs[0], nil
}

func reasonOf(err error) (codes.Code, string) {
	var ce *client.Error
	if errors.As(err, &ce) {
		return ce.Code, ce.Reason
	}
	return status.Code(err), rpcstatus.Reason(err)
}

func TestPrincipals(t *testing.T) {
	f := newFixture(t)
	other, err := testcerts.NewCA("another CA")
	if err != nil {
		t.Fatal(err)
	}
	self := auth.UnixPrincipal(uint32(os.Getuid()))
	selfAdmin := os.Getuid() == 0
	for _, tc := range []struct {
		name       string
		addr       string
		opts       []client.Option
		wantName   string
		wantDigest string // admin, via and method as the handler saw them
	}{
		{"unix peer", f.unixAddr, nil, self, fmt.Sprintf("admin=%v via= method=unix metadata=0", selfAdmin)},
		{"unix with token", f.unixAddr, []client.Option{client.WithToken(aliceToken)}, "alice", "admin=false via= method=token metadata=0"},
		{"TLS with token", f.tcpAddr, []client.Option{client.WithTLS(f.trustOnly(t)), client.WithToken(aliceToken)}, "alice", "admin=false via= method=token metadata=0"},
		{"mTLS", f.tcpAddr, []client.Option{client.WithTLS(f.clientCert(t, f.ca, "carol"))}, "carol", "admin=false via= method=tls metadata=0"},
		{"mTLS admin", f.tcpAddr, []client.Option{client.WithTLS(f.clientCert(t, f.ca, "ops"))}, "ops", "admin=true via= method=tls metadata=0"},
		{"token over certificate", f.tcpAddr, []client.Option{client.WithTLS(f.clientCert(t, f.ca, "carol")), client.WithToken(adminToken)}, "ops", "admin=true via= method=token metadata=0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img, err := whoIs(t, tc.addr, tc.opts...)
			if err != nil {
				t.Fatalf("ListImages: %v", err)
			}
			if img.GetName() != tc.wantName || img.GetDigest() != tc.wantDigest {
				t.Errorf("principal %q (%s), want %q (%s)", img.GetName(), img.GetDigest(), tc.wantName, tc.wantDigest)
			}
		})
	}

	for _, tc := range []struct {
		name       string
		addr       string
		opts       []client.Option
		wantCode   codes.Code
		wantReason string
	}{
		{"TLS without credentials", f.tcpAddr, []client.Option{client.WithTLS(f.trustOnly(t))}, codes.Unauthenticated, rpcstatus.ReasonUnauthenticated},
		{"unknown token", f.tcpAddr, []client.Option{client.WithTLS(f.trustOnly(t)), client.WithToken(strings.Repeat("x", 64))}, codes.Unauthenticated, rpcstatus.ReasonUnauthenticated},
		{"short token", f.unixAddr, []client.Option{client.WithToken("secret")}, codes.Unauthenticated, rpcstatus.ReasonUnauthenticated},
		{"wrong token on unix", f.unixAddr, []client.Option{client.WithToken(strings.Repeat("x", 64))}, codes.Unauthenticated, rpcstatus.ReasonUnauthenticated},
		{"forwarding from a non-node", f.unixAddr, []client.Option{client.WithToken(aliceToken),
			client.WithDialOptions(grpc.WithUnaryInterceptor(forwardAs("ops")))}, codes.PermissionDenied, rpcstatus.ReasonNotPermitted},
		// Go's TLS client sends no certificate that berthd's CAs did not
		// sign (they are named in the handshake): no credentials.
		{"certificate of another CA", f.tcpAddr, []client.Option{client.WithTLS(f.clientCert(t, other, "ops"))}, codes.Unauthenticated, rpcstatus.ReasonUnauthenticated},
		// The TLS handshake refuses these: no request is made.
		{"certificate of another CA, forced", f.tcpAddr, []client.Option{client.WithTLS(forceCert(t, f.trustOnly(t), other, "ops"))}, codes.Unavailable, ""},
		{"plaintext on the TLS port", f.tcpAddr, []client.Option{client.WithInsecure(), client.WithToken(aliceToken)}, codes.Unavailable, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img, err := whoIs(t, tc.addr, tc.opts...)
			if code, reason := reasonOf(err); code != tc.wantCode || reason != tc.wantReason {
				t.Errorf("ListImages = %v, %v; want %v %q", img, err, tc.wantCode, tc.wantReason)
			}
		})
	}
}

// forceCert returns cfg presenting a certificate of ca for cn whatever
// CAs the server names.
func forceCert(t *testing.T, cfg *tls.Config, ca *testcerts.CA, cn string) *tls.Config {
	t.Helper()
	certPEM, keyPEM, err := ca.Client(cn)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
	return cfg
}

// forwardAs adds the forwarding header a node sends, and with kv more
// metadata.
func forwardAs(name string, kv ...string) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(metadata.AppendToOutgoingContext(ctx, append([]string{auth.ForwardedHeader, name}, kv...)...), method, req, reply, cc, opts...)
	}
}

// sandboxWhoami is a SandboxService whose GetSandbox answers with what the
// handler sees: the principal's name as the sandbox's id, the rest
// described in its label "who".
type sandboxWhoami struct {
	berthv1.UnimplementedSandboxServiceServer
}

func (sandboxWhoami) GetSandbox(ctx context.Context, _ *berthv1.GetSandboxRequest) (*berthv1.GetSandboxResponse, error) {
	img, err := describe(ctx)
	if err != nil {
		return nil, err
	}
	return &berthv1.GetSandboxResponse{Sandbox: &berthv1.Sandbox{Id: img.GetName(), Labels: map[string]string{"who": img.GetDigest()}}}, nil
}

// TestNodePrincipal checks the least privilege of the node credential
// (issue 22: it could act as any principal, admins included): a node
// principal may only forward routed (sandbox and file) calls, never call
// as itself; the principal it names is an admin only when the node passes
// on that principal's own bearer token, which the receiver checks against
// its token file; root and admins forwarded without a token act as
// non-admins.
func TestNodePrincipal(t *testing.T) {
	f := newFixture(t)
	node := func(kv ...string) []client.Option {
		opts := []client.Option{client.WithTLS(f.trustOnly(t)), client.WithToken(nodeToken)}
		if len(kv) > 0 {
			opts = append(opts, client.WithDialOptions(grpc.WithUnaryInterceptor(forwardAs(kv[0], kv[1:]...))))
		}
		return opts
	}
	getSandbox := func(opts []client.Option) (*berthv1.Sandbox, error) {
		c, err := client.Dial(t.Context(), f.tcpAddr, opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		return c.GetSandbox(ctx, "sb-1")
	}
	tok := auth.ForwardedTokenHeader
	for _, tc := range []struct {
		name, wantName, wantWho string
		opts                    []client.Option
	}{
		{"forwarding a user", "unix:uid:1000", "admin=false via=node-2 method=token metadata=0", node("unix:uid:1000")},
		{"forwarding root", auth.RootPrincipal, "admin=false via=node-2 method=token metadata=0", node(auth.RootPrincipal)},
		{"forwarding an admin without its token", "ops", "admin=false via=node-2 method=token metadata=0", node("ops")},
		{"forwarding an admin with its token", "ops", "admin=true via=node-2 method=token metadata=0", node("ops", tok, adminToken)},
		{"forwarding alice with her token", "alice", "admin=false via=node-2 method=token metadata=0", node("alice", tok, aliceToken)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb, err := getSandbox(tc.opts)
			if err != nil || sb.GetId() != tc.wantName || sb.GetLabels()["who"] != tc.wantWho {
				t.Errorf("GetSandbox = %v (%s), %v; want %s (%s)", sb.GetId(), sb.GetLabels()["who"], err, tc.wantName, tc.wantWho)
			}
		})
	}
	for _, tc := range []struct {
		name       string
		call       func() error
		wantCode   codes.Code
		wantReason string
	}{
		{"a sandbox call as itself", func() error { _, err := getSandbox(node()); return err }, codes.PermissionDenied, rpcstatus.ReasonNotPermitted},
		{"an admin's token for another principal", func() error { _, err := getSandbox(node("ops", tok, aliceToken)); return err }, codes.Unauthenticated, rpcstatus.ReasonUnauthenticated},
		{"an unknown token", func() error { _, err := getSandbox(node("ops", tok, strings.Repeat("x", 64))); return err }, codes.Unauthenticated, rpcstatus.ReasonUnauthenticated},
		{"an image call as itself", func() error { _, err := whoIs(t, f.tcpAddr, node()...); return err }, codes.PermissionDenied, rpcstatus.ReasonNotPermitted},
		{"an admin call forwarding an admin", func() error {
			c, err := client.Dial(t.Context(), f.tcpAddr, node("ops", tok, adminToken)...)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			return c.DeleteImage(t.Context(), "x")
		}, codes.PermissionDenied, rpcstatus.ReasonNotPermitted},
		{"an image call forwarding root", func() error {
			_, err := whoIs(t, f.unixAddr, append(node(auth.RootPrincipal)[1:], client.WithInsecure())...)
			return err
		}, codes.PermissionDenied, rpcstatus.ReasonNotPermitted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if code, reason := reasonOf(tc.call()); code != tc.wantCode || reason != tc.wantReason {
				t.Errorf("node credential: %s = %v %q, want %v %q", tc.name, code, reason, tc.wantCode, tc.wantReason)
			}
		})
	}
}

func TestAdminOnlyAndStreams(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	dial := func(token string) *client.Client {
		c, err := client.Dial(ctx, f.unixAddr, client.WithToken(token))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	alice, ops := dial(aliceToken), dial(adminToken)
	// DeleteImage reaches the handler, which lets a principal delete its
	// own private images only.
	if err := alice.DeleteImage(ctx, "x"); err != nil {
		t.Errorf("DeleteImage by alice = %v, want it passed to the handler", err)
	}
	if _, err := alice.PullImage(ctx, "x"); !isReason(err, codes.PermissionDenied, rpcstatus.ReasonNotPermitted) {
		t.Errorf("PullImage (a stream) by alice = %v, want PERMISSION_DENIED %s", err, rpcstatus.ReasonNotPermitted)
	}
	if err := ops.DeleteImage(ctx, "x"); err != nil {
		t.Errorf("DeleteImage by admin ops: %v", err)
	}
	img, err := ops.PullImage(ctx, "x")
	if err != nil || img.GetName() != "ops" || img.GetDigest() != "admin=true via= method=token metadata=0" {
		t.Errorf("PullImage by ops saw %v (%v); want principal ops, admin, no metadata", img, err)
	}
}

func isReason(err error, code codes.Code, reason string) bool {
	c, r := reasonOf(err)
	return c == code && r == reason
}

// TestMetadataSealed sends metadata berthd must never pass on, the
// containerd client's namespace header and the token among it: handlers,
// unary and streaming, see none.
func TestMetadataSealed(t *testing.T) {
	f := newFixture(t)
	conn, err := grpc.NewClient(f.unixAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+adminToken,
		"containerd-namespace", "default", "containerd-namespace-ttrpc", "default", "x-anything", "1")
	images := berthv1.NewImageServiceClient(conn)
	resp, err := images.ListImages(ctx, &berthv1.ListImagesRequest{})
	if err != nil || resp.GetImages()[0].GetDigest() != "admin=true via= method=token metadata=0" {
		t.Errorf("ListImages with metadata: %v, %v; want the handler to see admin ops and metadata=0", resp, err)
	}
	stream, err := images.PullImage(ctx, &berthv1.PullImageRequest{})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := stream.Recv()
	if err != nil || msg.GetImage().GetDigest() != "admin=true via= method=token metadata=0" {
		t.Errorf("PullImage with metadata: %v, %v; want the handler to see admin ops and metadata=0", msg, err)
	}
}

func TestHealthNeedsNoCredentials(t *testing.T) {
	f := newFixture(t)
	conn, err := grpc.NewClient(f.tcpAddr, grpc.WithTransportCredentials(credentials.NewTLS(f.trustOnly(t))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health Check over TLS without credentials = %v, %v; want SERVING", resp, err)
	}
}

func TestReload(t *testing.T) {
	f := newFixture(t)
	newToken := strings.Repeat("b2", 32)
	f.writeTokens(t, auth.TokenHash(newToken)+" bob\n")
	if err := f.authn.Reload(); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if img, err := whoIs(t, f.unixAddr, client.WithToken(newToken)); err != nil || img.GetName() != "bob" {
		t.Errorf("a token added before Reload: %v, %v; want principal bob", img, err)
	}
	if _, err := whoIs(t, f.unixAddr, client.WithToken(aliceToken)); !isReason(err, codes.Unauthenticated, rpcstatus.ReasonUnauthenticated) {
		t.Errorf("a token removed before Reload: %v, want UNAUTHENTICATED", err)
	}
	// A broken file keeps what was loaded.
	f.writeTokens(t, "sha256:nothex bob\n")
	if err := f.authn.Reload(); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("Reload of a broken file = %v, want an error naming line 1", err)
	}
	if img, err := whoIs(t, f.unixAddr, client.WithToken(newToken)); err != nil || img.GetName() != "bob" {
		t.Errorf("after a failed Reload: %v, %v; want principal bob still", img, err)
	}
}

func TestCheckListen(t *testing.T) {
	plain, err := auth.New(auth.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.CheckListen("unix", "/run/x.sock"); err != nil {
		t.Errorf("CheckListen(unix) = %v, want nil", err)
	}
	if err := plain.CheckListen("tcp", "0.0.0.0:7000"); err == nil || !strings.Contains(err.Error(), "--insecure-tcp") {
		t.Errorf("CheckListen(tcp) without TLS = %v, want a refusal naming --insecure-tcp", err)
	}
	insecureOK, err := auth.New(auth.Config{InsecureTCP: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := insecureOK.CheckListen("tcp", "127.0.0.1:7000"); err != nil {
		t.Errorf("CheckListen(tcp) with InsecureTCP = %v, want nil", err)
	}
	for _, cfg := range []auth.Config{
		{TLSCertFile: "c.crt"},
		{ClientCAFile: "ca.crt"},
		{Admins: []string{"a b"}},
		{TokenFile: "/nonexistent/tokens"},
	} {
		if _, err := auth.New(cfg, nil); err == nil {
			t.Errorf("auth.New(%+v) = nil error, want a refusal", cfg)
		}
	}
}

// TestUnixHostQualifiesUnixPeers checks the principals of unix socket
// peers on a node of a fleet (Config.UnixHost): uid 1000 is
// unix:uid:1000@HOST, root stays RootPrincipal. A copy of the test binary
// runs as uid 1000 and reports what the server saw (helperWhoAmI).
func TestUnixHostQualifiesUnixPeers(t *testing.T) {
	if os.Getenv(whoAmIAddr) != "" {
		helperWhoAmI()
		return
	}
	if os.Getuid() != 0 {
		t.Skip("needs root to run a process as uid 1000")
	}
	dir, err := os.MkdirTemp("", "berth-auth-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	authn, err := auth.New(auth.Config{UnixHost: "n1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(authn.TransportCredentials()),
		grpc.ChainUnaryInterceptor(authn.UnaryInterceptors()...), grpc.ChainStreamInterceptor(authn.StreamInterceptors()...))
	berthv1.RegisterImageServiceServer(srv, whoami{})
	berthv1.RegisterSandboxServiceServer(srv, sandboxWhoami{})
	sock := filepath.Join(dir, "b.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sock, 0o666); err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	t.Cleanup(srv.Stop)

	if img, err := whoIs(t, "unix://"+sock); err != nil || img.GetName() != auth.RootPrincipal {
		t.Errorf("root on a node of a fleet = %v, %v; want %s", img.GetName(), err, auth.RootPrincipal)
	}
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "auth.test")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run", "^TestUnixHostQualifiesUnixPeers$")
	cmd.Env = []string{whoAmIAddr + "=unix://" + sock}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper as uid 1000: %v: %s", err, out)
	}
	if got, want := strings.TrimSpace(strings.Split(string(out), "\n")[0]), "unix:uid:1000@n1"; got != want {
		t.Errorf("uid 1000 on node n1 is principal %q, want %q", got, want)
	}
}

// whoAmIAddr names the server a helper process asks for its principal.
const whoAmIAddr = "BERTH_AUTH_WHOAMI_ADDR"

// helperWhoAmI prints the principal the server at $BERTH_AUTH_WHOAMI_ADDR
// sees for this process, and exits.
func helperWhoAmI() {
	c, err := client.Dial(context.Background(), os.Getenv(whoAmIAddr))
	if err != nil {
		fmt.Println("dial:", err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	images, err := c.ListImages(ctx)
	if err != nil || len(images) != 1 {
		fmt.Println("ListImages:", err)
		os.Exit(1)
	}
	fmt.Println(images[0].GetName())
	os.Exit(0)
}
