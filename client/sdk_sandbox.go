package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// DefaultAddr is the berthd address the SDK (CreateSandbox,
// ConnectSandbox) dials when neither SandboxOptions.Addr nor $BERTH_ADDR
// is set; the CLI's default too.
const DefaultAddr = "unix:///run/berth/berthd.sock"

// SandboxOptions configure CreateSandbox and ConnectSandbox: the
// connection (Client, or Addr and Token with the environment's defaults)
// and, for CreateSandbox, the sandbox. Zero fields take berthd's defaults.
type SandboxOptions struct {
	// Client is a connection to share between sandboxes; nil dials one
	// (from Addr, Token and Dial) that Close and Kill close.
	Client *Client
	// Addr is berthd's address (unix:///path, a bare absolute path, or a
	// TLS host:port); default $BERTH_ADDR, else DefaultAddr.
	Addr string
	// Token is the bearer token; default $BERTH_TOKEN, else the contents
	// of the file $BERTH_TOKEN_FILE. TLS files come from $BERTH_TLS_CA,
	// $BERTH_TLS_CERT and $BERTH_TLS_KEY for a host:port address.
	Token string
	// Dial are more options for Dial (WithTLS, WithRetry of another
	// policy, ...). A dialled Client retries under the default
	// RetryPolicy, as the Python and TypeScript SDKs do; NoRetry turns
	// that off.
	Dial    []Option
	NoRetry bool

	Image   string            // default: $BERTH_IMAGE, else DefaultImage (with FromSnapshot: the snapshot's)
	User    string            // "uid", "uid:gid" or a name from the image's /etc/passwd
	Env     map[string]string // environment of every command
	Workdir string            // working directory of every command
	Labels  map[string]string
	// Resources are the sandbox's limits (memory, cpu, disk, ...).
	Resources   *berthv1.Resources
	IdleTimeout time.Duration // deleted after this long without requests (or IdleAction)
	MaxLifetime time.Duration // deleted this long after creation
	Runtime     string        // e.g. "runsc"; default berthd's
	// Volumes mounts the caller's volumes (Client.CreateVolume) into the
	// sandbox.
	Volumes []*berthv1.VolumeMount
	// IdleAction is what the idle timeout does: delete the sandbox (zero:
	// berthd's default), pause or hibernate it (docs/state.md).
	IdleAction berthv1.IdleAction
	// FromSnapshot starts the sandbox from a snapshot of the caller's
	// (Sandbox.Snapshot, Client.ListSnapshots): its files, with Image
	// naming the snapshot's image or left empty.
	FromSnapshot string
}

// DefaultImage is the image CreateSandbox asks for when
// SandboxOptions.Image is empty and $BERTH_IMAGE is unset: the base image
// that scripts/base-image.sh builds and the demo imports, as in the Python
// and TypeScript SDKs (berthd itself has no default image).
const DefaultImage = "berth.dev/base:latest"

// Sandbox is one sandbox with the SDK's surface, the Go column of the
// Python SDK's berth.Sandbox and the TypeScript SDK's Sandbox:
// Commands, Files and Ports. Its methods may be called from many
// goroutines. Kill deletes it; Close only lets go of the connection.
type Sandbox struct {
	// ID is the sandbox id.
	ID string
	// Info is the sandbox as berthd last described it (Refresh updates it).
	Info *berthv1.Sandbox
	// Client is the connection the sandbox's calls use.
	Client *Client

	Commands *Commands
	Files    *Files
	Ports    *Ports

	ownClient bool
}

// CreateSandbox creates a sandbox as opts says and returns it once it
// runs, retrying FLEET_BUSY and the other retryable failures under the
// Client's RetryPolicy. Use with defer sb.Kill(ctx). Errors are *Error
// (e.g. codes.InvalidArgument naming "user" for an unknown user name), or
// the dial's.
func CreateSandbox(ctx context.Context, opts SandboxOptions) (*Sandbox, error) {
	c, own, err := opts.client(ctx)
	if err != nil {
		return nil, err
	}
	image := opts.Image
	if image == "" && opts.FromSnapshot == "" {
		image = cmp.Or(os.Getenv("BERTH_IMAGE"), DefaultImage)
	}
	req := &berthv1.CreateSandboxRequest{
		Image: image, User: opts.User, Env: opts.Env, Workdir: opts.Workdir,
		Labels: opts.Labels, Resources: opts.Resources, Runtime: opts.Runtime,
		Volumes: opts.Volumes, IdleAction: opts.IdleAction, FromSnapshot: opts.FromSnapshot,
	}
	if opts.IdleTimeout > 0 {
		req.IdleTimeout = durationpb.New(opts.IdleTimeout)
	}
	if opts.MaxLifetime > 0 {
		req.MaxLifetime = durationpb.New(opts.MaxLifetime)
	}
	info, err := c.CreateSandbox(ctx, req)
	return newSandbox(c, own, info, err)
}

// ConnectSandbox returns the existing sandbox id (opts' connection fields
// apply; the others are ignored). Errors: *Error with
// ReasonSandboxNotFound for a missing sandbox or another principal's.
func ConnectSandbox(ctx context.Context, id string, opts SandboxOptions) (*Sandbox, error) {
	c, own, err := opts.client(ctx)
	if err != nil {
		return nil, err
	}
	info, err := c.GetSandbox(ctx, id)
	return newSandbox(c, own, info, err)
}

// newSandbox returns the Sandbox of info, or err after closing a
// connection the sandbox would have owned.
func newSandbox(c *Client, own bool, info *berthv1.Sandbox, err error) (*Sandbox, error) {
	if err != nil {
		if own {
			_ = c.Close()
		}
		return nil, err
	}
	sb := &Sandbox{ID: info.GetId(), Info: info, Client: c, ownClient: own}
	sb.Commands = &Commands{c: c, id: sb.ID}
	sb.Files = &Files{c: c, id: sb.ID}
	sb.Ports = &Ports{c: c, id: sb.ID}
	return sb, nil
}

// Refresh reads the sandbox from berthd into Info.
func (sb *Sandbox) Refresh(ctx context.Context) (*berthv1.Sandbox, error) {
	info, err := sb.Client.GetSandbox(ctx, sb.ID)
	if err != nil {
		return nil, err
	}
	sb.Info = info
	return info, nil
}

// Kill deletes the sandbox (its commands end) and closes the connection
// when the sandbox dialled it. A sandbox already gone is no error.
func (sb *Sandbox) Kill(ctx context.Context) error {
	err := sb.Client.DeleteSandbox(ctx, sb.ID)
	if IsReason(err, ReasonSandboxNotFound) {
		err = nil
	}
	if cerr := sb.Close(); err == nil {
		err = cerr
	}
	return err
}

// Close lets go of the sandbox without deleting it: it closes the
// connection when the sandbox dialled it (a shared Client stays open).
func (sb *Sandbox) Close() error {
	if !sb.ownClient {
		return nil
	}
	sb.ownClient = false
	return sb.Client.Close()
}

// IsReason reports whether err is (or wraps) an *Error of reason, e.g.
// IsReason(err, ReasonSandboxNotFound).
func IsReason(err error, reason string) bool {
	var e *Error
	return err != nil && errors.As(err, &e) && e.Reason == reason
}

// client returns opts.Client, or dials one from opts and the environment.
func (opts SandboxOptions) client(ctx context.Context) (*Client, bool, error) {
	if opts.Client != nil {
		return opts.Client, false, nil
	}
	addr := firstNonEmpty(opts.Addr, os.Getenv("BERTH_ADDR"), DefaultAddr)
	token := firstNonEmpty(opts.Token, os.Getenv("BERTH_TOKEN"))
	if f := os.Getenv("BERTH_TOKEN_FILE"); token == "" && f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, false, fmt.Errorf("token file $BERTH_TOKEN_FILE: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	var dial []Option
	if !opts.NoRetry {
		dial = append(dial, WithRetry(RetryPolicy{}))
	}
	if token != "" {
		dial = append(dial, WithToken(token))
	}
	if ca, cert, key := os.Getenv("BERTH_TLS_CA"), os.Getenv("BERTH_TLS_CERT"), os.Getenv("BERTH_TLS_KEY"); ca+cert+key != "" {
		cfg, err := TLSConfigFromFiles(ca, cert, key)
		if err != nil {
			return nil, false, err
		}
		dial = append(dial, WithTLS(cfg))
	}
	c, err := Dial(ctx, addr, append(dial, opts.Dial...)...)
	return c, true, err
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}
