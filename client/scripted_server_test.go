package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// scriptedBerthd is a SandboxService that fails calls as scripted, with the
// statuses berthd sends for the runtime conditions, and otherwise succeeds:
// GetSandbox returns the sandbox, Run echoes its argv, Exec starts and exits
// 0 at once, except in sandbox "crashy" whose runtime dies under every exec.
type scriptedBerthd struct {
	berthv1.UnimplementedSandboxServiceServer

	mu     sync.Mutex
	script map[string][]error // per sandbox id: the errors of its next calls
	calls  map[string]int     // per sandbox id: calls made
}

func newScriptedBerthd() *scriptedBerthd {
	return &scriptedBerthd{script: make(map[string][]error), calls: make(map[string]int)}
}

// fail makes the next calls about sandboxID fail with errs, in order.
func (s *scriptedBerthd) fail(sandboxID string, errs ...error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.script[sandboxID] = append(s.script[sandboxID], errs...)
}

func (s *scriptedBerthd) callsTo(sandboxID string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[sandboxID]
}

// next counts a call about sandboxID and returns its scripted error.
func (s *scriptedBerthd) next(sandboxID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[sandboxID]++
	errs := s.script[sandboxID]
	if len(errs) == 0 {
		return nil
	}
	s.script[sandboxID] = errs[1:]
	return errs[0]
}

func (s *scriptedBerthd) GetSandbox(_ context.Context, req *berthv1.GetSandboxRequest) (*berthv1.GetSandboxResponse, error) {
	if err := s.next(req.GetSandboxId()); err != nil {
		return nil, err
	}
	return &berthv1.GetSandboxResponse{Sandbox: &berthv1.Sandbox{Id: req.GetSandboxId(), State: berthv1.SandboxState_SANDBOX_STATE_RUNNING}}, nil
}

func (s *scriptedBerthd) Run(_ context.Context, req *berthv1.RunRequest) (*berthv1.RunResponse, error) {
	if err := s.next(req.GetSandboxId()); err != nil {
		return nil, err
	}
	return &berthv1.RunResponse{ExecId: "ex-1", Result: &berthv1.ExecResult{}, Stdout: []byte(strings.Join(req.GetProcess().GetArgv()[1:], " ") + "\n")}, nil
}

func (s *scriptedBerthd) Exec(stream grpc.BidiStreamingServer[berthv1.ExecRequest, berthv1.ExecResponse]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	sandboxID, execID := first.GetStart().GetSandboxId(), first.GetStart().GetExecId()
	if first.GetAttach() != nil {
		sandboxID, execID = first.GetAttach().GetSandboxId(), first.GetAttach().GetExecId()
	}
	if err := s.next(sandboxID); err != nil {
		return err
	}
	if sandboxID == "slow-open" {
		// A loaded berthd: the stream opens, started never comes in time.
		<-stream.Context().Done()
		return stream.Context().Err()
	}
	if err := stream.Send(&berthv1.ExecResponse{Event: &berthv1.ExecResponse_Started{Started: &berthv1.ExecStarted{ExecId: execID, Pid: 7}}}); err != nil {
		return err
	}
	if sandboxID == "crashy" {
		return replacedStatus(sandboxID, execID)
	}
	return stream.Send(&berthv1.ExecResponse{Event: &berthv1.ExecResponse_Exited{Exited: &berthv1.ExecExited{Result: &berthv1.ExecResult{}}}})
}

// ForkSandbox returns req.Count children named <parent>-<i>, carrying
// req.Labels.
func (s *scriptedBerthd) ForkSandbox(_ context.Context, req *berthv1.ForkSandboxRequest) (*berthv1.ForkSandboxResponse, error) {
	if err := s.next(req.GetSandboxId()); err != nil {
		return nil, err
	}
	resp := &berthv1.ForkSandboxResponse{}
	for i := range req.GetCount() {
		resp.Sandboxes = append(resp.Sandboxes, &berthv1.Sandbox{Id: fmt.Sprintf("%s-%d", req.GetSandboxId(), i),
			State: berthv1.SandboxState_SANDBOX_STATE_RUNNING, Labels: req.GetLabels()})
	}
	return resp, nil
}

// HibernateSandbox answers as a runc berthd: processes ended.
func (s *scriptedBerthd) HibernateSandbox(_ context.Context, req *berthv1.HibernateSandboxRequest) (*berthv1.HibernateSandboxResponse, error) {
	if err := s.next(req.GetSandboxId()); err != nil {
		return nil, err
	}
	return &berthv1.HibernateSandboxResponse{Sandbox: &berthv1.Sandbox{Id: req.GetSandboxId(), State: berthv1.SandboxState_SANDBOX_STATE_HIBERNATED},
		Hibernation: berthv1.Hibernation_HIBERNATION_PROCESSES_ENDED}, nil
}

func (s *scriptedBerthd) CreateSnapshot(_ context.Context, req *berthv1.CreateSnapshotRequest) (*berthv1.CreateSnapshotResponse, error) {
	if err := s.next(req.GetSandboxId()); err != nil {
		return nil, err
	}
	return &berthv1.CreateSnapshotResponse{Snapshot: &berthv1.Snapshot{Id: "snap-00000000000000000001", SandboxId: req.GetSandboxId(), Labels: req.GetLabels()}}, nil
}

// The runtimes of the scripted sandboxes.
var (
	oldRuntime = &berthv1.RuntimeIdentity{AgentBootId: "0a1b2c3d4e5f60718293a4b5c6d7e8f9", TaskPid: 4100}
	newRuntime = &berthv1.RuntimeIdentity{AgentBootId: "f9e8d7c6b5a4938271605f4e3d2c1b0a", TaskPid: 4242}
)

// The statuses berthd sends, built as berthd builds them.

func busyStatus(sandboxID string, delay time.Duration) error {
	return rpcstatus.Error(codes.ResourceExhausted, rpcstatus.ReasonFleetBusy,
		fmt.Sprintf("no capacity for sandbox %s: it runs 4 of at most 4 execs at once; nothing was started, retry after %v", sandboxID, delay),
		map[string]string{"sandbox_id": sandboxID},
		&berthv1.FleetBusy{SandboxId: sandboxID, Resource: berthv1.CapacityResource_CAPACITY_RESOURCE_SANDBOX_EXECS, Limit: 4, InUse: 4, Requested: 1,
			RetryDelay: durationpb.New(delay), Admitted: berthv1.Admitted_ADMITTED_NOT_STARTED},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)})
}

// busyStatusNoDelay is FLEET_BUSY as a proxy that drops RetryInfo and a
// detail without retry_delay would leave it.
func busyStatusNoDelay(sandboxID string) error {
	return rpcstatus.Error(codes.ResourceExhausted, rpcstatus.ReasonFleetBusy, "no capacity for sandbox "+sandboxID,
		map[string]string{"sandbox_id": sandboxID},
		&berthv1.FleetBusy{SandboxId: sandboxID, Resource: berthv1.CapacityResource_CAPACITY_RESOURCE_SANDBOX_EXECS, Limit: 4, InUse: 4, Requested: 1,
			Admitted: berthv1.Admitted_ADMITTED_NOT_STARTED})
}

// busyDiskStatus is FLEET_BUSY for disk (resource DISK or PRINCIPAL_DISK)
// as a berthd before FreedByWaiting sent it: with a RetryInfo of 1 s.
func busyDiskStatus(sandboxID string, resource berthv1.CapacityResource) error {
	return rpcstatus.Error(codes.ResourceExhausted, rpcstatus.ReasonFleetBusy, "no capacity for sandbox "+sandboxID+": disk",
		map[string]string{"sandbox_id": sandboxID},
		&berthv1.FleetBusy{SandboxId: sandboxID, Resource: resource, Limit: 1 << 30, InUse: 1 << 30, Requested: 1 << 20,
			RetryDelay: durationpb.New(time.Second), Admitted: berthv1.Admitted_ADMITTED_NOT_STARTED},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Second)})
}

// clusterStatus is CLUSTER_UNAVAILABLE as a routing berthd answers when
// the fleet's etcd did not answer within its budget.
func clusterStatus(delay time.Duration) error {
	return rpcstatus.Error(codes.Unavailable, rpcstatus.ReasonClusterUnavailable,
		fmt.Sprintf("the fleet's store (etcd) did not answer within 2s: nothing was sent to any node; retry after %v", delay), nil,
		&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)})
}

func unreachableStatus(sandboxID string, admitted berthv1.Admitted) error {
	return rpcstatus.Error(codes.Unavailable, rpcstatus.ReasonUnreachable,
		"sandbox "+sandboxID+": the agent did not answer within the connect budget of 3s; nothing ran",
		map[string]string{"sandbox_id": sandboxID},
		&berthv1.Unreachable{SandboxId: sandboxID, Cause: berthv1.UnreachableCause_UNREACHABLE_CAUSE_CONNECT_TIMEOUT, TaskRunning: true,
			Runtime: oldRuntime, ConnectBudget: durationpb.New(3 * time.Second), Admitted: admitted})
}

func replacedStatus(sandboxID, execID string) error {
	return rpcstatus.Error(codes.Aborted, rpcstatus.ReasonRuntimeReplaced,
		"sandbox "+sandboxID+": the task exited with status 137 while exec "+execID+" was running in it",
		map[string]string{"sandbox_id": sandboxID, "exec_id": execID},
		&berthv1.RuntimeReplaced{SandboxId: sandboxID, ExecId: execID, Cause: berthv1.ReplacedCause_REPLACED_CAUSE_TASK_EXITED,
			Before: oldRuntime, After: newRuntime, TaskExitStatus: 137, Admitted: berthv1.Admitted_ADMITTED_STARTED})
}

func staleStatus(sandboxID, execID string) error {
	return rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonStaleHandle,
		"exec "+execID+" belongs to an earlier runtime of sandbox "+sandboxID,
		map[string]string{"sandbox_id": sandboxID, "exec_id": execID},
		&berthv1.StaleHandle{SandboxId: sandboxID, ExecId: execID, HandleRuntime: oldRuntime, CurrentRuntime: newRuntime,
			Admitted: berthv1.Admitted_ADMITTED_NOT_STARTED})
}

// serveScripted serves fake for the test, stopped at its cleanup, and
// returns its address.
func serveScripted(t *testing.T, fake *scriptedBerthd) string {
	t.Helper()
	addr, stop, err := startScriptedBerthd(fake)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return addr
}

// startScriptedBerthd serves s on a unix socket in a new temporary
// directory and returns its address and a function that stops it.
func startScriptedBerthd(s *scriptedBerthd) (addr string, stop func(), err error) {
	dir, err := os.MkdirTemp("", "berth-client")
	if err != nil {
		return "", nil, err
	}
	sock := filepath.Join(dir, "berthd.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	srv := grpc.NewServer()
	berthv1.RegisterSandboxServiceServer(srv, s)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	return "unix://" + sock, func() {
		srv.Stop()
		if err := <-served; err != nil && !errors.Is(err, io.EOF) {
			fmt.Fprintln(os.Stderr, "scripted berthd:", err)
		}
		os.RemoveAll(dir)
	}, nil
}
