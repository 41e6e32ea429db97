package client_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// The examples run against a stand-in for berthd started at package
// initialization: berthdAddr is its address (point it at a real berthd,
// "unix:///run/berth/berthd.sock", and they work the same), and
// archivePath an image archive made for ImportImage. The stand-in knows
// the sandboxes "my-sandbox" and "ci-7" and plays the few commands the
// examples run, as a sandbox would.
var (
	berthdAddr  string
	archivePath string
)

func init() {
	dir, err := os.MkdirTemp("", "berth-examples")
	if err != nil {
		panic(err)
	}
	archivePath = filepath.Join(dir, "base.oci.tar")
	if err := os.WriteFile(archivePath, []byte("an OCI image archive\n"), 0o600); err != nil {
		panic(err)
	}
	sock := filepath.Join(dir, "berthd.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		panic(err)
	}
	s := &standIn{
		sandboxes: map[string]*berthv1.Sandbox{
			"my-sandbox": {Id: "my-sandbox", Image: "berth.dev/base:latest", State: berthv1.SandboxState_SANDBOX_STATE_RUNNING, Labels: map[string]string{"owner": "dev"}},
			"ci-7":       {Id: "ci-7", Image: "berth.dev/base:latest", State: berthv1.SandboxState_SANDBOX_STATE_RUNNING, Labels: map[string]string{"owner": "ci"}},
		},
		execs: map[string]*standInExec{},
	}
	srv := grpc.NewServer()
	berthv1.RegisterSandboxServiceServer(srv, s)
	berthv1.RegisterImageServiceServer(srv, s)
	go srv.Serve(lis) // for the test binary's lifetime
	berthdAddr = "unix://" + sock
}

// standIn is the examples' berthd.
type standIn struct {
	berthv1.UnimplementedSandboxServiceServer
	berthv1.UnimplementedImageServiceServer

	mu        sync.Mutex
	sandboxes map[string]*berthv1.Sandbox
	minted    int
	execs     map[string]*standInExec // background execs by id
}

// standInExec is a background exec: its output and, once it ended, its
// result.
type standInExec struct {
	argv   []string
	output []string
	result *berthv1.ExecResult
	done   chan struct{}
}

func (s *standIn) sandbox(id string) (*berthv1.Sandbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[id]
	if !ok {
		return nil, rpcstatus.Error(codes.NotFound, rpcstatus.ReasonSandboxNotFound, "sandbox "+id+" not found", map[string]string{"sandbox_id": id})
	}
	return sb, nil
}

func (s *standIn) CreateSandbox(_ context.Context, req *berthv1.CreateSandboxRequest) (*berthv1.CreateSandboxResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.minted++
	sb := &berthv1.Sandbox{Id: fmt.Sprintf("sb-%d", s.minted), Image: req.GetImage(), Labels: req.GetLabels(), State: berthv1.SandboxState_SANDBOX_STATE_RUNNING}
	s.sandboxes[sb.Id] = sb
	return &berthv1.CreateSandboxResponse{Sandbox: sb}, nil
}

func (s *standIn) GetSandbox(_ context.Context, req *berthv1.GetSandboxRequest) (*berthv1.GetSandboxResponse, error) {
	sb, err := s.sandbox(req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	return &berthv1.GetSandboxResponse{Sandbox: sb}, nil
}

func (s *standIn) DeleteSandbox(_ context.Context, req *berthv1.DeleteSandboxRequest) (*berthv1.DeleteSandboxResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.sandboxes, req.GetSandboxId())
	return &berthv1.DeleteSandboxResponse{}, nil
}

func (s *standIn) ListSandboxes(_ context.Context, req *berthv1.ListSandboxesRequest) (*berthv1.ListSandboxesResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &berthv1.ListSandboxesResponse{}
outer:
	for _, sb := range s.sandboxes {
		for k, v := range req.GetLabelSelector() {
			if sb.GetLabels()[k] != v {
				continue outer
			}
		}
		resp.Sandboxes = append(resp.Sandboxes, sb)
	}
	return resp, nil
}

func (s *standIn) Run(_ context.Context, req *berthv1.RunRequest) (*berthv1.RunResponse, error) {
	if _, err := s.sandbox(req.GetSandboxId()); err != nil {
		return nil, err
	}
	if strings.Join(req.GetProcess().GetArgv(), " ") != "uname -a" {
		return &berthv1.RunResponse{Result: &berthv1.ExecResult{ExitCode: proto.Int32(127)}, Stderr: []byte("command not found\n")}, nil
	}
	return &berthv1.RunResponse{ExecId: "ex-1", Result: &berthv1.ExecResult{ExitCode: proto.Int32(0)},
		Stdout: []byte("Linux my-sandbox 6.1.0 #1 SMP x86_64 GNU/Linux\n")}, nil
}

func (s *standIn) ListExecs(_ context.Context, req *berthv1.ListExecsRequest) (*berthv1.ListExecsResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &berthv1.ListExecsResponse{}
	for id, x := range s.execs {
		state := berthv1.ExecState_EXEC_STATE_RUNNING
		if x.result != nil {
			state = berthv1.ExecState_EXEC_STATE_EXITED
		}
		resp.Execs = append(resp.Execs, &berthv1.ExecInfo{ExecId: id, State: state, Argv: x.argv, Pid: 42})
	}
	return resp, nil
}

func (s *standIn) SignalExec(_ context.Context, req *berthv1.SignalExecRequest) (*berthv1.SignalExecResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	x, ok := s.execs[req.GetExecId()]
	if !ok {
		return nil, rpcstatus.Error(codes.NotFound, rpcstatus.ReasonExecNotFound, "exec "+req.GetExecId()+" not found", nil)
	}
	if x.result == nil {
		x.result = killedBy(req.GetSignal())
		close(x.done)
	}
	return &berthv1.SignalExecResponse{State: berthv1.ExecState_EXEC_STATE_EXITED}, nil
}

// killedBy is the result of a process that a signal's default action ended.
func killedBy(signal string) *berthv1.ExecResult {
	n := map[string]int32{"TERM": 15, "SIGTERM": 15, "INT": 2, "KILL": 9}[strings.ToUpper(signal)]
	return &berthv1.ExecResult{ExitCode: proto.Int32(128 + n), Signal: "SIG" + strings.TrimPrefix(strings.ToUpper(signal), "SIG")}
}

func (s *standIn) ImportImage(stream grpc.ClientStreamingServer[berthv1.ImportImageRequest, berthv1.ImportImageResponse]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	h := sha256.New()
	for {
		msg, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		h.Write(msg.GetChunk())
	}
	img := &berthv1.Image{Name: first.GetHeader().GetName(), Digest: fmt.Sprintf("sha256:%x", h.Sum(nil))}
	return stream.SendAndClose(&berthv1.ImportImageResponse{Images: []*berthv1.Image{img}})
}

type exStream = grpc.BidiStreamingServer[berthv1.ExecRequest, berthv1.ExecResponse]

// Exec plays the examples' commands. One goroutine sends; requests
// arriving after the first are read by another.
func (s *standIn) Exec(stream exStream) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	if a := first.GetAttach(); a != nil {
		return s.attach(stream, a)
	}
	start := first.GetStart()
	if _, err := s.sandbox(start.GetSandboxId()); err != nil {
		return err
	}
	cmd := start.GetProcess().GetShellCommand()
	if cmd == "" {
		cmd = strings.Join(start.GetProcess().GetArgv(), " ")
	}
	id := start.GetExecId()
	if id == "" {
		id = "ex-1"
	}
	if err := stream.Send(&berthv1.ExecResponse{Event: &berthv1.ExecResponse_Started{Started: &berthv1.ExecStarted{
		ExecId: id, Pid: 42, Timeout: durationpb.New(30 * time.Minute)}}}); err != nil {
		return err
	}
	if start.GetBackground() {
		s.mu.Lock()
		s.execs[id] = &standInExec{argv: []string{"sh", "-c", cmd}, output: []string{"Serving HTTP on 0.0.0.0 port 8000 ...\n"}, done: make(chan struct{})}
		s.mu.Unlock()
		return nil
	}
	reqs := make(chan *berthv1.ExecRequest)
	go func() {
		defer close(reqs)
		for {
			req, err := stream.Recv()
			if err != nil {
				return
			}
			select {
			case reqs <- req:
			case <-stream.Context().Done():
				return
			}
		}
	}()
	seq := uint64(0)
	out := func(data string) error {
		seq++
		return stream.Send(&berthv1.ExecResponse{Event: &berthv1.ExecResponse_Output{Output: &berthv1.ExecOutput{Seq: seq, Stream: berthv1.Stream_STREAM_STDOUT, Data: []byte(data)}}})
	}
	exit := func(res *berthv1.ExecResult) error {
		return stream.Send(&berthv1.ExecResponse{Event: &berthv1.ExecResponse_Exited{Exited: &berthv1.ExecExited{Result: res}}})
	}
	ok := &berthv1.ExecResult{ExitCode: proto.Int32(0)}
	switch cmd {
	case "ls -l /workspace":
		if err := out("total 4\n-rw-r--r-- 1 root root 6 Nov 29 13:00 notes.txt\n"); err != nil {
			return err
		}
		return exit(ok)
	case "make test":
		if err := out("ok  \tall tests passed\n"); err != nil {
			return err
		}
		return exit(ok)
	case "tr a-z A-Z": // stdin to stdout, upper-cased, until EOF
		for req := range reqs {
			if req.GetCloseStdin() != nil {
				break
			}
			if err := out(strings.ToUpper(string(req.GetStdin().GetData()))); err != nil {
				return err
			}
		}
		return exit(ok)
	case "sleep 600": // until a signal
		for req := range reqs {
			if sig := req.GetSignal(); sig != nil {
				return exit(killedBy(sig.GetSignal()))
			}
		}
		return nil
	case "read line; stty size": // on a terminal: echoes the line, then its size
		tty := start.GetProcess().GetTty()
		rows, cols := tty.GetRows(), tty.GetCols()
		for req := range reqs {
			switch {
			case req.GetResize() != nil:
				rows, cols = req.GetResize().GetRows(), req.GetResize().GetCols()
			case strings.Contains(string(req.GetStdin().GetData()), "\n"):
				if err := out(fmt.Sprintf("\r\n%d %d\r\n", rows, cols)); err != nil {
					return err
				}
				return exit(ok)
			}
		}
		return nil
	}
	if err := out("sh: " + cmd + ": not found\n"); err != nil {
		return err
	}
	return exit(&berthv1.ExecResult{ExitCode: proto.Int32(127)})
}

// attach replays a background exec's output and, once it ended, its
// result.
func (s *standIn) attach(stream exStream, a *berthv1.ExecAttach) error {
	s.mu.Lock()
	x, ok := s.execs[a.GetExecId()]
	s.mu.Unlock()
	if !ok {
		return rpcstatus.Error(codes.NotFound, rpcstatus.ReasonExecNotFound, "exec "+a.GetExecId()+" not found", nil)
	}
	if err := stream.Send(&berthv1.ExecResponse{Event: &berthv1.ExecResponse_Started{Started: &berthv1.ExecStarted{ExecId: a.GetExecId(), Pid: 42}}}); err != nil {
		return err
	}
	for i, data := range x.output {
		if seq := uint64(i + 1); seq > a.GetSinceSeq() {
			if err := stream.Send(&berthv1.ExecResponse{Event: &berthv1.ExecResponse_Output{Output: &berthv1.ExecOutput{Seq: seq, Stream: berthv1.Stream_STREAM_STDOUT, Data: []byte(data)}}}); err != nil {
				return err
			}
		}
	}
	select {
	case <-x.done:
	case <-stream.Context().Done():
		return stream.Context().Err()
	}
	s.mu.Lock()
	res := x.result
	s.mu.Unlock()
	return stream.Send(&berthv1.ExecResponse{Event: &berthv1.ExecResponse_Exited{Exited: &berthv1.ExecExited{Result: res}}})
}
