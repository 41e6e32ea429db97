package client

import (
	"context"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
)

// FileWatch is an open WatchFiles stream. Recv returns its messages in
// order: FileWatchStarted first, then FileEvent and FileWatchOverflow in
// seq order. Keep the last seq seen (FileEvent.Seq, or a KERNEL or
// WATCHES overflow's Seq) and the watch id to resume after the stream
// breaks: WatchFiles with WatchId and SinceSeq sends every later event
// exactly once.
type FileWatch struct {
	stream berthv1.SandboxService_WatchFilesClient
	cancel context.CancelFunc
}

// WatchFiles opens, or resumes, a watch of the directory tree req.Path
// of the sandbox req.SandboxId (docs/watch.md). The stream
// lasts until ctx ends or Close; the watch outlives it for 10 minutes.
// Errors (from Recv): codes.InvalidArgument naming the field,
// codes.NotFound (ReasonSandboxNotFound, ReasonFileNotFound),
// codes.FailedPrecondition (ReasonNotADirectory).
func (c *Client) WatchFiles(ctx context.Context, req *berthv1.WatchFilesRequest) (*FileWatch, error) {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := c.sandboxes.WatchFiles(ctx, req)
	if err != nil {
		cancel()
		return nil, convertError(err)
	}
	return &FileWatch{stream: stream, cancel: cancel}, nil
}

// Recv returns the next message of the watch.
func (w *FileWatch) Recv() (*berthv1.WatchFilesResponse, error) {
	msg, err := w.stream.Recv()
	if err != nil {
		return nil, convertError(err)
	}
	return msg, nil
}

// Close ends the stream; the watch lives on, to be resumed.
func (w *FileWatch) Close() { w.cancel() }
