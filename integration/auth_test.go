package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/e2e"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/testcerts"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
	"github.com/berth-sandbox/berth/server/auth"
)

// Tokens of the authenticated berthd's token file.
var (
	aliceToken = strings.Repeat("a1", 32)
	bobToken   = strings.Repeat("b2", 32)
	opsToken   = strings.Repeat("0f", 32)
)

// authServer is a berthd with authentication beyond the unix socket's:
// tokens for alice, bob and the admin ops, TLS on TCP with client
// certificates of ca. It runs on the tests' containerd namespace.
type authServer struct {
	unixAddr string // unix://..., mode 0666 in a directory anyone may search
	tcpAddr  string // 127.0.0.1:port, TLS
	certs    *testcerts.Set
	dir      string
}

func startAuthServer(t *testing.T) *authServer {
	t.Helper()
	return startAuthServerWith(t, server.Config{TaskRestartLimit: -1})
}

// startAuthServerWith is startAuthServer with berthd's configuration cfg.
func startAuthServerWith(t *testing.T, cfg server.Config) *authServer {
	t.Helper()
	a := &authServer{dir: t.TempDir()}
	var err error
	if a.certs, err = testcerts.NewSet(a.dir); err != nil {
		t.Fatal(err)
	}
	tokens := filepath.Join(a.dir, "tokens")
	lines := fmt.Sprintf("%s alice\n%s bob\n%s ops\n", auth.TokenHash(aliceToken), auth.TokenHash(bobToken), auth.TokenHash(opsToken))
	if err := os.WriteFile(tokens, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	authn, err := auth.New(auth.Config{TokenFile: tokens, TLSCertFile: a.certs.CertFile, TLSKeyFile: a.certs.KeyFile, ClientCAFile: a.certs.CAFile, Admins: []string{"ops"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("BERTH_TEST_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil)).With("server", t.Name())
	}
	svc := server.New(cfg, env.rt, log)
	srv := server.NewGRPCServer(svc, log, server.WithAuthenticator(authn))
	// A socket others can reach: a directory anyone may search, mode 0666.
	sockDir, err := os.MkdirTemp("/tmp", "bas")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	if err := os.Chmod(sockDir, 0o755); err != nil {
		t.Fatal(err)
	}
	a.unixAddr = "unix://" + filepath.Join(sockDir, "b.sock")
	ul, err := server.Listen(a.unixAddr, server.WithSocketMode(0o666))
	if err != nil {
		t.Fatal(err)
	}
	if err := authn.CheckListen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	tl, err := server.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a.tcpAddr = tl.Addr().String()
	go srv.Serve(ul)
	go srv.Serve(tl)
	t.Cleanup(func() {
		srv.Stop()
		svc.Close()
	})
	return a
}

// clientTLS returns a TLS configuration with a client certificate of cn.
func (a *authServer) clientTLS(t *testing.T, cn string) *tls.Config {
	t.Helper()
	certFile, keyFile, err := a.certs.ClientFiles(cn)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := client.TLSConfigFromFiles(a.certs.CAFile, certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// conn returns a raw gRPC connection to the unix socket with token's
// credentials ("" for none: the test's own uid).
func (a *authServer) conn(t *testing.T, token string) *grpc.ClientConn {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if token != "" {
		opts = append(opts, grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, o ...grpc.CallOption) error {
			return invoker(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token), method, req, reply, cc, o...)
		}), grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, o ...grpc.CallOption) (grpc.ClientStream, error) {
			return streamer(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token), desc, cc, method, o...)
		}))
	}
	conn, err := grpc.NewClient(a.unixAddr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// rpcCase is one RPC naming a sandbox, made on a raw connection so that the
// exact status comes back.
type rpcCase struct {
	name string
	call func(ctx context.Context, conn *grpc.ClientConn, id string) error
}

// everyRPC lists every RPC that names a sandbox, an exec in it or a file
// in it, each trying to read, change or run something in sandbox id.
var everyRPC = []rpcCase{
	{"GetSandbox", func(ctx context.Context, conn *grpc.ClientConn, id string) error {
		_, err := berthv1.NewSandboxServiceClient(conn).GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: id})
		return err
	}},
	{"KeepAlive", func(ctx context.Context, conn *grpc.ClientConn, id string) error {
		_, err := berthv1.NewSandboxServiceClient(conn).KeepAlive(ctx, &berthv1.KeepAliveRequest{SandboxId: id, HoldFor: durationpb.New(time.Hour)})
		return err
	}},
	{"DeleteSandbox", func(ctx context.Context, conn *grpc.ClientConn, id string) error {
		_, err := berthv1.NewSandboxServiceClient(conn).DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: id})
		return err
	}},
	{"Exec start", func(ctx context.Context, conn *grpc.ClientConn, id string) error {
		return execFirst(ctx, conn, startReq(id, "intruder", sh("touch /workspace/pwned")))
	}},
	{"Exec attach", func(ctx context.Context, conn *grpc.ClientConn, id string) error {
		return execFirst(ctx, conn, attachReq(id, "owner-job", 0))
	}},
	{"Run", func(ctx context.Context, conn *grpc.ClientConn, id string) error {
		_, err := berthv1.NewSandboxServiceClient(conn).Run(ctx, &berthv1.RunRequest{SandboxId: id, ExecId: "intruder-run", Process: sh("touch /workspace/pwned")})
		return err
	}},
	{"CreateSession", func(ctx context.Context, conn *grpc.ClientConn, id string) error {
		_, err := berthv1.NewSandboxServiceClient(conn).CreateSession(ctx, &berthv1.CreateSessionRequest{SandboxId: id, SessionId: "bobs"})
		return err
	}},
	{"ListSessions", func(ctx context.Context, conn *grpc.ClientConn, id string) error {
		_, err := berthv1.NewSandboxServiceClient(conn).ListSessions(ctx, &berthv1.ListSessionsRequest{SandboxId: id})
		return err
	}},
	{"DeleteSession", func(ctx context.Context, conn *grpc.ClientConn, id string) error {
		_, err := berthv1.NewSandboxServiceClient(conn).DeleteSession(ctx, &berthv1.DeleteSessionRequest{SandboxId: id, SessionId: "owner-session"})
		return err
	}},
	{"RunInSession", func(ctx context.Context, conn *grpc.ClientConn, id string) error {
		_, err := berthv1.NewSandboxServiceClient(conn).Run(ctx, &berthv1.RunRequest{SandboxId: id, ExecId: "intruder-session", Process: &berthv1.ProcessSpec{SessionId: "owner-session", ShellCommand: "touch /workspace/pwned-session"}})
		return err
	}},
	{"ListExecs", func(ctx context.Context, conn *grpc.ClientConn, id string) error {
		_, err := berthv1.NewSandboxServiceClient(conn).ListExecs(ctx, &berthv1.ListExecsRequest{SandboxId: id})
		return err
	}},
	{"SignalExec", func(ctx context.Context, conn *grpc.ClientConn, id string) error {
		_, err := berthv1.NewSandboxServiceClient(conn).SignalExec(ctx, &berthv1.SignalExecRequest{SandboxId: id, ExecId: "owner-job", Signal: "KILL"})
		return err
	}},
	{"PortForward", func(ctx context.Context, conn *grpc.ClientConn, id string) error {
		stream, err := berthv1.NewSandboxServiceClient(conn).PortForward(ctx)
		if err != nil {
			return err
		}
		stream.Send(&berthv1.PortForwardRequest{Event: &berthv1.PortForwardRequest_Start{Start: &berthv1.PortForwardStart{SandboxId: id, Port: 8080}}})
		stream.Send(&berthv1.PortForwardRequest{Event: &berthv1.PortForwardRequest_Data{Data: []byte("pwned")}})
		stream.CloseSend()
		return drain(stream, nil)
	}},
	{"ReadFile", func(ctx context.Context, conn *grpc.ClientConn, id string) error {
		stream, err := berthv1.NewFileServiceClient(conn).ReadFile(ctx, &berthv1.ReadFileRequest{SandboxId: id, Location: &berthv1.ReadFileRequest_Path{Path: "/workspace/secret"}})
		return drain(stream, err)
	}},
	{"WriteFile", func(ctx context.Context, conn *grpc.ClientConn, id string) error {
		stream, err := berthv1.NewFileServiceClient(conn).WriteFile(ctx)
		if err != nil {
			return err
		}
		stream.Send(&berthv1.WriteFileRequest{Part: &berthv1.WriteFileRequest_Header{Header: &berthv1.WriteFileHeader{SandboxId: id, Location: &berthv1.WriteFileHeader_Path{Path: "/workspace/secret"}}}})
		stream.Send(&berthv1.WriteFileRequest{Part: &berthv1.WriteFileRequest_Chunk{Chunk: []byte("pwned")}})
		_, err = stream.CloseAndRecv()
		return err
	}},
	{"Stat", func(ctx context.Context, conn *grpc.ClientConn, id string) error {
		_, err := berthv1.NewFileServiceClient(conn).Stat(ctx, &berthv1.StatRequest{SandboxId: id, Location: &berthv1.StatRequest_Path{Path: "/workspace/secret"}})
		return err
	}},
	{"ListDir", func(ctx context.Context, conn *grpc.ClientConn, id string) error {
		stream, err := berthv1.NewFileServiceClient(conn).ListDir(ctx, &berthv1.ListDirRequest{SandboxId: id, Location: &berthv1.ListDirRequest_Path{Path: "/workspace"}})
		return drain(stream, err)
	}},
	{"MakeDir", func(ctx context.Context, conn *grpc.ClientConn, id string) error {
		_, err := berthv1.NewFileServiceClient(conn).MakeDir(ctx, &berthv1.MakeDirRequest{SandboxId: id, Location: &berthv1.MakeDirRequest_Path{Path: "/workspace/pwned-dir"}})
		return err
	}},
	{"Remove", func(ctx context.Context, conn *grpc.ClientConn, id string) error {
		_, err := berthv1.NewFileServiceClient(conn).Remove(ctx, &berthv1.RemoveRequest{SandboxId: id, Location: &berthv1.RemoveRequest_Path{Path: "/workspace/secret"}})
		return err
	}},
	{"Rename", func(ctx context.Context, conn *grpc.ClientConn, id string) error {
		_, err := berthv1.NewFileServiceClient(conn).Rename(ctx, &berthv1.RenameRequest{SandboxId: id,
			From: &berthv1.RenameRequest_FromPath{FromPath: "/workspace/secret"}, To: &berthv1.RenameRequest_ToPath{ToPath: "/workspace/taken"}})
		return err
	}},
	{"Upload", func(ctx context.Context, conn *grpc.ClientConn, id string) error {
		stream, err := berthv1.NewFileServiceClient(conn).Upload(ctx)
		if err != nil {
			return err
		}
		stream.Send(&berthv1.UploadRequest{Part: &berthv1.UploadRequest_Header{Header: &berthv1.UploadHeader{SandboxId: id, Location: &berthv1.UploadHeader_Path{Path: "/workspace"}}}})
		stream.Send(&berthv1.UploadRequest{Part: &berthv1.UploadRequest_Chunk{Chunk: oneFileTar("pwned-upload", "pwned")}})
		_, err = stream.CloseAndRecv()
		return err
	}},
	{"Download", func(ctx context.Context, conn *grpc.ClientConn, id string) error {
		stream, err := berthv1.NewFileServiceClient(conn).Download(ctx, &berthv1.DownloadRequest{SandboxId: id, Location: &berthv1.DownloadRequest_Path{Path: "/workspace"}})
		return drain(stream, err)
	}},
}

// execFirst opens an Exec stream with first and returns how it ends.
func execFirst(ctx context.Context, conn *grpc.ClientConn, first *berthv1.ExecRequest) error {
	stream, err := berthv1.NewSandboxServiceClient(conn).Exec(ctx)
	if err != nil {
		return err
	}
	if err := stream.Send(first); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return eofIsNil(err)
		}
		if resp.GetExited() != nil {
			return nil
		}
	}
}

// drain receives from a server stream opened with err until it ends and
// returns how it ended.
func drain[T any](stream interface{ Recv() (T, error) }, err error) error {
	if err != nil {
		return err
	}
	for {
		if _, err := stream.Recv(); err != nil {
			return eofIsNil(err)
		}
	}
}

func eofIsNil(err error) error {
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

func oneFileTar(name, content string) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg})
	tw.Write([]byte(content))
	tw.Close()
	return buf.Bytes()
}

// TestOwnership has bob make every RPC on alice's sandbox: each answers
// exactly as it does once the sandbox is gone (code, message and details),
// and nothing in alice's sandbox changed. ListSandboxes shows bob nothing of
// it; an admin sees and lists everything.
func TestOwnership(t *testing.T) {
	need(t)
	a := startAuthServer(t)
	alice, bob, ops := a.conn(t, aliceToken), a.conn(t, bobToken), a.conn(t, opsToken)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	aliceSvc := berthv1.NewSandboxServiceClient(alice)

	id := shortID("own")
	created, err := aliceSvc.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: id, Image: env.image})
	if err != nil {
		t.Fatalf("alice CreateSandbox: %v", err)
	}
	t.Cleanup(func() {
		aliceSvc.DeleteSandbox(context.Background(), &berthv1.DeleteSandboxRequest{SandboxId: id})
	})
	if got := created.GetSandbox().GetOwner(); got != "alice" {
		t.Errorf("owner of alice's sandbox = %q, want alice", got)
	}
	if _, err := aliceSvc.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: sh("echo -n s3cret > /workspace/secret")}); err != nil {
		t.Fatal(err)
	}
	job := openExec(t, aliceSvc, &berthv1.ExecRequest{Event: &berthv1.ExecRequest_Start{Start: &berthv1.ExecStart{
		SandboxId: id, ExecId: "owner-job", Background: true, Process: sh("nc -l -p 8080 -e touch /workspace/pwned-port & sleep 600")}}}, 0)
	job.wait0()
	if _, err := aliceSvc.CreateSession(ctx, &berthv1.CreateSessionRequest{SandboxId: id, SessionId: "owner-session"}); err != nil {
		t.Fatalf("alice CreateSession: %v", err)
	}

	// Bob, on alice's sandbox.
	foreign := make(map[string]error, len(everyRPC))
	for _, rpc := range everyRPC {
		foreign[rpc.name] = rpc.call(ctx, bob, id)
	}
	// Nothing of it reached the sandbox.
	check := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	got, err := aliceSvc.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: sh("cat /workspace/secret; ls -a /workspace | tr '\\n' ' '")})
	check("alice Run", err)
	if out := string(got.GetStdout()); out != "s3cret. .. secret " {
		t.Errorf("alice's /workspace after bob's requests: %q, want only the untouched secret (%q)", out, "s3cret. .. secret ")
	}
	execs, err := aliceSvc.ListExecs(ctx, &berthv1.ListExecsRequest{SandboxId: id})
	check("alice ListExecs", err)
	for _, e := range execs.GetExecs() {
		if strings.HasPrefix(e.GetExecId(), "intruder") {
			t.Errorf("bob's exec %s ran in alice's sandbox", e.GetExecId())
		}
		if e.GetExecId() == "owner-job" && e.GetState() != berthv1.ExecState_EXEC_STATE_RUNNING {
			t.Errorf("alice's exec after bob's SignalExec: %v, want running", e.GetState())
		}
	}
	sessions, err := aliceSvc.ListSessions(ctx, &berthv1.ListSessionsRequest{SandboxId: id})
	check("alice ListSessions", err)
	if ss := sessions.GetSessions(); len(ss) != 1 || ss[0].GetSessionId() != "owner-session" || ss[0].GetOwner() != "alice" || ss[0].GetCommands() != 0 {
		t.Errorf("alice's sessions after bob's requests: %v, want owner-session of alice, untouched", ss)
	}
	sb, err := aliceSvc.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: id})
	check("alice GetSandbox", err)
	if sb.GetSandbox().GetIdleExpiresAt().AsTime().After(time.Now().Add(45 * time.Minute)) {
		t.Errorf("bob's KeepAlive held alice's sandbox until %v", sb.GetSandbox().GetIdleExpiresAt().AsTime())
	}

	// Bob creating the same id is refused without a word about the sandbox.
	_, err = berthv1.NewSandboxServiceClient(bob).CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: id, Image: env.image})
	wantStatus(t, err, codes.AlreadyExists, rpcstatus.ReasonSandboxExists, "", "sandbox id "+id+" is taken")
	if st := status.Convert(err); strings.Contains(st.Message(), "spec") || strings.Contains(fmt.Sprint(st.Details()), "fields") {
		t.Errorf("bob's CreateSandbox of alice's id tells of the sandbox: %v", st.Proto())
	}

	// Listings.
	listed := func(conn *grpc.ClientConn) bool {
		resp, err := berthv1.NewSandboxServiceClient(conn).ListSandboxes(ctx, &berthv1.ListSandboxesRequest{PageSize: 1000})
		check("ListSandboxes", err)
		for _, s := range resp.GetSandboxes() {
			if s.GetId() == id {
				return true
			}
		}
		return false
	}
	if listed(bob) {
		t.Error("bob's ListSandboxes lists alice's sandbox")
	}
	if !listed(alice) || !listed(ops) {
		t.Errorf("alice's sandbox listed for alice %v, for the admin %v; want both", listed(alice), listed(ops))
	}
	if adminView, err := berthv1.NewSandboxServiceClient(ops).GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: id}); err != nil || adminView.GetSandbox().GetOwner() != "alice" {
		t.Errorf("admin GetSandbox = %v, %v; want the sandbox with owner alice", adminView, err)
	}

	// The same requests once the sandbox is gone answer the same.
	job.cancel()
	if _, err := aliceSvc.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: id}); err != nil {
		t.Fatal(err)
	}
	for _, rpc := range everyRPC {
		missing := rpc.call(ctx, bob, id)
		// protocmp compares the details unpacked: their bytes may differ
		// in map order alone.
		f, m := status.Convert(foreign[rpc.name]).Proto(), status.Convert(missing).Proto()
		if diff := cmp.Diff(m, f, protocmp.Transform()); diff != "" {
			t.Errorf("%s on alice's sandbox differs from a missing sandbox's answer (-missing +alice's):\n%s", rpc.name, diff)
		}
		if rpc.name != "DeleteSandbox" && status.Code(missing) != codes.NotFound {
			t.Errorf("%s on a missing sandbox: %v, want NOT_FOUND", rpc.name, missing)
		}
	}
}

// TestTCPAuthentication: on TCP berthd needs TLS, and a call without
// credentials is UNAUTHENTICATED; a token client and a client certificate
// (made here with crypto/x509) both work, as the same principal when they
// name the same one.
func TestTCPAuthentication(t *testing.T) {
	need(t)
	a := startAuthServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	trust, err := client.TLSConfigFromFiles(a.certs.CAFile, "", "")
	if err != nil {
		t.Fatal(err)
	}

	anon := dialClient(t, a.tcpAddr, client.WithTLS(trust))
	if _, err := anon.GetSandbox(ctx, "any"); !isClientReason(err, codes.Unauthenticated, client.ReasonUnauthenticated) {
		t.Errorf("GetSandbox over TLS without credentials = %v, want UNAUTHENTICATED", err)
	}
	conn, err := grpc.NewClient(a.tcpAddr, grpc.WithTransportCredentials(credentials.NewTLS(trust)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = berthv1.NewSandboxServiceClient(conn).ListSandboxes(ctx, &berthv1.ListSandboxesRequest{})
	wantStatus(t, err, codes.Unauthenticated, rpcstatus.ReasonUnauthenticated, "", "no credentials")
	plain := dialClient(t, a.tcpAddr, client.WithInsecure())
	if _, err := plain.GetSandbox(ctx, "any"); status.Code(err) != codes.Unavailable && !isClientReason(err, codes.Unavailable, "") {
		t.Errorf("plaintext call to the TLS port = %v, want UNAVAILABLE (the handshake fails)", err)
	}

	byToken := dialClient(t, a.tcpAddr, client.WithTLS(trust), client.WithToken(aliceToken))
	sb := createSandbox(t, byToken, nil)
	if sb.GetOwner() != "alice" {
		t.Errorf("owner of the token client's sandbox = %q, want alice", sb.GetOwner())
	}
	mtls := a.clientTLS(t, "alice")
	byCert := dialClient(t, a.tcpAddr, client.WithTLS(mtls))
	res, err := byCert.Run(ctx, sb.GetId(), &berthv1.ProcessSpec{Argv: []string{"echo", "over mTLS"}})
	if err != nil || string(res.GetStdout()) != "over mTLS\n" {
		t.Errorf("Run by alice's certificate in alice's sandbox = %v, %v; want \"over mTLS\\n\"", res, err)
	}
	// A certificate of another name is another principal.
	carolTLS := a.clientTLS(t, "carol")
	carol := dialClient(t, a.tcpAddr, client.WithTLS(carolTLS))
	if _, err := carol.GetSandbox(ctx, sb.GetId()); !isClientReason(err, codes.NotFound, client.ReasonSandboxNotFound) {
		t.Errorf("carol's GetSandbox of alice's sandbox = %v, want NOT_FOUND", err)
	}
	// Image writes are for admins.
	if err := byToken.DeleteImage(ctx, env.image); !isClientReason(err, codes.PermissionDenied, client.ReasonNotPermitted) {
		t.Errorf("alice's DeleteImage = %v, want PERMISSION_DENIED NOT_PERMITTED", err)
	}
}

func isClientReason(err error, code codes.Code, reason string) bool {
	var ce *client.Error
	return errors.As(err, &ce) && ce.Code == code && ce.Reason == reason
}

// TestUnixPeerIsPrincipal runs the berth CLI as uid 1000 on berthd's unix
// socket: it is principal unix:uid:1000, owns what it creates, and sees
// nothing of root's sandboxes; root, an admin, sees its sandbox.
func TestUnixPeerIsPrincipal(t *testing.T) {
	need(t)
	e2e.NeedRoot(t, "running a process as uid 1000")
	a := startAuthServer(t)
	binDir, err := os.MkdirTemp("", "berth-cli-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(binDir) })
	cli := filepath.Join(binDir, "berth")
	bin, err := os.ReadFile(env.cliBinary)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cli, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(binDir, 0o755); err != nil {
		t.Fatal(err)
	}
	asUser := func(args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(cli, append([]string{"--addr", a.unixAddr}, args...)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000}}
		cmd.Env = []string{"PATH=/usr/bin:/bin"}
		cmd.Dir = "/"
		return runCLI(t, cmd, args)
	}

	id := shortID("u1k")
	if out, errOut, code := asUser("sandbox", "create", "--image", env.image, "--id", id); code != 0 || strings.TrimSpace(out) != id {
		t.Fatalf("berth sandbox create as uid 1000 = %q, exit %d (%s)", out, code, errOut)
	}
	root := dialClient(t, a.unixAddr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t.Cleanup(func() { root.DeleteSandbox(context.Background(), id) })
	sb, err := root.GetSandbox(ctx, id)
	if err != nil || sb.GetOwner() != "unix:uid:1000" {
		t.Fatalf("root's GetSandbox of uid 1000's sandbox = %v, %v; want owner unix:uid:1000", sb, err)
	}
	if out, errOut, code := asUser("exec", id, "--", "echo", "mine"); code != 0 || out != "mine\n" {
		t.Errorf("berth exec in its own sandbox as uid 1000 = %q, exit %d (%s)", out, code, errOut)
	}

	rootsID := createSandbox(t, root, nil).GetId()
	if out, errOut, code := asUser("exec", rootsID, "--", "true"); code != 125 || !strings.Contains(errOut, "SANDBOX_NOT_FOUND") {
		t.Errorf("berth exec in root's sandbox as uid 1000 = %q, exit %d (%s); want 125 and SANDBOX_NOT_FOUND", out, code, errOut)
	}
	out, errOut, code := asUser("sandbox", "ls")
	if code != 0 || !strings.Contains(out, id) || strings.Contains(out, rootsID) {
		t.Errorf("berth sandbox ls as uid 1000 = %q, exit %d (%s); want %s listed and not root's %s", out, code, errOut, id, rootsID)
	}
	if _, errOut, code := asUser("image", "rm", env.image); code != 125 || !strings.Contains(errOut, "NOT_PERMITTED") {
		t.Errorf("berth image rm as uid 1000: exit %d (%s); want 125 and NOT_PERMITTED", code, errOut)
	}
}

// TestCallerMetadataNeverReachesContainerd sends the containerd client's
// own namespace headers (and other metadata) with requests: berthd works
// exactly as without them. Before berthd dropped incoming metadata, the
// containerd client took "containerd-namespace" from it and GetSandbox,
// KeepAlive and DeleteSandbox failed INTERNAL "namespace is required".
func TestCallerMetadataNeverReachesContainerd(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, ns := range []string{"default", env.namespace, "", "no-such-namespace"} {
		t.Run("namespace="+ns, func(t *testing.T) {
			md := metadata.AppendToOutgoingContext(ctx, "containerd-namespace", ns, "containerd-namespace-ttrpc", ns, "x-berth-test", "1")
			id := shortID("md")
			resp, err := env.sandboxes.CreateSandbox(md, &berthv1.CreateSandboxRequest{SandboxId: id, Image: env.image})
			if err != nil {
				t.Fatalf("CreateSandbox with caller metadata: %v", err)
			}
			t.Cleanup(func() {
				env.sandboxes.DeleteSandbox(context.Background(), &berthv1.DeleteSandboxRequest{SandboxId: id})
			})
			if resp.GetSandbox().GetOwner() != auth.UnixPrincipal(uint32(os.Getuid())) {
				t.Errorf("owner = %q, want the test's uid", resp.GetSandbox().GetOwner())
			}
			if _, err := env.sandboxes.GetSandbox(md, &berthv1.GetSandboxRequest{SandboxId: id}); err != nil {
				t.Errorf("GetSandbox with caller metadata: %v", err)
			}
			if _, err := env.sandboxes.KeepAlive(md, &berthv1.KeepAliveRequest{SandboxId: id, HoldFor: durationpb.New(time.Minute)}); err != nil {
				t.Errorf("KeepAlive with caller metadata: %v", err)
			}
			if r, err := env.sandboxes.Run(md, &berthv1.RunRequest{SandboxId: id, Process: sh("echo ok")}); err != nil || string(r.GetStdout()) != "ok\n" {
				t.Errorf("Run with caller metadata: %v, %v", r, err)
			}
			if _, err := env.sandboxes.ListSandboxes(md, &berthv1.ListSandboxesRequest{}); err != nil {
				t.Errorf("ListSandboxes with caller metadata: %v", err)
			}
			if _, err := env.images.ListImages(md, &berthv1.ListImagesRequest{}); err != nil {
				t.Errorf("ListImages with caller metadata: %v", err)
			}
			if _, err := env.sandboxes.DeleteSandbox(md, &berthv1.DeleteSandboxRequest{SandboxId: id}); err != nil {
				t.Errorf("DeleteSandbox with caller metadata: %v", err)
			}
			if _, err := env.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: id}); status.Code(err) != codes.NotFound {
				t.Errorf("GetSandbox after DeleteSandbox with caller metadata: %v, want NOT_FOUND (deleted)", err)
			}
		})
	}
}
