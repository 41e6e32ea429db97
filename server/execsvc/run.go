package execsvc

import (
	"context"
	"fmt"

	"github.com/berth-sandbox/berth/internal/bounds"
	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/telemetry"
	"github.com/berth-sandbox/berth/internal/wire"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/apierr"
	"github.com/berth-sandbox/berth/server/runout"
	"github.com/berth-sandbox/berth/server/validate"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
)

// Run runs a process to completion through the agent and returns its
// collected output: the head of each stream up to its cap (defaults
// Config.RunStdoutBytes and RunStderrBytes), which berthd applies itself
// whatever the agent sends. The agent stream is read from before the
// process starts and flow control holds the process while berthd collects,
// so no byte within the caps is lost; should any be missing (an agent that
// drops output), Run fails with DATA_LOSS OUTPUT_LOST rather than answer
// with a result that looks complete. Caps that together exceed
// Config.RunMaxOutputBytes are INVALID_ARGUMENT naming the field; a Run
// whose caps do not fit the server's Run buffer budget is FLEET_BUSY;
// neither starts anything. A Run holds the first 64 KiB of each stream's
// buffer of that budget from its start and more only as its output grows
// (runout.Slabs); while the budget has no room for more, berthd stops
// reading its output and the process waits, as for a slow reader. A Run
// that gets no room within Config.RunBufferWait, or while every Run
// holding budget waits for more, fails with DATA_LOSS OUTPUT_LOST naming
// the budget; its exec runs on.
func (s *Service) Run(ctx context.Context, req *berthv1.RunRequest) (*berthv1.RunResponse, error) {
	sandboxID := req.GetSandboxId()
	if err := validate.SandboxID("sandbox_id", sandboxID); err != nil {
		return nil, err
	}
	execID, err := s.execID("exec_id", req.GetExecId())
	if err != nil {
		return nil, err
	}
	meta := map[string]string{"sandbox_id": sandboxID, "exec_id": execID}
	telemetry.Annotate(ctx, sandboxID, execID)
	if req.GetProcess() == nil {
		return nil, apierr.InvalidArgument("process", "is missing")
	}
	if req.GetProcess().GetStdin() {
		return nil, apierr.InvalidArgument("process.stdin", "Run has no stdin; use Exec")
	}
	if err := validate.Process("process", req.GetProcess()); err != nil {
		return nil, err
	}
	spec, err := s.runSpec(req.GetProcess())
	if err != nil {
		return nil, err
	}
	spec = validate.WithCallerDeadline(ctx, spec)
	// A Run holds the first slab of each stream's buffer from here and
	// more only as its output fills them (issue 23: reserving the caps
	// admitted 341 Runs into the default 1 GiB whatever they printed).
	reserved := runout.Slabs(spec.GetStdoutLimitBytes(), spec.GetStderrLimitBytes())
	lease, used, ok := s.runBuffers.Lease(reserved)
	if !ok {
		return nil, apierr.WithMeta(&apierr.FleetBusy{SandboxID: sandboxID, Resource: berthv1.CapacityResource_CAPACITY_RESOURCE_RUN_OUTPUT,
			Limit: s.runBuffers.Limit(), InUse: used, Requested: reserved, RetryDelay: s.cfg.BusyRetryDelay}, meta)
	}
	out := runout.NewCollector(spec.GetStdoutLimitBytes(), spec.GetStderrLimitBytes())
	// A buffer that must grow waits for budget while berthd stops reading
	// this Run's output, so the agent's flow control holds the process.
	// The budget of a grown buffer comes back once it is freed, after
	// the response was sent from it.
	out.HoldIn(lease)
	defer out.Release()
	start := &agentv1.ExecRequest{Event: &agentv1.ExecRequest_Start{Start: &agentv1.ExecStart{ExecId: execID, Process: spec}}}
	guard, upstream, err := s.openAgentExec(ctx, sandboxID, execID, true, start)
	if err != nil {
		return nil, apierr.WithMeta(err, meta)
	}
	defer guard.close()
	if err := upstream.CloseSend(); err != nil {
		return nil, apierr.WithMeta(guard.failed(ctx, err), meta)
	}
	var (
		fr  wire.Frame
		buf []byte
		msg agentv1.ExecResponse // reused for the events that are not output, as Exec does
	)
	defer fr.Free()
	for {
		err := upstream.RecvMsg(&fr)
		if err == nil {
			// An output event's bytes go from gRPC's buffers into the
			// collector: decoding each event would copy them first, as
			// much garbage again as the Run's output (issue 21).
			if seq, stream, ok := fr.ExecOutput(); ok {
				guard.seenOutput(seq, stream, fr.DataLen())
				err := out.Write(ctx, stream, fr.Data(&buf))
				fr.Free()
				if err != nil {
					return nil, outputBudget(sandboxID, execID, err)
				}
				continue
			}
			msg.Reset()
			err = fr.Decode(&msg)
			fr.Free()
		}
		if err != nil {
			return nil, apierr.WithMeta(guard.failed(ctx, err), meta)
		}
		guard.seen(&msg)
		switch ev := msg.GetEvent().(type) {
		case *agentv1.ExecResponse_Output:
			if err := out.Output(ctx, ev.Output); err != nil {
				return nil, outputBudget(sandboxID, execID, err)
			}
		case *agentv1.ExecResponse_Dropped:
			out.Dropped(ev.Dropped)
		case *agentv1.ExecResponse_Exited:
			resp, err := out.Response(execID, ev.Exited.GetResult())
			if err != nil {
				return nil, outputLost(sandboxID, execID, err)
			}
			return resp, nil
		}
	}
}

// runSpec returns a copy of a Run's process spec with its output caps
// resolved: Config.RunStdoutBytes and RunStderrBytes when unset, and
// INVALID_ARGUMENT naming the cap when they exceed Config.RunMaxOutputBytes
// together.
func (s *Service) runSpec(spec *berthv1.ProcessSpec) (*berthv1.ProcessSpec, error) {
	out, errOut := spec.GetStdoutLimitBytes(), spec.GetStderrLimitBytes()
	if out == 0 {
		out = s.cfg.RunStdoutBytes
	}
	if errOut == 0 {
		errOut = s.cfg.RunStderrBytes
	}
	maxBytes := s.cfg.RunMaxOutputBytes
	// The sum is checked: caps near 2^64 would wrap it below the maximum.
	switch sum, ok := bounds.Add(out, errOut); {
	case out > maxBytes:
		return nil, apierr.InvalidArgument("process.stdout_limit_bytes", fmt.Sprintf(
			"%d bytes exceeds the server's Run maximum of %d bytes for both caps together; stream more with Exec", out, maxBytes))
	case !ok || sum > maxBytes:
		return nil, apierr.InvalidArgument("process.stderr_limit_bytes", fmt.Sprintf(
			"%d bytes with process.stdout_limit_bytes %d exceeds the server's Run maximum of %d bytes for both caps together; stream more with Exec", errOut, out, maxBytes))
	}
	spec = proto.CloneOf(spec)
	spec.StdoutLimitBytes, spec.StderrLimitBytes = out, errOut
	return spec, nil
}

// outputBudget is DATA_LOSS OUTPUT_LOST for a Run whose output outgrew
// what the Run output budget could give it (runout.ExhaustedError): the
// command was started and runs on, but the Run cannot return its output.
// It is not FLEET_BUSY, which says nothing started and is retried.
func outputBudget(sandboxID, execID string, err error) error {
	return apierr.New(codes.DataLoss, rpcstatus.ReasonOutputLost,
		fmt.Sprintf("exec %s in sandbox %s started, but berthd could not hold its output: %v (--run-buffer-bytes, --run-buffer-wait); attach to the exec for what is retained, or lower the Run's caps",
			execID, sandboxID, err),
		map[string]string{"sandbox_id": sandboxID, "exec_id": execID, "resource": "CAPACITY_RESOURCE_RUN_OUTPUT"})
}

// outputLost is DATA_LOSS OUTPUT_LOST for a Run whose output arrived
// incomplete: the command ran, but the Run cannot return all of its output
// within the caps.
func outputLost(sandboxID, execID string, err error) error {
	return apierr.New(codes.DataLoss, rpcstatus.ReasonOutputLost,
		fmt.Sprintf("exec %s in sandbox %s ran, but its output did not arrive complete: %v; attach to the exec for what is retained", execID, sandboxID, err),
		map[string]string{"sandbox_id": sandboxID, "exec_id": execID})
}
