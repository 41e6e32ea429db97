package client_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// fakeSandboxes is a small SandboxService that follows the Exec protocol
// (started, contiguous output seqs, dropped notes, exited last) with scripted
// processes chosen by argv[0]:
//
//	bytes     binary and split UTF-8 output on both streams, a heartbeat,
//	          a dropped note, exit code 3
//	cat       echoes each stdin message as one stdout event; on close_stdin
//	          reports the stdin message sizes, the signal count and any
//	          resizes on stderr and exits 0
//	sleep     heartbeats until a signal, then exits 128+N
//	hang      never starts
//	badfirst  sends output before started
//	gap       skips a sequence number
//	dup       repeats an output event
//	noexit    ends the stream without exited
//
// A start with a tty first prints "tty=ROWSxCOLS\n"; a background start
// ends after started.
//
// The exec "done-exec" of sandbox "sb-1" can be attached to: it retains
// events 3..5 of 5.
type fakeSandboxes struct {
	berthv1.UnimplementedSandboxServiceServer

	mu        sync.Mutex
	sandboxes map[string]*berthv1.Sandbox
	listReqs  []*berthv1.ListSandboxesRequest
	minted    int
}

var _ berthv1.SandboxServiceServer = (*fakeSandboxes)(nil)

var sandboxIDPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

var testCreated = timestamppb.New(time.Date(2026, 11, 29, 13, 0, 0, 0, time.UTC))

func newFakeSandboxes() *fakeSandboxes {
	return &fakeSandboxes{sandboxes: map[string]*berthv1.Sandbox{
		"sb-1": {Id: "sb-1", Image: "busybox", State: berthv1.SandboxState_SANDBOX_STATE_RUNNING, CreatedAt: testCreated},
	}}
}

func sandboxNotFound(id string) error {
	return rpcstatus.Error(codes.NotFound, rpcstatus.ReasonSandboxNotFound, fmt.Sprintf("sandbox %q not found", id), map[string]string{"sandbox_id": id})
}

func (s *fakeSandboxes) CreateSandbox(_ context.Context, req *berthv1.CreateSandboxRequest) (*berthv1.CreateSandboxResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := req.GetSandboxId()
	if id == "" {
		s.minted++
		id = fmt.Sprintf("minted-%d", s.minted)
	}
	if !sandboxIDPattern.MatchString(id) {
		return nil, rpcstatus.InvalidArgument("sandbox_id", "must be 1 to 63 characters from [a-z0-9-]")
	}
	if req.GetImage() != "busybox" {
		return nil, rpcstatus.Error(codes.NotFound, rpcstatus.ReasonImageNotFound, fmt.Sprintf("image %q not found", req.GetImage()), nil)
	}
	if sb, ok := s.sandboxes[id]; ok {
		if sb.GetImage() != req.GetImage() || !maps.Equal(sb.GetLabels(), req.GetLabels()) {
			return nil, rpcstatus.Error(codes.AlreadyExists, rpcstatus.ReasonSandboxExists, fmt.Sprintf("sandbox %q exists with another spec", id), nil)
		}
		return &berthv1.CreateSandboxResponse{Sandbox: sb}, nil
	}
	sb := &berthv1.Sandbox{
		Id:        id,
		Image:     req.GetImage(),
		State:     berthv1.SandboxState_SANDBOX_STATE_RUNNING,
		Labels:    req.GetLabels(),
		CreatedAt: testCreated,
		Runtime:   &berthv1.RuntimeIdentity{AgentBootId: "boot-" + id, TaskPid: 1234},
		Resources: req.GetResources(),
	}
	s.sandboxes[id] = sb
	return &berthv1.CreateSandboxResponse{Sandbox: sb}, nil
}

func (s *fakeSandboxes) GetSandbox(_ context.Context, req *berthv1.GetSandboxRequest) (*berthv1.GetSandboxResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[req.GetSandboxId()]
	if !ok {
		return nil, sandboxNotFound(req.GetSandboxId())
	}
	return &berthv1.GetSandboxResponse{Sandbox: sb}, nil
}

// fakePageSize is the fake's page size, whatever the request asks: the API
// lets a server return fewer than page_size.
const fakePageSize = 2

func (s *fakeSandboxes) ListSandboxes(_ context.Context, req *berthv1.ListSandboxesRequest) (*berthv1.ListSandboxesResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.listReqs = append(s.listReqs, req)
	var page []*berthv1.Sandbox
	for _, id := range slices.Sorted(maps.Keys(s.sandboxes)) {
		sb := s.sandboxes[id]
		if id <= req.GetPageToken() {
			continue
		}
		match := true
		for k, v := range req.GetLabelSelector() {
			if got, ok := sb.GetLabels()[k]; !ok || got != v {
				match = false
			}
		}
		if !match {
			continue
		}
		if len(page) == fakePageSize {
			return &berthv1.ListSandboxesResponse{Sandboxes: page, NextPageToken: page[len(page)-1].GetId()}, nil
		}
		page = append(page, sb)
	}
	return &berthv1.ListSandboxesResponse{Sandboxes: page}, nil
}

func (s *fakeSandboxes) DeleteSandbox(_ context.Context, req *berthv1.DeleteSandboxRequest) (*berthv1.DeleteSandboxResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.sandboxes, req.GetSandboxId())
	return &berthv1.DeleteSandboxResponse{}, nil
}

func (s *fakeSandboxes) exists(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.sandboxes[id]
	return ok
}

func (s *fakeSandboxes) Run(_ context.Context, req *berthv1.RunRequest) (*berthv1.RunResponse, error) {
	if !s.exists(req.GetSandboxId()) {
		return nil, sandboxNotFound(req.GetSandboxId())
	}
	if req.GetProcess().GetStdin() {
		return nil, rpcstatus.InvalidArgument("process.stdin", "must be false for Run")
	}
	return &berthv1.RunResponse{
		ExecId: cmpOr(req.GetExecId(), "exec-1"),
		Result: &berthv1.ExecResult{ExitCode: proto.Int32(0), StdoutBytes: 5, StderrBytes: 4},
		Stdout: []byte("out\x00\xff"),
		Stderr: []byte("err\n"),
	}, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

type execStream = grpc.BidiStreamingServer[berthv1.ExecRequest, berthv1.ExecResponse]

// session numbers a stream's output events.
type session struct {
	stream execStream
	seq    uint64
}

func (x *session) out(st berthv1.Stream, data string) error {
	x.seq++
	return x.stream.Send(outputEvent(x.seq, st, data))
}

func outputEvent(seq uint64, st berthv1.Stream, data string) *berthv1.ExecResponse {
	return &berthv1.ExecResponse{Event: &berthv1.ExecResponse_Output{Output: &berthv1.ExecOutput{Seq: seq, Stream: st, Data: []byte(data)}}}
}

func exitedEvent(res *berthv1.ExecResult) *berthv1.ExecResponse {
	return &berthv1.ExecResponse{Event: &berthv1.ExecResponse_Exited{Exited: &berthv1.ExecExited{Result: res}}}
}

func heartbeatEvent(last uint64) *berthv1.ExecResponse {
	return &berthv1.ExecResponse{Event: &berthv1.ExecResponse_Heartbeat{Heartbeat: &berthv1.ExecHeartbeat{LastSeq: last}}}
}

func droppedEvent(first, last, n uint64) *berthv1.ExecResponse {
	return &berthv1.ExecResponse{Event: &berthv1.ExecResponse_Dropped{Dropped: &berthv1.ExecDropped{FirstSeq: first, LastSeq: last, LostBytes: n}}}
}

func startedEvent(id string) *berthv1.ExecResponse {
	return &berthv1.ExecResponse{Event: &berthv1.ExecResponse_Started{Started: &berthv1.ExecStarted{
		ExecId: id, Pid: 42, Timeout: durationpb.New(30 * time.Second), StdoutLimitBytes: 1 << 20, StderrLimitBytes: 1 << 20,
	}}}
}

const (
	stdout = berthv1.Stream_STREAM_STDOUT
	stderr = berthv1.Stream_STREAM_STDERR
)

// bytesResult is the result of the "bytes" process.
var bytesResult = &berthv1.ExecResult{
	ExitCode:    proto.Int32(3),
	Duration:    durationpb.New(1500 * time.Millisecond),
	StdoutBytes: 8,
	StderrBytes: 15,
	UserCpu:     durationpb.New(time.Millisecond),
	MaxRssBytes: 4 << 20,
}

func (s *fakeSandboxes) Exec(stream execStream) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	switch ev := first.GetEvent().(type) {
	case *berthv1.ExecRequest_Start:
		return s.start(stream, ev.Start)
	case *berthv1.ExecRequest_Attach:
		return s.attach(stream, ev.Attach)
	}
	return rpcstatus.InvalidArgument("event", "the first message must be start or attach")
}

func (s *fakeSandboxes) start(stream execStream, start *berthv1.ExecStart) error {
	if !s.exists(start.GetSandboxId()) {
		return sandboxNotFound(start.GetSandboxId())
	}
	argv := start.GetProcess().GetArgv()
	if len(argv) == 0 {
		return rpcstatus.InvalidArgument("process.argv", "must not be empty")
	}
	switch argv[0] {
	case "hang":
		<-stream.Context().Done()
		return stream.Context().Err()
	case "badfirst":
		return stream.Send(outputEvent(1, stdout, "early"))
	}
	if err := stream.Send(startedEvent(cmpOr(start.GetExecId(), "exec-1"))); err != nil {
		return err
	}
	if start.GetBackground() {
		return nil
	}
	x := &session{stream: stream}
	if tty := start.GetProcess().GetTty(); tty != nil {
		if err := x.out(stdout, fmt.Sprintf("tty=%dx%d\n", tty.GetRows(), tty.GetCols())); err != nil {
			return err
		}
	}
	switch argv[0] {
	case "bytes":
		for _, step := range []func() error{
			func() error { return x.out(stdout, "a\x00b") },
			func() error { return x.out(stderr, "\xff") },
			func() error { return x.out(stdout, "\xe2\x82") }, // the first two bytes of "€"
			func() error { return stream.Send(heartbeatEvent(x.seq)) },
			func() error { return x.out(stdout, "\xac\n") },
			func() error { x.seq += 2; return stream.Send(droppedEvent(5, 6, 10)) },
			func() error { return x.out(stderr, "\xf0\x9f") }, // "😀" split in two
			func() error { return x.out(stderr, "\x98\x80") },
			func() error { return stream.Send(exitedEvent(bytesResult)) },
		} {
			if err := step(); err != nil {
				return err
			}
		}
		return nil
	case "gap":
		if err := x.out(stdout, "a"); err != nil {
			return err
		}
		if err := stream.Send(outputEvent(3, stdout, "c")); err != nil {
			return err
		}
		return stream.Send(exitedEvent(&berthv1.ExecResult{}))
	case "dup":
		for _, ev := range []*berthv1.ExecResponse{
			outputEvent(1, stdout, "a"), outputEvent(1, stdout, "a"), outputEvent(2, stdout, "b"), exitedEvent(&berthv1.ExecResult{}),
		} {
			if err := stream.Send(ev); err != nil {
				return err
			}
		}
		return nil
	case "noexit":
		return x.out(stdout, "a")
	case "badstream":
		return x.out(berthv1.Stream(7), "a")
	case "big":
		for i, size := range bigSizes {
			st := stdout
			if i%2 == 1 {
				st = stderr
			}
			if err := x.out(st, string(bigData(i, size))); err != nil {
				return err
			}
		}
		return stream.Send(exitedEvent(&berthv1.ExecResult{}))
	case "cat", "sleep":
		return interact(x, argv[0])
	}
	return stream.Send(exitedEvent(&berthv1.ExecResult{ExitCode: proto.Int32(127)}))
}

// bigSizes are the sizes of the "big" process's output events, stdout and
// stderr in turn: larger than gRPC's 16 KiB data frames, so that an event
// arrives in several buffers, and small ones between.
var bigSizes = []int{1, 300 << 10, 70000, 5, 256<<10 + 3, 16 << 10}

// bigData is the content of the "big" process's event i: no two offsets
// of an event alike within 251 bytes, and events unlike each other.
func bigData(i, size int) []byte {
	b := make([]byte, size)
	for k := range b {
		b[k] = byte((k + i*7) % 251)
	}
	return b
}

var signalNumbers = map[string]int32{"INT": 2, "TERM": 15, "USR1": 10}

// interact runs "cat" and "sleep". Only this goroutine sends; a helper
// goroutine receives, and ends when the handler returns.
func interact(x *session, name string) error {
	ctx := x.stream.Context()
	reqs := make(chan *berthv1.ExecRequest)
	recvErr := make(chan error, 1)
	go func() {
		for {
			req, err := x.stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reqs <- req:
			case <-ctx.Done():
				return
			}
		}
	}()
	heartbeat := time.NewTicker(20 * time.Millisecond)
	defer heartbeat.Stop()
	var sizes, resizes []string
	signals := 0
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				// The client half-closed without close_stdin; keep running
				// until the process would end.
				<-ctx.Done()
				return ctx.Err()
			}
			return err
		case <-heartbeat.C:
			if name == "sleep" {
				if err := x.stream.Send(heartbeatEvent(x.seq)); err != nil {
					return err
				}
			}
		case req := <-reqs:
			switch ev := req.GetEvent().(type) {
			case *berthv1.ExecRequest_Stdin:
				sizes = append(sizes, fmt.Sprint(len(ev.Stdin.GetData())))
				if err := x.out(stdout, string(ev.Stdin.GetData())); err != nil {
					return err
				}
			case *berthv1.ExecRequest_Resize:
				resizes = append(resizes, fmt.Sprintf("%dx%d", ev.Resize.GetRows(), ev.Resize.GetCols()))
			case *berthv1.ExecRequest_CloseStdin:
				report := fmt.Sprintf("stdin-sizes=%s signals=%d", strings.Join(sizes, ","), signals)
				if len(resizes) > 0 {
					report += " resizes=" + strings.Join(resizes, ",")
				}
				report += "\n"
				if err := x.out(stderr, report); err != nil {
					return err
				}
				return x.stream.Send(exitedEvent(&berthv1.ExecResult{ExitCode: proto.Int32(0)}))
			case *berthv1.ExecRequest_Signal:
				n, ok := signalNumbers[strings.TrimPrefix(strings.ToUpper(ev.Signal.GetSignal()), "SIG")]
				if !ok {
					return rpcstatus.InvalidArgument("signal", "unknown signal")
				}
				signals++
				if name == "sleep" {
					return x.stream.Send(exitedEvent(&berthv1.ExecResult{
						ExitCode: proto.Int32(128 + n),
						Signal:   "SIG" + strings.TrimPrefix(strings.ToUpper(ev.Signal.GetSignal()), "SIG"),
					}))
				}
			default:
				return rpcstatus.InvalidArgument("event", "start and attach must come first")
			}
		}
	}
}

// doneExecEvents are the events of exec "done-exec", of which the ring
// retains seqs 3 to 5.
var doneExecEvents = []*berthv1.ExecOutput{
	{Seq: 1, Stream: stdout, Data: []byte("one\n")},
	{Seq: 2, Stream: stdout, Data: []byte("two\n")},
	{Seq: 3, Stream: stdout, Data: []byte("three\n")},
	{Seq: 4, Stream: stderr, Data: []byte("four\n")},
	{Seq: 5, Stream: stdout, Data: []byte("five\n")},
}

const doneExecFirstRetained = 3

func (s *fakeSandboxes) attach(stream execStream, a *berthv1.ExecAttach) error {
	if !s.exists(a.GetSandboxId()) {
		return sandboxNotFound(a.GetSandboxId())
	}
	if a.GetExecId() != "done-exec" {
		return rpcstatus.Error(codes.NotFound, rpcstatus.ReasonExecNotFound, fmt.Sprintf("exec %q not found", a.GetExecId()), nil)
	}
	if err := stream.Send(startedEvent("done-exec")); err != nil {
		return err
	}
	since := a.GetSinceSeq()
	if since+1 < doneExecFirstRetained {
		var lost uint64
		for _, o := range doneExecEvents[since : doneExecFirstRetained-1] {
			lost += uint64(len(o.GetData()))
		}
		if err := stream.Send(droppedEvent(since+1, doneExecFirstRetained-1, lost)); err != nil {
			return err
		}
	}
	for _, o := range doneExecEvents[doneExecFirstRetained-1:] {
		if o.GetSeq() <= since {
			continue
		}
		if err := stream.Send(&berthv1.ExecResponse{Event: &berthv1.ExecResponse_Output{Output: o}}); err != nil {
			return err
		}
	}
	return stream.Send(exitedEvent(&berthv1.ExecResult{ExitCode: proto.Int32(0), StdoutBytes: 18, StderrBytes: 5}))
}

// fakeExecs are the execs ListExecs reports for "sb-1".
var fakeExecs = []*berthv1.ExecInfo{
	{ExecId: "running-exec", State: berthv1.ExecState_EXEC_STATE_RUNNING, Argv: []string{"sleep", "30"}, Pid: 7, StartedAt: testCreated},
	{ExecId: "done-exec", State: berthv1.ExecState_EXEC_STATE_EXITED, Argv: []string{"/bin/sh", "-c", "echo"}, Pid: 8, StartedAt: testCreated,
		LastSeq: 5, Result: &berthv1.ExecResult{StdoutBytes: 18, StderrBytes: 5}},
}

func (s *fakeSandboxes) ListExecs(_ context.Context, req *berthv1.ListExecsRequest) (*berthv1.ListExecsResponse, error) {
	if !s.exists(req.GetSandboxId()) {
		return nil, sandboxNotFound(req.GetSandboxId())
	}
	return &berthv1.ListExecsResponse{Execs: fakeExecs, Omitted: 3}, nil
}

func (s *fakeSandboxes) SignalExec(_ context.Context, req *berthv1.SignalExecRequest) (*berthv1.SignalExecResponse, error) {
	if !s.exists(req.GetSandboxId()) {
		return nil, sandboxNotFound(req.GetSandboxId())
	}
	if _, ok := signalNumbers[strings.TrimPrefix(strings.ToUpper(req.GetSignal()), "SIG")]; !ok {
		return nil, rpcstatus.InvalidArgument("signal", fmt.Sprintf("%q is not a signal name", req.GetSignal()))
	}
	for _, e := range fakeExecs {
		if e.GetExecId() == req.GetExecId() {
			return &berthv1.SignalExecResponse{State: e.GetState()}, nil
		}
	}
	return nil, rpcstatus.Error(codes.NotFound, rpcstatus.ReasonExecNotFound, fmt.Sprintf("exec %q not found", req.GetExecId()), nil)
}

// fakeImages stores imported archives' digests and reports each import's
// outcome on imports.
type fakeImages struct {
	berthv1.UnimplementedImageServiceServer
	imports chan importOutcome
}

var _ berthv1.ImageServiceServer = (*fakeImages)(nil)

type importOutcome struct {
	name       string
	chunkSizes []int
	digest     string
	err        error // the stream's error when it did not end with EOF
}

func (f *fakeImages) ImportImage(stream grpc.ClientStreamingServer[berthv1.ImportImageRequest, berthv1.ImportImageResponse]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	header := first.GetHeader()
	if header == nil {
		return rpcstatus.InvalidArgument("header", "the first message must be the header")
	}
	o := importOutcome{name: header.GetName()}
	h := sha256.New()
	var size uint64
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			o.err = err
			f.imports <- o
			return err
		}
		o.chunkSizes = append(o.chunkSizes, len(req.GetChunk()))
		h.Write(req.GetChunk())
		size += uint64(len(req.GetChunk()))
	}
	o.digest = fmt.Sprintf("sha256:%x", h.Sum(nil))
	f.imports <- o
	if size == 0 {
		return rpcstatus.Error(codes.InvalidArgument, rpcstatus.ReasonImageArchive, "empty archive", nil)
	}
	return stream.SendAndClose(&berthv1.ImportImageResponse{Images: []*berthv1.Image{
		{Name: cmpOr(o.name, "imported:latest"), Digest: o.digest, SizeBytes: size, CreatedAt: testCreated},
	}})
}

var fakeImageList = []*berthv1.Image{
	{Name: "berth.dev/base:latest", Digest: "sha256:aa", SizeBytes: 1234, CreatedAt: testCreated},
	{Name: "busybox", Digest: "sha256:bb", SizeBytes: 99, CreatedAt: testCreated},
}

func (f *fakeImages) ListImages(context.Context, *berthv1.ListImagesRequest) (*berthv1.ListImagesResponse, error) {
	return &berthv1.ListImagesResponse{Images: fakeImageList}, nil
}
