package auth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	grpcauth "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/berth-sandbox/berth/internal/resume"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// ForwardedHeader is the metadata key in which a node principal names the
// principal it acts for. berthd honors it only from Config.Nodes and
// refuses it (PERMISSION_DENIED) from anyone else.
const ForwardedHeader = "berth-forwarded-principal"

// ForwardedTokenHeader is the metadata key in which a node forwarding an
// admin's call passes on the bearer token the admin authenticated with
// (Principal.ForwardingMD). A forwarded principal is an admin on the
// receiving berthd only when this token is in the receiver's own token file
// under that principal's name, and the principal is an admin there: the
// node credential alone, which every node holds, cannot act as an admin.
const ForwardedTokenHeader = "berth-forwarded-token"

// ForwardedServices are the services whose calls a node principal may
// forward (and the only ones it may call): those naming a sandbox, which
// a node routes to the node holding it (server/cluster's Router). A node
// principal calling any other service, or calling without naming the
// principal it acts for, is refused PERMISSION_DENIED.
var ForwardedServices = map[string]bool{
	berthv1.SandboxService_ServiceDesc.ServiceName: true,
	berthv1.FileService_ServiceDesc.ServiceName:    true,
}

// ForwardedImageMethods are the image calls a node principal may forward
// too: a fleet's import or pull goes to every node (server/cluster's
// Router). They are AdminOnly, so the node credential alone still cannot
// change an image store: the principal it names must be an admin with
// its own token (ForwardedTokenHeader).
var ForwardedImageMethods = map[string]bool{
	berthv1.ImageService_ImportImage_FullMethodName: true,
	berthv1.ImageService_PullImage_FullMethodName:   true,
}

// AdminOnly are the methods only admins may call (PERMISSION_DENIED for
// others). Images are one store that every principal's sandboxes are
// created from: an import under an existing name replaces what everyone's
// next sandbox runs, and a delete breaks their creates. Every principal may
// list images and create sandboxes from any shared image; an image that a
// principal that is not an admin commits (CommitSnapshot) is private to
// it, and it may delete that one (imagesvc and sandboxsvc check).
var AdminOnly = map[string]bool{
	berthv1.ImageService_ImportImage_FullMethodName: true,
	berthv1.ImageService_PullImage_FullMethodName:   true,
	// The fleet's nodes: their addresses, capacity and drain marks.
	berthv1.NodeService_ListNodes_FullMethodName:   true,
	berthv1.NodeService_DrainNode_FullMethodName:   true,
	berthv1.NodeService_UndrainNode_FullMethodName: true,
	berthv1.NodeService_RemoveNode_FullMethodName:  true,
}

// Config configures an Authenticator. The zero Config authenticates unix
// socket peers only and refuses TCP.
type Config struct {
	// TokenFile is the path of the bearer token file ("" for none): lines
	// of "sha256:<hex of SHA-256(token)> <principal>" (see loadTokens),
	// read at New and at each Reload.
	TokenFile string
	// TLSCertFile and TLSKeyFile are the PEM certificate (chain) and key
	// berthd serves TCP with; both or neither. Re-read at Reload.
	TLSCertFile, TLSKeyFile string
	// ClientCAFile is a PEM bundle of the CAs whose client certificates
	// authenticate callers on TCP (mTLS), the certificate's subject common
	// name being the principal; "" accepts no client certificates. A
	// client certificate is optional (a token will do) but must verify
	// when given. Re-read at Reload; needs TLSCertFile.
	ClientCAFile string
	// InsecureTCP lets TCP connections in without TLS. Tokens then travel
	// in plaintext; for a TLS-terminating proxy in front of berthd only.
	InsecureTCP bool
	// Admins are principals that see and act on every sandbox and may
	// change the image store, beyond RootPrincipal.
	Admins []string
	// Nodes are principals (other berthd nodes) that may act on behalf of
	// another principal by naming it in ForwardedHeader, for the services
	// of ForwardedServices only, and never as themselves.
	Nodes []string
	// UnixHost, when set (a node of a fleet sets its node id), qualifies
	// the principals of unix socket peers other than root with it:
	// "unix:uid:1000@node-a". A uid names a user of one host only, so the
	// sandboxes uid 1000 creates through node-a are not those of uid 1000
	// on node-b. Root stays RootPrincipal, an admin on its own node; its
	// calls forwarded to other nodes are not an admin's there (see
	// ForwardedTokenHeader).
	UnixHost string
}

// Authenticator authenticates berthd's callers; see the package comment.
// Its methods are safe for concurrent use.
type Authenticator struct {
	cfg    Config
	log    *slog.Logger
	admins map[string]bool
	nodes  map[string]bool

	tokens atomic.Pointer[tokenSet]
	tls    atomic.Pointer[tls.Config] // nil without TLS
}

// New returns an Authenticator for cfg after loading its token file and TLS
// material (see Reload). It fails on an invalid admin or node name, TLS
// settings that do not go together, or files that do not load.
func New(cfg Config, log *slog.Logger) (*Authenticator, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &Authenticator{cfg: cfg, log: log, admins: make(map[string]bool), nodes: make(map[string]bool)}
	for _, n := range cfg.Admins {
		if err := ValidName(n, true); err != nil {
			return nil, fmt.Errorf("admin: %w", err)
		}
		a.admins[n] = true
	}
	for _, n := range cfg.Nodes {
		if err := ValidName(n, true); err != nil {
			return nil, fmt.Errorf("node principal: %w", err)
		}
		a.nodes[n] = true
	}
	if (cfg.TLSCertFile == "") != (cfg.TLSKeyFile == "") {
		return nil, errors.New("TLS needs both a certificate and a key file")
	}
	if cfg.ClientCAFile != "" && cfg.TLSCertFile == "" {
		return nil, errors.New("client certificates (mTLS) need TLS: give a certificate and a key file too")
	}
	if err := a.Reload(); err != nil {
		return nil, err
	}
	return a, nil
}

// Reload re-reads the token file, the certificate and key, and the client
// CAs. New connections and requests use what it loaded; connections already
// made keep their TLS session. On any error it keeps everything as it was.
func (a *Authenticator) Reload() error {
	tokens := tokenSet{}
	if a.cfg.TokenFile != "" {
		var err error
		if tokens, err = loadTokens(a.cfg.TokenFile); err != nil {
			return err
		}
	}
	var tlsCfg *tls.Config
	if a.cfg.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(a.cfg.TLSCertFile, a.cfg.TLSKeyFile)
		if err != nil {
			return fmt.Errorf("TLS certificate %s and key %s: %w", a.cfg.TLSCertFile, a.cfg.TLSKeyFile, err)
		}
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
		if a.cfg.ClientCAFile != "" {
			pem, err := os.ReadFile(a.cfg.ClientCAFile)
			if err != nil {
				return fmt.Errorf("client CA file: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return fmt.Errorf("client CA file %s holds no PEM certificate", a.cfg.ClientCAFile)
			}
			tlsCfg.ClientCAs = pool
			tlsCfg.ClientAuth = tls.VerifyClientCertIfGiven
		}
	}
	a.tokens.Store(&tokens)
	a.tls.Store(tlsCfg)
	a.log.Info("authentication loaded", slog.Int("tokens", len(tokens)), slog.Bool("tls", tlsCfg != nil),
		slog.Bool("client_certificates", tlsCfg != nil && tlsCfg.ClientCAs != nil), slog.Int("admins", len(a.admins)), slog.Int("nodes", len(a.nodes)))
	return nil
}

// ServesTLS reports whether TLS material is configured.
func (a *Authenticator) ServesTLS() bool { return a.tls.Load() != nil }

// CheckListen refuses to serve network "tcp" without TLS unless
// Config.InsecureTCP; with it, it logs a warning. Unix sockets need
// nothing.
func (a *Authenticator) CheckListen(network, addr string) error {
	if network == "unix" {
		return nil
	}
	if a.tls.Load() != nil {
		return nil
	}
	if !a.cfg.InsecureTCP {
		return fmt.Errorf("%s is a TCP address: berthd serves TCP only with TLS; give a certificate and key (--tls-cert, --tls-key) or accept plaintext with --insecure-tcp", addr)
	}
	a.log.Warn("INSECURE: serving plaintext TCP without TLS; bearer tokens and all data, file contents and env values included, cross the network unencrypted and unauthenticated peers can read and replay them",
		slog.String("listen", addr))
	return nil
}

// HTTPTLSConfig returns the TLS configuration of a TLS listener that also
// serves the HTTP protocols (server.Serve): the certificate and client
// CAs of the latest Reload at each handshake, ALPN h2 and http/1.1. It
// is nil without TLS.
func (a *Authenticator) HTTPTLSConfig() *tls.Config {
	if a.tls.Load() == nil {
		return nil
	}
	alpn := []string{"h2", "http/1.1"}
	return &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: alpn,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			c := a.tls.Load().Clone()
			c.NextProtos = alpn
			return c, nil
		}}
}

// TransportCredentials returns the server's transport credentials: unix
// socket peers are identified by SO_PEERCRED; TCP gets TLS (with the
// material of the latest Reload), plaintext with Config.InsecureTCP, or is
// refused.
func (a *Authenticator) TransportCredentials() credentials.TransportCredentials {
	t := &transport{insecureTCP: a.cfg.InsecureTCP}
	if a.tls.Load() != nil {
		t.tls = serverTLS(a.tls.Load)
	}
	return t
}

// UnaryInterceptors authenticate every unary request but health checks
// (go-grpc-middleware's auth interceptor), then hand the handler a context
// with the Principal and without incoming metadata.
func (a *Authenticator) UnaryInterceptors() []grpc.UnaryServerInterceptor {
	return []grpc.UnaryServerInterceptor{
		selector.UnaryServerInterceptor(grpcauth.UnaryServerInterceptor(a.authenticate), selector.MatchFunc(needsAuth)),
		func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			return handler(sealed(ctx), req)
		},
	}
}

// StreamInterceptors are UnaryInterceptors for streams.
func (a *Authenticator) StreamInterceptors() []grpc.StreamServerInterceptor {
	return []grpc.StreamServerInterceptor{
		selector.StreamServerInterceptor(grpcauth.StreamServerInterceptor(a.authenticate), selector.MatchFunc(needsAuth)),
		func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			return handler(srv, &sealedStream{ServerStream: ss, ctx: sealed(ss.Context())})
		},
	}
}

// needsAuth exempts the health service: load balancers and orchestrators
// probe it without credentials, and it tells nothing about sandboxes.
func needsAuth(_ context.Context, c interceptors.CallMeta) bool {
	return c.Service != healthpb.Health_ServiceDesc.ServiceName
}

// sealed returns ctx without incoming metadata: the handlers, and the
// containerd and agent clients they call with ctx, never see what the
// caller sent as metadata (the containerd client would take a
// "containerd-namespace" header as its namespace).
//
// The one header meant for the handlers, berth-no-resume, is kept as a
// context value (internal/resume).
func sealed(ctx context.Context) context.Context {
	return metadata.NewIncomingContext(resume.Keep(ctx), metadata.MD{})
}

type sealedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *sealedStream) Context() context.Context { return s.ctx }

// authenticate is the go-grpc-middleware AuthFunc: it finds the caller's
// principal (a bearer token first, then the transport's identity), applies
// a node's forwarding and AdminOnly, and returns ctx carrying the
// principal.
func (a *Authenticator) authenticate(ctx context.Context) (context.Context, error) {
	p, err := a.identify(ctx)
	if err != nil {
		return nil, err
	}
	if err := resume.Check(ctx); err != nil {
		return nil, rpcstatus.InvalidArgument(resume.Header, err.Error())
	}
	method, _ := grpc.Method(ctx)
	fwd := metadata.ValueFromIncomingContext(ctx, ForwardedHeader)
	switch {
	case a.nodes[p.Name] && len(fwd) == 0:
		return nil, permissionDenied(fmt.Sprintf("principal %s is a node principal: it may only forward calls for the principal it names in %s, never call as itself", p.Name, ForwardedHeader))
	case a.nodes[p.Name] && !ForwardedServices[serviceOf(method)] && !ForwardedImageMethods[method]:
		return nil, permissionDenied(fmt.Sprintf("node principal %s may forward only the sandbox and file calls that nodes route and image imports and pulls; %s is not one", p.Name, method))
	case len(fwd) > 0:
		if !a.nodes[p.Name] {
			return nil, permissionDenied(fmt.Sprintf("principal %s may not act on behalf of another (%s is honored from node principals only)", p.Name, ForwardedHeader))
		}
		if len(fwd) > 1 {
			return nil, unauthenticated(fmt.Sprintf("%s is given %d times", ForwardedHeader, len(fwd)))
		}
		if err := ValidName(fwd[0], true); err != nil {
			return nil, unauthenticated(ForwardedHeader + ": " + err.Error())
		}
		admin, err := a.forwardedAdmin(ctx, fwd[0])
		if err != nil {
			return nil, err
		}
		p = Principal{Name: fwd[0], Admin: admin, Via: p.Name, Method: p.Method}
	default:
		p.Admin = p.Name == RootPrincipal || a.admins[p.Name]
	}
	if AdminOnly[method] && !p.Admin {
		return nil, permissionDenied(fmt.Sprintf("%s is for admins; principal %s is not one", method, p.Name))
	}
	return NewContext(ctx, p), nil
}

// forwardedAdmin reports whether name, forwarded by a node principal, acts
// as an admin: only when the node passed on a bearer token
// (ForwardedTokenHeader) that this berthd's token file holds under name,
// and name is one of Config.Admins. Without a token the principal acts
// with its own sandboxes only (root, and admins authenticated by a
// certificate, included: the node could not prove that they called); a
// token of another principal is refused UNAUTHENTICATED.
func (a *Authenticator) forwardedAdmin(ctx context.Context, name string) (bool, error) {
	toks := metadata.ValueFromIncomingContext(ctx, ForwardedTokenHeader)
	switch {
	case len(toks) == 0:
		return false, nil
	case len(toks) > 1:
		return false, unauthenticated(fmt.Sprintf("%s is given %d times", ForwardedTokenHeader, len(toks)))
	}
	owner, ok := (*a.tokens.Load()).lookup(toks[0])
	if len(toks[0]) < MinTokenBytes || !ok || owner != name {
		return false, unauthenticated(fmt.Sprintf("the token in %s is not a token of %s, the forwarded principal, in berthd's token file", ForwardedTokenHeader, name))
	}
	return a.admins[name], nil
}

// serviceOf returns the service of a full method name, "/pkg.Service/Method".
func serviceOf(method string) string {
	s, _, _ := strings.Cut(strings.TrimPrefix(method, "/"), "/")
	return s
}

// identify returns the principal of the request's bearer token when it has
// one, else of its connection.
func (a *Authenticator) identify(ctx context.Context) (Principal, error) {
	switch vals := metadata.ValueFromIncomingContext(ctx, "authorization"); len(vals) {
	case 0:
	case 1:
		token, err := grpcauth.AuthFromMD(ctx, "bearer")
		if err != nil {
			return Principal{}, unauthenticated(`the authorization metadata must be "Bearer <token>"`)
		}
		if len(token) < MinTokenBytes {
			return Principal{}, unauthenticated(fmt.Sprintf("the bearer token is %d bytes; berthd's tokens have at least %d (generate them: docs/security.md, Tokens)", len(token), MinTokenBytes))
		}
		name, ok := (*a.tokens.Load()).lookup(token)
		if !ok {
			return Principal{}, unauthenticated("the bearer token is not in berthd's token file")
		}
		return Principal{Name: name, Method: "token", token: token}, nil
	default:
		return Principal{}, unauthenticated(fmt.Sprintf("the authorization metadata is given %d times", len(vals)))
	}
	pr, ok := peer.FromContext(ctx)
	if !ok {
		return Principal{}, unauthenticated("the connection has no peer information")
	}
	info := pr.AuthInfo
	if info == nil {
		// A call through net/http (HTTPConnContext): grpc-go's peer has
		// the request's TLS state at most.
		info, _ = connAuthInfo(ctx)
	}
	switch info := info.(type) {
	case PeerCred:
		name := UnixPrincipal(info.UID)
		if a.cfg.UnixHost != "" && name != RootPrincipal {
			name += "@" + a.cfg.UnixHost
		}
		return Principal{Name: name, Method: "unix"}, nil
	case credentials.TLSInfo:
		if len(info.State.VerifiedChains) == 0 {
			break
		}
		cn := info.State.VerifiedChains[0][0].Subject.CommonName
		if err := ValidName(cn, false); err != nil {
			return Principal{}, unauthenticated("client certificate common name: " + err.Error())
		}
		return Principal{Name: cn, Method: "tls"}, nil
	}
	return Principal{}, unauthenticated("no credentials: give a bearer token (authorization: Bearer <token>) or a client certificate, or call on berthd's unix socket")
}

func unauthenticated(msg string) error {
	return rpcstatus.Error(codes.Unauthenticated, rpcstatus.ReasonUnauthenticated, msg, nil)
}

func permissionDenied(msg string) error {
	return rpcstatus.Error(codes.PermissionDenied, rpcstatus.ReasonNotPermitted, msg, nil)
}
