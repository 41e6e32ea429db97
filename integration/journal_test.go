package integration

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/leases"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/berth-sandbox/berth/internal/procfs"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// TestJournalFullFailsClosed fills the file system under berthd's journal
// directory (a 64 KiB tmpfs): a start berthd cannot record is refused with
// UNAVAILABLE JOURNAL_UNAVAILABLE and runs nothing; after the sandbox's
// runtime is replaced and berthd restarts, a start reusing an exec id spent
// before the fill is STALE_HANDLE, and the refused one runs once the
// journal has room again.
func TestJournalFullFailsClosed(t *testing.T) {
	need(t)
	rt, ns, stateDir := newNamespaceRuntime(t, "jf")
	e := &berthEnv{ns: ns, stateDir: stateDir, rt: rt, sock: filepath.Join(env.dir, "jf.sock")}
	journal := filepath.Join(env.dir, "jf-journal")
	if err := os.Mkdir(journal, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("berth-test-journal", journal, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=64k,mode=0700"); err != nil {
		t.Fatalf("mount a 64 KiB tmpfs at %s: %v", journal, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(journal, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", journal, err)
		}
	})
	p1 := startBerthd(t, e, "--journal-dir", journal)
	e.importBase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	created, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: "jf", Image: baseImage})
	if err != nil {
		t.Fatal(err)
	}
	before := created.GetSandbox().GetRuntime()
	files := berthv1.NewFileServiceClient(e.conn)
	runID := func(execID, cmd string) (*berthv1.RunResponse, error) {
		return e.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: "jf", ExecId: execID, Process: &berthv1.ProcessSpec{ShellCommand: cmd}})
	}
	if resp, err := runID("spent", "echo spent >>/workspace/ran"); err != nil || resp.GetResult().GetExitCode() != 0 {
		t.Fatalf("Run(spent) = %v, %v", resp, err)
	}

	// Fill the last page of the sandbox's journal (tmpfs allocates 4 KiB
	// pages) with records that change nothing, then the journal's file
	// system: the next record needs a page there is no room for.
	padJournal(t, filepath.Join(journal, "jf.journal"))
	fill := filepath.Join(journal, "fill")
	if err := os.WriteFile(fill, make([]byte, 1<<20), 0o600); !errorsIsENOSPC(err) {
		t.Fatalf("filling %s: %v, want ENOSPC", journal, err)
	}
	_, err = runID("blocked", "echo blocked >>/workspace/ran")
	wantStatus(t, err, codes.Unavailable, rpcstatus.ReasonJournalUnavailable, "", "exec blocked not started", "no space left on device", "nothing ran")
	if got := listExecs(t, e.sandboxes, "jf"); got["blocked"] != nil || got["spent"] == nil {
		t.Errorf("ListExecs after the refused start = %v, want spent and not blocked", got)
	}
	read, err := files.ReadFile(ctx, &berthv1.ReadFileRequest{SandboxId: "jf", Location: &berthv1.ReadFileRequest_Path{Path: "/workspace/ran"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, read); got != "spent\n" {
		t.Errorf("/workspace/ran = %q, want only spent's line", got)
	}

	// A new runtime (berthd restarts the killed task), then a new berthd.
	signalAgent(t, before.GetTaskPid(), syscall.SIGKILL)
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := e.sandboxes.GetSandbox(ctx, &berthv1.GetSandboxRequest{SandboxId: "jf"})
		got := resp.GetSandbox()
		if err == nil && got.GetState() == berthv1.SandboxState_SANDBOX_STATE_RUNNING && got.GetRuntime().GetAgentBootId() != "" &&
			got.GetRuntime().GetAgentBootId() != before.GetAgentBootId() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new runtime within 30 s: %v, %v", got, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := p1.signal(t, syscall.SIGTERM); err != nil {
		t.Fatalf("berthd after SIGTERM: %v", err)
	}
	startBerthd(t, e, "--journal-dir", journal)
	_, err = runID("spent", "echo spent again >>/workspace/ran")
	wantStatus(t, err, codes.FailedPrecondition, rpcstatus.ReasonStaleHandle, "")
	_, err = runID("blocked", "echo blocked >>/workspace/ran")
	wantStatus(t, err, codes.Unavailable, rpcstatus.ReasonJournalUnavailable, "")

	if err := os.Remove(fill); err != nil {
		t.Fatal(err)
	}
	// The task restart kept the container's snapshot: spent's line is there.
	if resp, err := runID("blocked", "echo blocked >>/workspace/ran; cat /workspace/ran"); err != nil || string(resp.GetStdout()) != "spent\nblocked\n" {
		t.Errorf("Run(blocked) with room again = %q, %v; want spent's and blocked's line once each", resp.GetStdout(), err)
	}
}

// padJournal appends retractions of exec ids never started (records the
// journal's reader accepts and that change nothing), sealed as berthd
// seals them ("<record> <CRC-32C, 8 hex digits>"), until the file ends at
// a page boundary.
func padJournal(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	rest := int(4096 - st.Size()%4096)
	if rest == 4096 {
		return
	}
	// A line is 45 bytes and its exec id (1-128 bytes).
	line := func(n int) string {
		rec := "x " + strings.Repeat("0", 32) + " " + strings.Repeat("p", n-45)
		return fmt.Sprintf("%s %08x\n", rec, crc32.Checksum([]byte(rec), crc32.MakeTable(crc32.Castagnoli)))
	}
	if rest < 92 {
		rest += 4096
	}
	var pad strings.Builder
	for rest > 346 {
		pad.WriteString(line(145))
		rest -= 145
	}
	if rest <= 173 {
		pad.WriteString(line(rest))
	} else {
		pad.WriteString(line(rest / 2))
		pad.WriteString(line(rest - rest/2))
	}
	if _, err := f.WriteString(pad.String()); err != nil {
		t.Fatalf("pad %s: %v", path, err)
	}
}

func errorsIsENOSPC(err error) bool { return errors.Is(err, syscall.ENOSPC) }

// readAll collects a ReadFile stream's chunks.
func readAll(t *testing.T, stream berthv1.FileService_ReadFileClient) string {
	t.Helper()
	var b []byte
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return string(b)
		}
		if err != nil {
			t.Fatalf("ReadFile: %v", err)
		}
		b = append(b, msg.GetChunk()...)
	}
}

// TestOrphanLeasesDropped: leases of a berthd that died (its pid is gone,
// or is a process started later) are deleted when the next berthd starts
// on the namespace, so that what they held for work cut off (an unpack, a
// chowned copy, an import) is collected at once, not after the lease
// expires. Leases of a berthd that still runs, and leases berthd did not
// take, stay.
func TestOrphanLeasesDropped(t *testing.T) {
	need(t)
	_, ns, _ := newNamespaceRuntime(t, "orphan")
	cc, err := containerd.New(env.containerd, containerd.WithDefaultNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	// The holder label is "<pid>:<start time in clock ticks>" (proc(5)).
	const holder = "berth.dev/lease-holder"
	self, err := procfs.Stat(uint32(os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	start := self[procfs.StartTimeField]
	ls := cc.LeasesService()
	for id, labels := range map[string]map[string]string{
		"of-a-dead-berthd": {holder: fmt.Sprintf("%d:%s", dead.Process.Pid, start)},
		"of-a-live-berthd": {holder: fmt.Sprintf("%d:%s", os.Getpid(), start)}, // the test runs berthd in process
		"of-a-reused-pid":  {holder: fmt.Sprintf("%d:1", os.Getpid())},         // this pid, another start
		"not-berthd-s":     nil,
		"of-a-garbled-pid": {holder: "x"},
	} {
		if _, err := ls.Create(ctx, leases.WithID(id), leases.WithLabels(labels), leases.WithExpiration(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	rt, _, _ := newNamespaceRuntimeWith(t, "orphan", nil)
	if got := rt.OrphanLeases(); got != 3 {
		t.Errorf("OrphanLeases() = %d, want 3 (the dead berthd's, the reused pid's and the garbled one)", got)
	}
	left, err := ls.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, l := range left {
		ids = append(ids, l.ID)
	}
	sort.Strings(ids)
	if strings.Join(ids, " ") != "not-berthd-s of-a-live-berthd" {
		t.Errorf("leases after the start: %q, want the live berthd's and the one berthd did not take", ids)
	}
}

// TestBerthdKilledMidCreate kills the berthd binary (SIGKILL) while a
// CreateSandbox holds its containerd lease — with --root-id-mapping
// chowned, the lease keeps the image's chowned copy in progress — and
// checks that the berthd started next drops the dead berthd's lease (before,
// it kept what the create made for its whole expiry, multi-GB for a large
// image; issue 21), logs so, and that the same create then succeeds and
// runs.
func TestBerthdKilledMidCreate(t *testing.T) {
	need(t)
	e := newBinaryEnv(t, "kmc")
	p := startBerthd(t, e, "--root-id-mapping", "chowned")
	e.importBase(t)
	cc, err := containerd.New(env.containerd, containerd.WithDefaultNamespace(e.ns))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const holderLabel = "berth.dev/lease-holder"
	held := func(pid int) []leases.Lease {
		ls, err := cc.LeasesService().List(ctx, fmt.Sprintf("labels.%q", holderLabel))
		if err != nil {
			t.Fatalf("list leases: %v", err)
		}
		var out []leases.Lease
		for _, l := range ls {
			if strings.HasPrefix(l.Labels[holderLabel], fmt.Sprintf("%d:", pid)) {
				out = append(out, l)
			}
		}
		return out
	}
	// A create is a few hundred milliseconds on the test image: watch for
	// its lease and kill berthd the moment it is there. A create that
	// finished first is deleted and tried again.
	pid := p.cmd.Process.Pid
	var id string
	var caught []leases.Lease
	for attempt := 0; attempt < 10 && caught == nil; attempt++ {
		id = shortID("kmc")
		done := make(chan error, 1)
		go func() {
			_, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: id, Image: baseImage})
			done <- err
		}()
	watch:
		for {
			if ls := held(pid); len(ls) > 0 {
				caught = ls
				if err := p.cmd.Process.Kill(); err != nil {
					t.Fatal(err)
				}
				<-p.exited
				<-done
				break watch
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("create %s: %v", id, err)
				}
				if _, err := e.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: id}); err != nil {
					t.Fatalf("delete %s: %v", id, err)
				}
				break watch
			default:
			}
		}
	}
	if caught == nil {
		t.Fatal("no create's lease was seen in 10 creates")
	}
	if left := held(pid); len(left) == 0 {
		t.Fatalf("the lease of the killed berthd (%s) went with it: the test caught nothing to clean", caught[0].ID)
	}
	p2 := startBerthd(t, e, "--root-id-mapping", "chowned")
	if left := held(pid); len(left) != 0 {
		t.Errorf("leases of the killed berthd after the next start: %v, want none", left)
	}
	if lines := p2.logLines("dropped the containerd leases of berthds that no longer run"); len(lines) != 1 {
		t.Errorf("log lines for the dropped leases: %q, want one", lines)
	}
	// The cut-off create left either nothing or a sandbox whose task never
	// started (removed at start-up): the same id can be created and run.
	if _, err := e.sandboxes.CreateSandbox(ctx, &berthv1.CreateSandboxRequest{SandboxId: id, Image: baseImage}); err != nil {
		t.Fatalf("create %s again after the restart: %v", id, err)
	}
	res, err := e.sandboxes.Run(ctx, &berthv1.RunRequest{SandboxId: id, Process: &berthv1.ProcessSpec{Argv: []string{"echo", "ok"}}})
	if err != nil {
		t.Fatalf("run in %s: %v", id, err)
	}
	if string(res.GetStdout()) != "ok\n" {
		t.Errorf("run in %s: stdout %q, want \"ok\\n\"", id, res.GetStdout())
	}
	if _, err := e.sandboxes.DeleteSandbox(ctx, &berthv1.DeleteSandboxRequest{SandboxId: id}); err != nil {
		t.Errorf("delete %s: %v", id, err)
	}
}
