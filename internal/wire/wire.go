// Package wire holds how berth's messages travel between its hops — the Go
// client to berthd, berthd to each sandbox's agent: HTTP/2 flow-control
// windows, the buffers between gRPC and the socket, and a codec that moves
// file data chunks without protobuf's decode and encode (Codec, Frame) and
// sends a Run's output without copying it.
//
// The windows are fixed rather than grpc-go's default (64 KiB, grown by
// BDP estimation up to 16 MiB per stream and connection): from the first
// byte a stream may have four 1 MiB file chunks in flight instead of one
// sixteenth of one, and what a receiver may hold is a stated bound.
// A receiver buffers at most StreamWindow bytes of one stream that its
// application has not taken. ConnWindow does not bound what a connection
// buffers: grpc-go acknowledges a connection's window as data arrives,
// not as the application reads it, so each of a connection's streams may
// hold StreamWindow (Run's output budget charges it, issue 23). A
// sender's Send blocks while more than 64 KiB of its earlier messages
// wait to be written (grpc-go's write quota). So a slow reader stops the
// writer at the far end through every hop, and memory per stream stays
// bounded.
//
// gRPC receives each HTTP/2 data frame (16 KiB) into a buffer of its
// pool, which by default zeroes the buffer before read(2) overwrites all
// of it; both options give it Fill's pool instead, which does not
// (fillPool): a memclr of every byte received, on every hop, less.
package wire

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/experimental"
)

const (
	// StreamWindow is the HTTP/2 flow-control window of one stream, in
	// bytes: four 1 MiB file chunks in flight.
	StreamWindow = 4 << 20
	// ConnWindow is the HTTP/2 flow-control window of one connection, in
	// bytes, shared by its streams: what may be in flight, acknowledged
	// as it arrives.
	ConnWindow = 8 << 20
	// BufferBytes is the size of the read and write buffers between gRPC's
	// framer and the socket, in bytes: one read(2) or write(2) per 256 KiB
	// instead of per 32 KiB (grpc-go's default).
	BufferBytes = 256 << 10
)

// ServerOptions returns the transport options of berthd's and the agent's
// gRPC servers: Codec, with interceptors that refuse a request whose
// string fields are not UTF-8 as INVALID_ARGUMENT naming the field (grpc-go
// would answer INTERNAL), and the windows and buffers.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(serverCodec{}),
		grpc.ChainUnaryInterceptor(checkUnary),
		grpc.ChainStreamInterceptor(checkStream),
		grpc.InitialWindowSize(StreamWindow),
		grpc.InitialConnWindowSize(ConnWindow),
		grpc.ReadBufferSize(BufferBytes),
		grpc.WriteBufferSize(BufferBytes),
		experimental.BufferPool(fillPool),
	}
}

// DialOptions returns the transport options of the client's connection to
// berthd and of berthd's connections to agents.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithInitialWindowSize(StreamWindow),
		grpc.WithInitialConnWindowSize(ConnWindow),
		grpc.WithReadBufferSize(BufferBytes),
		grpc.WithWriteBufferSize(BufferBytes),
		experimental.WithBufferPool(fillPool),
	}
}
