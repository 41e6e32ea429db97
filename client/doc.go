// Package client is the Go client of berthd, the berth sandbox service: it
// creates and deletes sandboxes, imports and lists images, and runs commands
// inside sandboxes with streamed, sequence-numbered output.
//
// A Client wraps one gRPC connection (a unix socket or TCP) and is safe for
// concurrent use. Every error an RPC returns is a *Error carrying the gRPC
// code, the stable reason token berthd put in its google.rpc.ErrorInfo and
// any field violations; use errors.As to inspect it and never the message
// text.
//
// The four runtime conditions have their own types, each wrapping the
// *Error: *FleetBusyError (no capacity now; nothing started),
// *UnreachableError (the sandbox's agent did not answer), *RuntimeReplacedError
// (the sandbox's runtime died under an exec) and *StaleHandleError (an exec id
// of an earlier runtime). IsRetryable says which errors are safe to retry, and
// WithRetry makes the Client retry those by itself; see Example (Conditions).
//
// Exec is the core: it starts a process, returns once berthd says it runs, and
// then delivers the process's stdout and stderr bytes exactly as they were
// read, in sequence order, to the writers given with WithStdout and
// WithStderr, until Wait returns the process's result.
//
// On top of the Client is the SDK surface shared with the Python and
// TypeScript SDKs (docs/clients.md): CreateSandbox and ConnectSandbox return
// a *Sandbox whose Commands (Run with a command timeout, Start, Connect with
// replay), Files (Read, Write, List, Stat, Remove, Rename, MakeDir,
// UploadDir, DownloadDir) and Ports (Forward to a local address) call the
// Client's methods; see the example of CreateSandbox and examples/go/bot.go.
package client
