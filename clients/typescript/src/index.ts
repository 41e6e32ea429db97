// berth's SDK for Node (@berth-sandbox/client): Sandbox.create/connect with
// its commands, files and ports, typed errors and the Go client's retry
// policy (src/sdk, hand-written; the same names and semantics as the Python
// SDK, docs/clients.md). Below it, the generated clients and messages
// (src/gen, made by ts-proto from proto/berth/v1 and google/rpc; see
// buf.gen.clients.yaml), connect() for raw clients and details() of an
// error.

export { Sandbox, SandboxInfo, CreateOptions, DEFAULT_IMAGE } from "./sdk/sandbox";
export { Connection, ConnectionOptions, RetryPolicy, DEFAULT_ADDR } from "./sdk/connection";
export { Commands, CommandHandle, CommandResult, CommandInfo, RunOptions, OutputCallback, StdinData } from "./sdk/commands";
export { Files, FileInfo, FileKind, WriteData, WriteOptions, UploadSummary } from "./sdk/files";
export { Ports, PortForward } from "./sdk/ports";
export { Sessions, Session, SessionInfo, SessionOptions, SessionRunOptions } from "./sdk/sessions";
export { Volumes, VolumeInfo, VolumeMountSpec } from "./sdk/volumes";
export { Snapshots, SnapshotInfo, CommitOptions } from "./sdk/snapshots";
export { FileWatch, FileEvent, FileWatchOverflow, WatchEvent, WatchOptions } from "./sdk/watch";
export { CodeContexts, CodeContext, Execution, RunCodeOptions } from "./sdk/contexts";
export {
  BerthError, InvalidArgument, Unauthenticated, NotPermitted, NotFound, SandboxNotFound, ExecNotFound, ImageNotFound, FileNotFound,
  FileExists, FilePermissionDenied, PortClosed, FleetBusy, Unreachable, RuntimeReplaced, StaleHandle, DependencyFailure, ProtocolError, FieldViolation,
  isRetryable, fromServiceError, num,
} from "./sdk/errors";

import { ChannelCredentials, Metadata, ServiceError, credentials } from "@grpc/grpc-js";
import { SandboxServiceClient } from "./gen/berth/v1/sandbox";
import { FileServiceClient } from "./gen/berth/v1/file";
import { ImageServiceClient } from "./gen/berth/v1/image";
import * as pbErrors from "./gen/berth/v1/errors";
import { Status } from "./gen/google/rpc/status";
import { BadRequest, ErrorInfo, RetryInfo } from "./gen/google/rpc/error_details";

export * as sandbox from "./gen/berth/v1/sandbox";
export * as exec from "./gen/berth/v1/exec";
export * as file from "./gen/berth/v1/file";
export * as image from "./gen/berth/v1/image";
export * as session from "./gen/berth/v1/session";
export * as volume from "./gen/berth/v1/volume";
export * as watch from "./gen/berth/v1/watch";
export * as errors from "./gen/berth/v1/errors";
// The typed details' messages are errors.FleetBusy, errors.Unreachable, ...:
// the top-level FleetBusy, Unreachable, ... are the SDK's error classes.
export { ErrorInfo, RetryInfo, BadRequest };

/** The clients of one berthd. */
export interface Berth {
  sandboxes: SandboxServiceClient;
  files: FileServiceClient;
  images: ImageServiceClient;
  /** metadata returns the per-call metadata: the bearer token, if any. */
  metadata(): Metadata;
  close(): void;
}

/** Options of connect. */
export interface ConnectOptions {
  /**
   * token is a bearer token (README "Tokens"), sent as `authorization:
   * Bearer` on every call. On berthd's unix socket a caller without one is
   * the principal of its uid (SO_PEERCRED).
   */
  token?: string;
  /** tls are the credentials for a TCP address: berthd serves TCP only with TLS. */
  tls?: ChannelCredentials;
}

/**
 * connect returns clients for the berthd at address: "unix:///run/berth/berthd.sock"
 * (or a bare absolute path) for the unix socket, or "host:port" with
 * options.tls.
 */
export function connect(address: string, options: ConnectOptions = {}): Berth {
  const target = address.startsWith("/") ? "unix://" + address : address;
  const creds = options.tls ?? credentials.createInsecure();
  // berthd pings idle connections every 30 s and permits client pings
  // every 10 s or more.
  const channelOptions = { "grpc.keepalive_time_ms": 30000, "grpc.keepalive_timeout_ms": 10000 };
  const sandboxes = new SandboxServiceClient(target, creds, channelOptions);
  const shared = { channelOverride: sandboxes.getChannel() };
  const files = new FileServiceClient(target, creds, shared);
  const images = new ImageServiceClient(target, creds, shared);
  return {
    sandboxes,
    files,
    images,
    metadata() {
      const md = new Metadata();
      if (options.token) {
        md.set("authorization", "Bearer " + options.token);
      }
      return md;
    },
    close() {
      sandboxes.close();
    },
  };
}

/** The details of a berth error, decoded from its google.rpc.Status. */
export interface Details {
  /** errorInfo is always there for berth's own errors; reason is the stable token. */
  errorInfo?: ErrorInfo;
  retryInfo?: RetryInfo;
  badRequest?: BadRequest;
  fleetBusy?: pbErrors.FleetBusy;
  unreachable?: pbErrors.Unreachable;
  runtimeReplaced?: pbErrors.RuntimeReplaced;
  staleHandle?: pbErrors.StaleHandle;
}

const typePrefix = "type.googleapis.com/";

/**
 * details decodes the typed details of err, a gRPC error from berthd, from
 * its grpc-status-details-bin trailer (a google.rpc.Status). Never parse
 * the message: branch on details(err).errorInfo?.reason and the typed
 * detail. An error without details (one the gRPC library made) gives {}.
 */
export function details(err: ServiceError): Details {
  const out: Details = {};
  const raw = err.metadata?.get("grpc-status-details-bin")[0];
  if (!raw) {
    return out;
  }
  const status = Status.decode(typeof raw === "string" ? Buffer.from(raw, "base64") : raw);
  for (const any of status.details) {
    const value = any.value;
    switch (any.typeUrl.startsWith(typePrefix) ? any.typeUrl.slice(typePrefix.length) : any.typeUrl) {
      case "google.rpc.ErrorInfo":
        out.errorInfo = ErrorInfo.decode(value);
        break;
      case "google.rpc.RetryInfo":
        out.retryInfo = RetryInfo.decode(value);
        break;
      case "google.rpc.BadRequest":
        out.badRequest = BadRequest.decode(value);
        break;
      case "berth.v1.FleetBusy":
        out.fleetBusy = pbErrors.FleetBusy.decode(value);
        break;
      case "berth.v1.Unreachable":
        out.unreachable = pbErrors.Unreachable.decode(value);
        break;
      case "berth.v1.RuntimeReplaced":
        out.runtimeReplaced = pbErrors.RuntimeReplaced.decode(value);
        break;
      case "berth.v1.StaleHandle":
        out.staleHandle = pbErrors.StaleHandle.decode(value);
        break;
    }
  }
  return out;
}
