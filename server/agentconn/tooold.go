package agentconn

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/version"
	agentv1 "github.com/berth-sandbox/berth/proto/berth/agent/v1"
)

// tooOld returns err as FAILED_PRECONDITION AGENT_TOO_OLD when it is the
// UNIMPLEMENTED that grpc-go answers for a method the agent's server does
// not have (an agent older than berthd: its status has no berth ErrorInfo),
// naming method and the agent's version, which it asks the agent (Info,
// within 5 s; "unknown" when that fails). Any other error is returned as
// it is, and so is Info's (asked for the version).
func tooOld(ctx context.Context, cc *grpc.ClientConn, method string, err error) error {
	if status.Code(err) != codes.Unimplemented || rpcstatus.Reason(err) != "" || method == agentv1.AgentService_Info_FullMethodName {
		return err
	}
	agentVersion := "unknown"
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if info, ierr := agentv1.NewAgentServiceClient(cc).Info(ictx, &agentv1.InfoRequest{}); ierr == nil && info.GetVersion() != "" {
		agentVersion = info.GetVersion()
	}
	server := version.Get()
	return rpcstatus.Error(codes.FailedPrecondition, rpcstatus.ReasonAgentTooOld,
		fmt.Sprintf("the sandbox's agent (version %s) does not serve %s, which berthd (version %s) needs for this call: it is older than berthd; a sandbox created anew runs berthd's agent", agentVersion, method, server),
		map[string]string{"agent_method": method, "agent_version": agentVersion, "server_version": server})
}

// tooOldUnary is tooOld for every unary call to an agent.
func tooOldUnary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if err := invoker(ctx, method, req, reply, cc, opts...); err != nil {
		return tooOld(ctx, cc, method, err)
	}
	return nil
}

// tooOldStream is tooOld for every stream to an agent: a stream's
// UNIMPLEMENTED comes with its first answer (RecvMsg, Header) or on a send
// after the server ended it.
func tooOldStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, tooOld(ctx, cc, method, err)
	}
	return &tooOldClientStream{ClientStream: s, ctx: ctx, cc: cc, method: method}, nil
}

type tooOldClientStream struct {
	grpc.ClientStream
	ctx    context.Context
	cc     *grpc.ClientConn
	method string
}

func (s *tooOldClientStream) RecvMsg(m any) error {
	if err := s.ClientStream.RecvMsg(m); err != nil {
		return tooOld(s.ctx, s.cc, s.method, err)
	}
	return nil
}

func (s *tooOldClientStream) Header() (md metadata.MD, err error) {
	md, err = s.ClientStream.Header()
	if err != nil {
		err = tooOld(s.ctx, s.cc, s.method, err)
	}
	return md, err
}
