package runtime

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Pull errors, for the handlers to map to status codes.
var (
	// ErrRegistryUnreachable means the image's registry could not be
	// reached (DNS, connect or TLS failure, or no answer in time).
	ErrRegistryUnreachable = errors.New("registry unreachable")
	// ErrInvalidReference means the image reference cannot be parsed.
	ErrInvalidReference = errors.New("invalid image reference")
	// ErrRegistryNotAllowed means berthd's configuration does not let it
	// pull from the image's registry (PullOptions.Registries).
	ErrRegistryNotAllowed = errors.New("registry not allowed")
)

// PullOptions configures PullImage.
type PullOptions struct {
	// ResolveTimeout bounds reaching the registry and resolving the
	// reference; past it the pull fails with ErrRegistryUnreachable.
	ResolveTimeout time.Duration
	// Interval is how often progress is reported.
	Interval time.Duration
	// Registries names the registries a pull may reach, as references
	// write them: "registry.example.com", "localhost:5000", or any port of
	// a host: "localhost:*". "*" stands for every registry that is not on
	// this host. Empty means "*". A registry
	// on this host (localhost, a loopback address) is reached only when
	// named; it is spoken to over plain HTTP. The check is made on the
	// reference and again on every address dialed (a name that resolves to
	// a loopback address, a redirect), so no pull reaches a local port that
	// is not listed.
	Registries []string
}

// loopbackHost reports whether host (a registry's host, without its port)
// names this machine: localhost or a loopback or unspecified address.
func loopbackHost(host string) bool {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && (ip.IsLoopback() || ip.IsUnspecified())
}

// splitRegistry splits a registry "host[:port]" into its host and port;
// the port is "" when none is given.
func splitRegistry(registry string) (host, port string) {
	if h, p, err := net.SplitHostPort(registry); err == nil {
		return h, p
	}
	return registry, ""
}

// allowRegistry checks registry (a reference's domain) against allowed
// (see PullOptions.Registries) and returns the local ports the pull may
// dial: those of registry when it is on this host and named.
func allowRegistry(registry string, allowed []string) (localPorts []string, err error) {
	if len(allowed) == 0 {
		allowed = []string{"*"}
	}
	host, port := splitRegistry(registry)
	local := loopbackHost(host)
	for _, a := range allowed {
		aHost, aPort := splitRegistry(a)
		switch {
		case a == "*" && !local:
			return nil, nil
		case strings.EqualFold(a, registry), aPort == "*" && strings.EqualFold(aHost, host):
			if local {
				if port == "" {
					port = "80"
				}
				return []string{port}, nil
			}
			return nil, nil
		}
	}
	if local {
		return nil, fmt.Errorf("%w: %s is on berthd's host; name it in --pull-registry to pull from it", ErrRegistryNotAllowed, registry)
	}
	return nil, fmt.Errorf("%w: %s is not among the registries berthd may pull from (--pull-registry %s)", ErrRegistryNotAllowed, registry, strings.Join(allowed, ", "))
}

// dialControl refuses a connection to this host other than to localPorts:
// a registry name that resolves to a loopback address, or a redirect to
// one, must not reach a local service.
func dialControl(localPorts []string) func(network, address string, _ syscall.RawConn) error {
	return func(network, address string, _ syscall.RawConn) error {
		host, port, err := net.SplitHostPort(address)
		if err != nil {
			return fmt.Errorf("%w: dial %s: %v", ErrRegistryNotAllowed, address, err)
		}
		if !loopbackHost(host) || slices.Contains(localPorts, port) {
			return nil
		}
		return fmt.Errorf("%w: the pull would connect to %s on berthd's host", ErrRegistryNotAllowed, address)
	}
}

// PullProgress is the state of one blob during a pull.
type PullProgress struct {
	Digest     string
	MediaType  string
	Downloaded uint64 // bytes stored so far
	Total      uint64 // the blob's size in bytes
	Done       bool
}

// NormalizeReference returns ref as a fully qualified reference, as docker
// pull reads it: "alpine" is "docker.io/library/alpine:latest".
func NormalizeReference(ref string) (string, error) {
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return "", fmt.Errorf("%w: %q: %v", ErrInvalidReference, ref, err)
	}
	return named.String(), nil
}

// PullImage fetches ref (normalized) from its registry, stores and unpacks
// it, and returns it. It fails with ErrRegistryNotAllowed, having sent
// nothing, when opts.Registries does not allow the registry. Registries on
// localhost are spoken to over plain HTTP. Resolving the reference must
// finish within opts.ResolveTimeout, or the pull fails with
// ErrRegistryUnreachable; the download itself is bounded by ctx only. It
// fails with an *ImageStoreFull as soon as a manifest names blobs the
// content store lacks that would take it past Config.MaxImageStoreBytes.
// progress, when not nil, is called about every opts.Interval with every
// blob seen so far, from a goroutine PullImage waits for.
func (r *Runtime) PullImage(ctx context.Context, ref string, opts PullOptions, progress func([]PullProgress)) (_ Image, err error) {
	c := r.beginLong(ctx, "pull image "+ref)
	defer c.end(&err)
	c.changes()
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return Image{}, fmt.Errorf("%w: %q: %v", ErrInvalidReference, ref, err)
	}
	localPorts, err := allowRegistry(reference.Domain(named), opts.Registries)
	if err != nil {
		return Image{}, err
	}
	ref = named.String()
	resolveTimeout, interval := opts.ResolveTimeout, opts.Interval
	dialer := &net.Dialer{Timeout: resolveTimeout, KeepAlive: 30 * time.Second, Control: dialControl(localPorts)}
	transport := docker.DefaultHTTPTransport(nil)
	transport.DialContext = dialer.DialContext
	transport.TLSHandshakeTimeout = resolveTimeout
	transport.ResponseHeaderTimeout = resolveTimeout
	resolver := docker.NewResolver(docker.ResolverOptions{
		Hosts: docker.ConfigureDefaultRegistries(
			docker.WithClient(&http.Client{Transport: transport}),
			docker.WithPlainHTTP(docker.MatchLocalhost),
		),
	})
	// Resolve alone first, under the short timeout: an unreachable registry
	// fails here in seconds rather than after the transport's retries.
	resolveCtx, cancel := context.WithTimeout(ctx, resolveTimeout)
	_, _, err = resolver.Resolve(resolveCtx, ref)
	cancel()
	if err != nil {
		return Image{}, r.pullError(ctx, ref, resolveTimeout, err)
	}

	// Under a lease of berthd's own: one a crash leaves is dropped at the
	// next start (containerd's Pull would take a 24 h one).
	ctx, doneLease, err := r.withLease(ctx, importLeaseExpiry)
	if err != nil {
		return Image{}, fmt.Errorf("lease for the pull of %s: %w", ref, err)
	}
	defer doneLease(context.WithoutCancel(ctx))

	budget, err := r.newImageBudget(ctx)
	if err != nil {
		return Image{}, err
	}
	tracker := &pullTracker{budget: budget, store: r.client.ContentStore()}
	done := make(chan struct{})
	var wg sync.WaitGroup
	if progress != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(interval)
			defer t.Stop()
			for {
				select {
				case <-done:
					return
				case <-t.C:
					progress(tracker.snapshot(ctx, r))
				}
			}
		}()
	}
	img, err := r.client.Pull(ctx, ref,
		containerd.WithResolver(resolver),
		containerd.WithPullUnpack,
		containerd.WithPullSnapshotter(r.cfg.Snapshotter),
		containerd.WithImageHandlerWrapper(tracker.wrap),
	)
	close(done)
	wg.Wait()
	if full := budget.exceeded(); full != nil {
		return Image{}, full
	}
	if err != nil {
		return Image{}, r.pullError(ctx, ref, resolveTimeout, err)
	}
	if progress != nil {
		progress(tracker.snapshot(ctx, r))
	}
	return r.imageOf(ctx, img.Metadata()), nil
}

// pullError classifies a resolve or fetch failure.
func (r *Runtime) pullError(ctx context.Context, ref string, resolveTimeout time.Duration, err error) error {
	var (
		dnsErr *net.DNSError
		opErr  *net.OpError
	)
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("pull %s: %w", ref, ctx.Err())
	case errors.Is(err, ErrRegistryNotAllowed):
		return fmt.Errorf("pull %s: %w", ref, err)
	case errdefs.IsNotFound(err):
		return fmt.Errorf("%w: %s: the registry has no such image (%v)", ErrImageNotFound, ref, err)
	case errors.As(err, &dnsErr), errors.As(err, &opErr), errors.Is(err, context.DeadlineExceeded),
		strings.Contains(err.Error(), "Client.Timeout"), strings.Contains(err.Error(), "TLS handshake timeout"):
		// The last two are net/http's timeouts, which it reports as
		// unexported error types.
		return fmt.Errorf("%w: pull %s: cannot reach its registry (connect timeout %v): %v", ErrRegistryUnreachable, ref, resolveTimeout, err)
	}
	return fmt.Errorf("pull %s: %w", ref, err)
}

// DeleteImage removes the image record name for v and waits for its
// content to be garbage collected. Content still used by other images or
// by sandboxes' snapshots stays. Errors: ErrImageNotFound (ErrImageHidden
// for another principal's private image), ErrImageShared when v is not an
// admin and the image is not v's private image.
func (r *Runtime) DeleteImage(ctx context.Context, name string, v ImageViewer) (err error) {
	c := r.begin(ctx, "delete image "+name)
	defer c.end(&err)
	if !v.Admin {
		img, err := r.client.ImageService().Get(ctx, name)
		switch {
		case errdefs.IsNotFound(err):
			return fmt.Errorf("%w: %s", ErrImageNotFound, name)
		case err != nil:
			return fmt.Errorf("get image %s: %w", name, err)
		case !v.Sees(img.Labels[labelImagePrivateTo]):
			return fmt.Errorf("%w: %s", ErrImageHidden, name)
		case img.Labels[labelImagePrivateTo] != v.Principal:
			return fmt.Errorf("%w: %s is shared by every principal", ErrImageShared, name)
		}
	}
	c.changes()
	if err := r.client.ImageService().Delete(ctx, name, images.SynchronousDelete()); err != nil {
		if errdefs.IsNotFound(err) {
			return fmt.Errorf("%w: %s", ErrImageNotFound, name)
		}
		return fmt.Errorf("delete image %s: %w", name, err)
	}
	return nil
}

// pullTracker records the blobs a pull visits, in order.
type pullTracker struct {
	mu    sync.Mutex
	descs []ocispec.Descriptor
	seen  map[string]bool

	budget *imageBudget  // nil: no bound
	store  content.Store // where budget looks for blobs already stored
}

// wrap records every descriptor the pull's handlers visit and the children
// they return: the unpacker fetches layers itself, so layers are seen only
// as a manifest's children.
func (t *pullTracker) wrap(h images.Handler) images.Handler {
	return images.HandlerFunc(func(ctx context.Context, desc ocispec.Descriptor) ([]ocispec.Descriptor, error) {
		children, err := h.Handle(ctx, desc)
		t.record(append([]ocispec.Descriptor{desc}, children...)...)
		if err == nil {
			// The children are fetched next: refuse before, not after.
			err = t.budget.blobs(ctx, t.store, children)
		}
		return children, err
	})
}

func (t *pullTracker) record(descs ...ocispec.Descriptor) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.seen == nil {
		t.seen = make(map[string]bool)
	}
	for _, desc := range descs {
		if !t.seen[desc.Digest.String()] {
			t.seen[desc.Digest.String()] = true
			t.descs = append(t.descs, desc)
		}
	}
}

// snapshot reports each recorded blob: done when the content store has it,
// else the offset of its ingest (content.Status refs end in the digest).
func (t *pullTracker) snapshot(ctx context.Context, r *Runtime) []PullProgress {
	t.mu.Lock()
	descs := append([]ocispec.Descriptor(nil), t.descs...)
	t.mu.Unlock()
	cs := r.client.ContentStore()
	active := map[string]int64{}
	if statuses, err := cs.ListStatuses(ctx); err == nil {
		for _, st := range statuses {
			if i := strings.LastIndex(st.Ref, "sha256:"); i >= 0 {
				active[st.Ref[i:]] = st.Offset
			}
		}
	}
	out := make([]PullProgress, 0, len(descs))
	for _, d := range descs {
		p := PullProgress{Digest: d.Digest.String(), MediaType: d.MediaType, Total: uint64(max(d.Size, 0))}
		if off, ok := active[p.Digest]; ok {
			p.Downloaded = uint64(off)
		} else if _, err := cs.Info(ctx, d.Digest); err == nil {
			p.Downloaded, p.Done = p.Total, true
		}
		out = append(out, p)
	}
	return out
}
