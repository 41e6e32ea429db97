package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"log/slog"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/tarbomb"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server"
	"github.com/berth-sandbox/berth/server/runtime"
)

const mib = 1 << 20

// TestDiskQuota fills a sandbox with a 100 MiB disk quota from inside and
// through the FileService, and sends it the bombs of issue 10: a 1.5 MB
// gzip that expands to 1.5 GiB, and a few KiB of sparse tar of a 1.5 GiB
// file. Every write stops at the quota: EDQUOT inside, RESOURCE_EXHAUSTED
// NO_SPACE naming the path through the API.
func TestDiskQuota(t *testing.T) {
	need(t)
	const quota = 100 * mib
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{Resources: &berthv1.Resources{DiskBytes: quota}})
	id := sb.GetId()
	c := dialClient(t, env.berthdAddr)
	if got := sb.GetResources().GetDiskBytes(); got != quota {
		t.Errorf("created sandbox resources.disk_bytes = %d, want %d", got, quota)
	}
	sh := func(t *testing.T, script string) *berthv1.RunResponse {
		t.Helper()
		return run(t, id, "sh", "-c", script)
	}
	size := func(t *testing.T, path string) int64 {
		t.Helper()
		r := sh(t, "stat -c %s "+path)
		n, err := strconv.ParseInt(strings.TrimSpace(string(r.GetStdout())), 10, 64)
		if err != nil {
			t.Fatalf("stat %s: %q %q", path, r.GetStdout(), r.GetStderr())
		}
		return n
	}
	diskUsed := func(t *testing.T) uint64 {
		t.Helper()
		sh(t, "sync") // the kernel accounts quota groups at each commit
		got, err := c.GetSandbox(fileCtx(t), id)
		if err != nil {
			t.Fatal(err)
		}
		return got.GetUsage().GetDiskBytes()
	}
	noSpace := func(t *testing.T, what string, err error, path string) {
		t.Helper()
		wantFileError(t, err, codes.ResourceExhausted, rpcstatus.ReasonNoSpace, path)
		if r := sh(t, "test -e "+path); r.GetResult().GetExitCode() == 0 {
			t.Errorf("%s: refused %s exists afterwards", what, path)
		}
	}

	t.Run("dd inside stops at the quota", func(t *testing.T) {
		r := sh(t, "dd if=/dev/zero of=/workspace/fill bs=1M count=200")
		if r.GetResult().GetExitCode() == 0 || !strings.Contains(string(r.GetStderr()), "Disk quota exceeded") {
			t.Fatalf("dd of 200 MiB into a 100 MiB quota: exit %d, stderr %q; want a failure with EDQUOT", r.GetResult().GetExitCode(), r.GetStderr())
		}
		if n := size(t, "/workspace/fill"); n > quota || n < quota-10*mib {
			t.Errorf("dd stopped after %d bytes, want just under the %d-byte quota", n, quota)
		}
		if used := diskUsed(t); used > quota || used < quota-10*mib {
			t.Errorf("usage.disk_bytes = %d with the quota full, want just under %d", used, quota)
		}
	})
	t.Run("WriteFile into a full sandbox", func(t *testing.T) {
		_, err := c.WriteFile(fileCtx(t), id, "/workspace/more", bytes.NewReader(randomData(mib)))
		noSpace(t, "WriteFile", err, "/workspace/more")
		if r := sh(t, "ls -A /workspace"); string(r.GetStdout()) != "fill\n" {
			t.Errorf("after the refused WriteFile /workspace holds %q, want only fill", r.GetStdout())
		}
	})
	t.Run("space comes back when files go", func(t *testing.T) {
		sh(t, "rm /workspace/fill")
		if r := sh(t, "dd if=/dev/zero of=/workspace/half bs=1M count=50 && rm /workspace/half"); r.GetResult().GetExitCode() != 0 {
			t.Fatalf("dd of 50 MiB after freeing the quota: exit %d: %s", r.GetResult().GetExitCode(), r.GetStderr())
		}
	})
	t.Run("Upload past the quota", func(t *testing.T) {
		if r := sh(t, "dd if=/dev/zero of=/workspace/fill bs=1M count=96"); r.GetResult().GetExitCode() != 0 {
			t.Fatalf("dd of 96 MiB: exit %d: %s", r.GetResult().GetExitCode(), r.GetStderr())
		}
		defer sh(t, "rm -f /workspace/fill")
		// 8 MiB fit the agent's check of the archive against the quota;
		// the kernel stops them as they are written. Random bytes: zeros
		// would be extracted as holes, taking no space.
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644, Size: 8 * mib})
		tw.Write(randomData(8 * mib))
		tw.Close()
		_, err := c.Upload(fileCtx(t), id, "/workspace/up", &buf)
		noSpace(t, "Upload", err, "/workspace/up/f")
	})
	gz, err := tarbomb.Gzip("zeros", 1536*mib)
	if err != nil {
		t.Fatal(err)
	}
	sparse, err := tarbomb.Sparse(t.TempDir(), "holes", 1536*mib)
	if err != nil {
		t.Fatal(err)
	}
	for _, bomb := range []struct {
		name, entry string
		archive     []byte
	}{{"gzip bomb", "zeros", gz}, {"sparse bomb", "holes", sparse}} {
		t.Run(bomb.name, func(t *testing.T) {
			t.Logf("%s: %d bytes of archive, a file of 1.5 GiB", bomb.name, len(bomb.archive))
			_, err := c.Upload(fileCtx(t), id, "/workspace/bomb", bytes.NewReader(bomb.archive))
			noSpace(t, bomb.name, err, "/workspace/bomb/"+bomb.entry)
		})
	}
	t.Run("streamed WriteFile over the quota", func(t *testing.T) {
		_, err := c.WriteFile(fileCtx(t), id, "/workspace/stream", io.LimitReader(tarbomb.Zeros{}, 110*mib))
		noSpace(t, "WriteFile of 110 MiB", err, "/workspace/stream")
	})
	if used := diskUsed(t); used > 10*mib {
		t.Errorf("usage.disk_bytes = %d after every refused write, want what the sandbox holds (well under 10 MiB)", used)
	}
}

// TestDiskQuotaCountsInodes creates empty files in a sandbox with the
// smallest quota until one fails: btrfs counts no inodes, but their
// metadata counts against the bytes, so a file bomb stops too.
func TestDiskQuotaCountsInodes(t *testing.T) {
	need(t)
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{Resources: &berthv1.Resources{DiskBytes: mib}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	resp, err := env.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: sb.GetId(), Process: &berthv1.ProcessSpec{
		ShellCommand: `mkdir /workspace/m && cd /workspace/m && i=0; while [ $i -lt 100000 ] && true >f$i; do i=$((i+1)); done; echo $i`,
	}})
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(resp.GetStdout())))
	if n == 0 || n >= 100000 || !strings.Contains(string(resp.GetStderr()), "quota") {
		t.Errorf("created %d empty files under a 1 MiB quota (stderr %q), want a failure with EDQUOT before 100000", n, resp.GetStderr())
	}
	t.Logf("%d empty files filled a 1 MiB quota", n)
}

// TestDiskQuotaNoSubvolumes checks that a sandbox cannot step around its
// quota with a btrfs subvolume of its own (any user may make one where they
// can write, and it would have a quota group of its own): seccomp refuses
// btrfs's subvolume ioctls, also with high bits set in the request, and
// keeps FICLONE (reflink), which takes no space.
func TestDiskQuotaNoSubvolumes(t *testing.T) {
	need(t)
	if env.snapshotter != "btrfs" {
		t.Fatalf("needs the btrfs snapshotter (BERTH_SNAPSHOTTER=%s)", env.snapshotter)
	}
	sb := newSandbox(t, &berthv1.CreateSandboxRequest{Resources: &berthv1.Resources{DiskBytes: 10 * mib}})
	id := sb.GetId()
	installProgram(t, dialClient(t, env.berthdAddr), id, "btrfsioctl", "/workspace/btrfsioctl")
	for _, tt := range []struct {
		argv []string
		want string
	}{
		{[]string{"subvol", "/workspace", "escape"}, "operation not permitted"},
		{[]string{"subvol-high", "/workspace", "escape"}, "operation not permitted"},
		{[]string{"subvol", "/tmp", "escape"}, "operation not permitted"},
		{[]string{"clone", "/workspace/btrfsioctl", "/workspace/copy"}, "ok"},
	} {
		r := run(t, id, append([]string{"/workspace/btrfsioctl"}, tt.argv...)...)
		if got := strings.TrimSpace(string(r.GetStdout())); got != tt.want {
			t.Errorf("btrfsioctl %q = %q (stderr %q), want %q", tt.argv, got, r.GetStderr(), tt.want)
		}
	}
	if r := run(t, id, "ls", "/workspace"); string(r.GetStdout()) != "btrfsioctl\ncopy\n" {
		t.Errorf("/workspace holds %q, want btrfsioctl and copy only", r.GetStdout())
	}
}

// TestDiskQuotaRequests checks the request side: the bounds of
// resources.disk_bytes, and a server whose snapshotter has no quotas.
func TestDiskQuotaRequests(t *testing.T) {
	need(t)
	ctx := fileCtx(t)
	create := func(addr string, disk uint64) error {
		_, err := dialClient(t, addr).CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: env.image, Resources: &berthv1.Resources{DiskBytes: disk}})
		return err
	}
	invalid := func(what string, err error) {
		t.Helper()
		ce := wantFileError(t, err, codes.InvalidArgument, rpcstatus.ReasonInvalidArgument, "")
		if len(ce.FieldViolations) != 1 || ce.FieldViolations[0].Field != "resources.disk_bytes" {
			t.Errorf("%s: violations %v, want resources.disk_bytes", what, ce.FieldViolations)
		}
	}
	invalid("below the minimum", create(env.berthdAddr, mib-1))
	capped := startServer(t, server.Config{MaxDiskBytes: 200 * mib, TaskRestartLimit: -1})
	invalid("above the maximum", create(capped, 200*mib+1))

	rt, err := runtime.New(ctx, runtime.Config{Address: env.containerd, Namespace: env.namespace, Snapshotter: "overlayfs",
		StateDir: filepath.Join(env.dir, "st"), AgentBinary: env.agentBinary})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	if err := rt.DiskQuota(); err == nil || !strings.Contains(err.Error(), "overlayfs") {
		t.Fatalf("DiskQuota() on overlayfs = %v, want an error naming overlayfs", err)
	}
	svc := server.New(server.Config{DefaultDiskBytes: mib}, rt, slog.New(slog.DiscardHandler))
	if err := svc.Start(ctx); err == nil || !strings.Contains(err.Error(), "disk quota") {
		t.Errorf("Start with a default disk quota on overlayfs = %v, want a refusal", err)
	}
	svc.Close()
	plain := serveService(t, server.Config{TaskRestartLimit: -1}, rt)
	ce := wantFileError(t, create(plain, 100*mib), codes.FailedPrecondition, rpcstatus.ReasonDiskQuotaUnsupported, "")
	if ce.Metadata["field"] != "resources.disk_bytes" {
		t.Errorf("DISK_QUOTA_UNSUPPORTED metadata %v, want field resources.disk_bytes", ce.Metadata)
	}
}

// TestBerthdDiskQuotaFlags runs the berthd binary: on btrfs a sandbox that
// asks for nothing gets the 10 GiB default; on a snapshotter without
// quotas, a configured default makes it refuse to start, and no default
// makes it warn.
func TestBerthdDiskQuotaFlags(t *testing.T) {
	need(t)
	e := newBinaryEnv(t, "dq")
	p := startBerthd(t, e)
	e.importBase(t)
	ctx := fileCtx(t)
	resp, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{Image: baseImage})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetSandbox().GetResources().GetDiskBytes(); got != 10<<30 {
		t.Errorf("default resources.disk_bytes = %d, want 10 GiB", got)
	}
	if err := p.signal(t, syscall.SIGTERM); err != nil {
		t.Errorf("berthd exit after SIGTERM: %v", err)
	}

	base := []string{"--containerd-address", env.containerd, "--namespace", e.ns, "--state-dir", e.stateDir,
		"--agent-binary", env.agentBinary, "--snapshotter", "overlayfs", "--listen", "unix://" + e.sock}
	cmd := exec.CommandContext(ctx, berthdBinary(t), append(base, "--default-disk-bytes", strconv.Itoa(mib))...)
	out, err := cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(string(out), "disk quota") {
		t.Errorf("berthd --snapshotter overlayfs --default-disk-bytes: exit %d (%v), log:\n%s\nwant exit 1 naming the disk quota", code, err, out)
	}
	p = startBerthd(t, e, "--snapshotter", "overlayfs")
	if lines := p.logLines("WARN", "NOT limited"); len(lines) != 1 {
		t.Errorf("berthd on overlayfs logged %d warnings about unlimited disk, want 1:\n%s", len(lines), p.log)
	}
}

// knownHostDiskGaps are the host directories a sandbox's workload can
// still write outside its disk quota: none since /.berth-run, the agent's
// socket directory, became a 64 KiB tmpfs of its own (issue 10 item 5).
var knownHostDiskGaps []string

// TestSandboxWritesNoHostDisk looks for host disk a sandbox's workload can
// write besides its quota-limited root: every mount of a disk-backed file
// system (not tmpfs, proc, sysfs, ...) that is read-write is probed with a
// write as the workload user (root).
func TestSandboxWritesNoHostDisk(t *testing.T) {
	need(t)
	id := newSandbox(t, nil).GetId()
	memoryBacked := map[string]bool{"tmpfs": true, "proc": true, "sysfs": true, "devpts": true, "mqueue": true, "cgroup": true, "cgroup2": true}
	var writable []string
	for _, line := range strings.Split(strings.TrimSpace(string(run(t, id, "cat", "/proc/self/mountinfo").GetStdout())), "\n") {
		// mountinfo(5): ID PARENT MAJ:MIN ROOT MOUNT-POINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER-OPTIONS
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 6 || len(g) < 1 {
			t.Fatalf("mountinfo line %q", line)
		}
		mountPoint, options, fsType := f[4], strings.Split(f[5], ","), g[0]
		if mountPoint == "/" {
			if fsType != env.snapshotter && env.snapshotter == "btrfs" {
				t.Errorf("the sandbox's root is %s, want the quota-limited btrfs snapshot", fsType)
			}
			continue
		}
		if memoryBacked[fsType] || slices.Contains(options, "ro") {
			continue
		}
		probe := mountPoint + "/.berth-disk-probe"
		if r := run(t, id, "sh", "-c", "echo x >"+probe+" && rm "+probe); r.GetResult().GetExitCode() == 0 {
			writable = append(writable, mountPoint)
		}
	}
	if !slices.Equal(writable, knownHostDiskGaps) {
		t.Errorf("host disk the workload can write: %q, want only the known gaps %q (a gap closed: take it off knownHostDiskGaps)", writable, knownHostDiskGaps)
	}
}
