package integration

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestCreateSandboxUserName creates sandboxes whose user is a name of the
// image's /etc/passwd (berth:x:1000:1000, nobody:x:65534:65534, group
// nogroup:65534): the name resolves at create to the ids the sandbox keeps,
// and a create by the resolved ids with the same request_id is the same
// sandbox. An unknown name is INVALID_ARGUMENT naming user and the image.
func TestCreateSandboxUserName(t *testing.T) {
	need(t)
	reqID := xid(t)
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{User: "berth", RequestId: reqID})
	if sb.GetUser() != "1000:1000" {
		t.Errorf("created as berth: user %q, want 1000:1000", sb.GetUser())
	}
	if got := run(t, sb.GetId(), "sh", "-c", "id -u; id -g"); string(got.GetStdout()) != "1000\n1000\n" {
		t.Errorf("as berth: id -u; id -g = %q (stderr %q), want 1000, 1000", got.GetStdout(), got.GetStderr())
	}

	sb2 := newSandbox(t, &berthv1.CreateSandboxRequest{User: "nobody:berth"})
	if got := run(t, sb2.GetId(), "sh", "-c", "id -u; id -g"); string(got.GetStdout()) != "65534\n1000\n" {
		t.Errorf("as nobody:berth: id -u; id -g = %q (stderr %q), want 65534, 1000", got.GetStdout(), got.GetStderr())
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The same request by the ids the name resolved to: the same sandbox.
	for _, user := range []string{"1000:1000", "berth"} {
		again, err := env.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, User: user, RequestId: reqID})
		if err != nil || again.GetSandbox().GetId() != sb.GetId() {
			t.Errorf("create again as %s with request_id %s = %v, %v; want sandbox %s", user, reqID, again.GetSandbox().GetId(), err, sb.GetId())
		}
	}
	// Another user with the same request_id: a different spec.
	_, err := env.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, User: "nobody", RequestId: reqID})
	if err == nil {
		t.Errorf("create as nobody with request_id %s of a sandbox of berth: no error, want a conflict naming user", reqID)
	}

	for _, bad := range []string{"nosuchuser", "berth:nosuchgroup"} {
		_, err := env.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, User: bad})
		wantStatus(t, err, codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "user", env.image)
	}
}
