// berth's error model in TypeScript: every failed call rejects with a
// BerthError (or the subclass of its google.rpc.ErrorInfo reason), made
// from the gRPC status and its typed details, never from the message text.
// The names mirror the Python SDK (clients/python/berth/_errors.py) and the
// Go client (client/errors.go); docs/errors.md lists the reasons.

import { ServiceError, status as grpcStatus } from "@grpc/grpc-js";
import * as errs from "../gen/berth/v1/errors";
import { Status } from "../gen/google/rpc/status";
import { BadRequest, ErrorInfo, RetryInfo } from "../gen/google/rpc/error_details";
import { Duration } from "../gen/google/protobuf/duration";
import type { FileInfo } from "./files";

/** The google.rpc.ErrorInfo domain of berth's errors. */
export const ERROR_DOMAIN = "berth.dev";

/** The delay FleetBusy.retryAfter gives when the status carries none, in seconds. */
export const DEFAULT_BUSY_DELAY = 1;

/** One google.rpc.BadRequest field violation. */
export interface FieldViolation {
  field: string;
  description: string;
}

/**
 * An error from berthd, or from gRPC on the way to it.
 *
 * code is the gRPC status code (a number, @grpc/grpc-js `status`) and
 * codeName its name ("NOT_FOUND"); reason the stable token of the status's
 * ErrorInfo (domain berth.dev, e.g. "SANDBOX_NOT_FOUND"; "" for errors gRPC
 * made itself, such as UNAVAILABLE when berthd cannot be reached); message
 * is for people, never parse it; metadata the ErrorInfo's metadata (e.g.
 * {path: "/x"}); fieldViolations those of a BadRequest; retryDelay the
 * RetryInfo delay in seconds (undefined without one); detail the typed
 * berth.v1 detail (FleetBusy, Unreachable, RuntimeReplaced, StaleHandle,
 * DependencyFailure) in its proto3 JSON form (enums as their names, int64
 * as decimal strings), or undefined. JSON.stringify(err) gives all of them.
 * entries, for an error of files.list, are the entries received before it
 * was raised (else undefined).
 */
export class BerthError extends Error {
  readonly code: number;
  readonly codeName: string;
  readonly reason: string;
  readonly metadata: Record<string, string>;
  readonly fieldViolations: FieldViolation[];
  readonly retryDelay: number | undefined;
  readonly detail: any;
  entries?: FileInfo[];

  constructor(code: number, message: string, reason = "", metadata: Record<string, string> = {},
    fieldViolations: FieldViolation[] = [], retryDelay?: number, detail?: any) {
    const codeName = grpcStatus[code] ?? String(code);
    message = message || `berthd returned ${codeName} without a message`;
    super(reason ? `${message} (${codeName}, ${reason})` : `${message} (${codeName})`);
    this.name = new.target.name;
    this.code = code;
    this.codeName = codeName;
    this.reason = reason;
    this.metadata = metadata;
    this.fieldViolations = fieldViolations;
    this.retryDelay = retryDelay;
    this.detail = detail;
  }

  /** toJSON gives every field above (entries only when set), so that a logged error keeps what files.list received. */
  toJSON(): Record<string, unknown> {
    const out: Record<string, unknown> = {
      name: this.name, code: this.codeName, reason: this.reason, message: this.message, metadata: this.metadata,
      fieldViolations: this.fieldViolations, retryDelay: this.retryDelay, detail: this.detail,
    };
    if (this.entries !== undefined) {
      out.entries = this.entries;
    }
    return out;
  }
}

/** INVALID_ARGUMENT: a request field is invalid; fieldViolations name it. */
export class InvalidArgument extends BerthError {}
/** UNAUTHENTICATED: no or an unknown token, no client certificate. */
export class Unauthenticated extends BerthError {}
/** NOT_PERMITTED: the principal may not call this (image writes are for admins). */
export class NotPermitted extends BerthError {}
/** A NOT_FOUND reason: see the subclasses. */
export class NotFound extends BerthError {}
/** SANDBOX_NOT_FOUND: no such sandbox, or another principal's. */
export class SandboxNotFound extends NotFound {}
/** EXEC_NOT_FOUND: no such exec in the sandbox's current runtime. */
export class ExecNotFound extends NotFound {}
/** IMAGE_NOT_FOUND: the image is not in berthd's store. */
export class ImageNotFound extends NotFound {}
/** FILE_NOT_FOUND: the path or a parent is missing; metadata.path names it. */
export class FileNotFound extends NotFound {}
/** FILE_EXISTS: the target exists and may not be replaced. */
export class FileExists extends BerthError {}
/** PERMISSION_DENIED: the sandbox's workload user may not. */
export class FilePermissionDenied extends BerthError {}
/** PORT_CLOSED: nothing accepts connections on the port in the sandbox. */
export class PortClosed extends BerthError {}

/**
 * FLEET_BUSY (RESOURCE_EXHAUSTED): no capacity for a new sandbox or exec
 * now; nothing started. detail: {resource, limit, inUse, ...}. Retry the
 * same call after retryAfter seconds, which the retry policy does by itself.
 */
export class FleetBusy extends BerthError {
  /** Seconds to wait: the RetryInfo delay, else the detail's, else DEFAULT_BUSY_DELAY; never zero. */
  get retryAfter(): number {
    if (this.retryDelay) {
      return this.retryDelay;
    }
    const d = this.detail?.retryDelay ? parseFloat(String(this.detail.retryDelay)) : 0;
    return d > 0 ? d : DEFAULT_BUSY_DELAY;
  }

  /**
   * Whether waiting alone can free the capacity that ran out: false for
   * disk (CAPACITY_RESOURCE_DISK, CAPACITY_RESOURCE_PRINCIPAL_DISK), which
   * stays promised until a sandbox or snapshot is deleted, so isRetryable
   * says no; true for sandboxes, memory, execs and Run buffers, which
   * others' work frees as it ends.
   */
  get freedByWaiting(): boolean {
    const r = String(this.detail?.resource ?? "");
    return r !== "CAPACITY_RESOURCE_DISK" && r !== "CAPACITY_RESOURCE_PRINCIPAL_DISK";
  }
}

/**
 * SANDBOX_UNREACHABLE (UNAVAILABLE): the sandbox's agent did not answer;
 * detail.cause says why. Retried by the policy only when nothingRan.
 */
export class Unreachable extends BerthError {
  get nothingRan(): boolean {
    return this.detail?.admitted === "ADMITTED_NOT_STARTED";
  }
}

/**
 * RUNTIME_REPLACED (ABORTED): the sandbox's runtime died under the command,
 * whose processes are gone; it may have run partly. Never retried.
 */
export class RuntimeReplaced extends BerthError {}

/**
 * STALE_HANDLE (FAILED_PRECONDITION): the exec id belongs to an earlier
 * runtime of the sandbox; nothing was done. Start a new command.
 */
export class StaleHandle extends BerthError {}

/**
 * CONTAINERD_UNAVAILABLE, SERVER_DISK_FULL, SERVER_DESCRIPTORS_EXHAUSTED:
 * something berthd depends on failed. A containerd failure that changed
 * nothing is retried by the policy.
 */
export class DependencyFailure extends BerthError {
  get nothingRan(): boolean {
    return this.detail?.admitted === "ADMITTED_NOT_STARTED";
  }
}

/**
 * berthd broke a stream's protocol (an exec stream without started or
 * exited, a short file): output may be lost, so the SDK gives up instead of
 * guessing.
 */
export class ProtocolError extends BerthError {
  constructor(message: string) {
    super(grpcStatus.INTERNAL, message);
  }
}

const byReason: Record<string, typeof BerthError> = {
  INVALID_ARGUMENT: InvalidArgument,
  UNAUTHENTICATED: Unauthenticated,
  NOT_PERMITTED: NotPermitted,
  SANDBOX_NOT_FOUND: SandboxNotFound,
  EXEC_NOT_FOUND: ExecNotFound,
  IMAGE_NOT_FOUND: ImageNotFound,
  FILE_NOT_FOUND: FileNotFound,
  FILE_EXISTS: FileExists,
  PERMISSION_DENIED: FilePermissionDenied,
  PORT_CLOSED: PortClosed,
  FLEET_BUSY: FleetBusy,
  SANDBOX_UNREACHABLE: Unreachable,
  RUNTIME_REPLACED: RuntimeReplaced,
  STALE_HANDLE: StaleHandle,
  CONTAINERD_UNAVAILABLE: DependencyFailure,
  SERVER_DISK_FULL: DependencyFailure,
  SERVER_DESCRIPTORS_EXHAUSTED: DependencyFailure,
};

const typedDetails: Record<string, { decode(b: Uint8Array): any; toJSON(m: any): unknown }> = {
  "berth.v1.FleetBusy": errs.FleetBusy,
  "berth.v1.Unreachable": errs.Unreachable,
  "berth.v1.RuntimeReplaced": errs.RuntimeReplaced,
  "berth.v1.StaleHandle": errs.StaleHandle,
  "berth.v1.DependencyFailure": errs.DependencyFailure,
};

/** seconds converts a google.protobuf.Duration to seconds (a number). */
export function seconds(d: Duration | undefined): number {
  return d ? Number(d.seconds) + d.nanos / 1e9 : 0;
}

/**
 * invalidArgument is the InvalidArgument the SDK rejects a bad argument
 * with before anything is sent: field names the parameter as the caller
 * wrote it ("depth", "timeout"), in fieldViolations and the message, as
 * berthd's own BadRequest would.
 */
export function invalidArgument(field: string, description: string): InvalidArgument {
  return new InvalidArgument(grpcStatus.INVALID_ARGUMENT, `${field} ${description}`, "INVALID_ARGUMENT", {}, [{ field, description }]);
}

/**
 * intArg checks a count, size, sequence number or id: an integer from min
 * to max (default 0 to Number.MAX_SAFE_INTEGER, what a uint64 of the API
 * can carry exactly); undefined passes. Else InvalidArgument naming field.
 */
export function intArg(field: string, v: unknown, max = Number.MAX_SAFE_INTEGER, min = 0): number | undefined {
  if (v === undefined) return undefined;
  if (typeof v !== "number" || !Number.isInteger(v) || v < min || v > max) {
    throw invalidArgument(field, `${typeof v === "string" ? JSON.stringify(v) : String(v)} is not an integer from ${min} to ${max}`);
  }
  return v;
}

/**
 * modeArg checks permission bits: a number from 0 to 0o7777. Write them in
 * octal as a number, 0o755; a string ("0755") is refused rather than
 * guessed at (decimal or octal). undefined passes.
 */
export function modeArg(field: string, v: unknown): number | undefined {
  if (typeof v === "string") {
    throw invalidArgument(field, `${JSON.stringify(v)} is a string: give the permission bits as a number, such as 0o755`);
  }
  return intArg(field, v, 0o7777);
}

/** The longest google.protobuf.Duration, in seconds (10000 years). */
const MAX_DURATION = 315576000000;

/**
 * secondsArg checks a timeout or delay in seconds: a finite number from 0
 * to 10000 years (fractions are fine); undefined passes. Else
 * InvalidArgument naming field.
 */
export function secondsArg(field: string, v: unknown): number | undefined {
  if (v === undefined) return undefined;
  if (typeof v !== "number" || !Number.isFinite(v) || v < 0 || v > MAX_DURATION) {
    throw invalidArgument(field, `${typeof v === "string" ? JSON.stringify(v) : String(v)} is not a number of seconds from 0 to ${MAX_DURATION}`);
  }
  return v;
}

/** duration converts sec, the argument field in seconds (checked by secondsArg), to a google.protobuf.Duration. */
export function duration(sec: number, field = "timeout"): Duration {
  secondsArg(field, sec);
  const whole = Math.floor(sec);
  return { seconds: BigInt(whole), nanos: Math.round((sec - whole) * 1e9) };
}

/**
 * num converts a uint64/int64 of the API to a number; a value beyond
 * Number.MAX_SAFE_INTEGER (2^53 - 1: 8 PiB as a size) throws RangeError
 * instead of losing precision.
 */
export function num(v: bigint | number | undefined): number {
  if (v === undefined) {
    return 0;
  }
  if (typeof v === "number") {
    return v;
  }
  if (v > BigInt(Number.MAX_SAFE_INTEGER) || v < -BigInt(Number.MAX_SAFE_INTEGER)) {
    throw new RangeError(`berth: ${v} does not fit a JavaScript number exactly`);
  }
  return Number(v);
}

/**
 * fromServiceError converts a gRPC error into the BerthError subclass of
 * its reason, decoding the grpc-status-details-bin trailer (a
 * google.rpc.Status). A BerthError is returned as it is.
 */
export function fromServiceError(err: unknown): BerthError {
  if (err instanceof BerthError) {
    return err;
  }
  const e = err as Partial<ServiceError>;
  if (typeof e?.code !== "number") {
    return new BerthError(grpcStatus.UNKNOWN, String((err as Error)?.message ?? err));
  }
  let reason = "";
  let metadata: Record<string, string> = {};
  const violations: FieldViolation[] = [];
  let delay: number | undefined;
  let detail: unknown;
  const raw = e.metadata?.get("grpc-status-details-bin")[0];
  if (raw) {
    const status = Status.decode(typeof raw === "string" ? Buffer.from(raw, "base64") : raw);
    for (const any of status.details) {
      const name = any.typeUrl.slice(any.typeUrl.lastIndexOf("/") + 1);
      if (name === "google.rpc.ErrorInfo") {
        const info = ErrorInfo.decode(any.value);
        if (info.domain === ERROR_DOMAIN && !reason) {
          reason = info.reason;
          metadata = { ...info.metadata };
        }
      } else if (name === "google.rpc.BadRequest") {
        for (const v of BadRequest.decode(any.value).fieldViolations) {
          violations.push({ field: v.field, description: v.description });
        }
      } else if (name === "google.rpc.RetryInfo") {
        delay = Math.max(seconds(RetryInfo.decode(any.value).retryDelay), 0);
      } else if (typedDetails[name]) {
        const t = typedDetails[name];
        detail = t.toJSON(t.decode(any.value));
      }
    }
  }
  const cls = byReason[reason] ?? BerthError;
  const out = new cls(e.code, e.details ?? "", reason, metadata, violations, delay, detail);
  (out as { cause?: unknown }).cause = err;
  return out;
}

/**
 * isRetryable says whether err is safe to retry as it is, as the Go
 * client's IsRetryable: FleetBusy that waiting can cure (after
 * retryAfter; not a full disk budget: freedByWaiting), Unreachable and a
 * containerd DependencyFailure whose call ran nothing, and
 * CLUSTER_UNAVAILABLE. RuntimeReplaced and StaleHandle never are.
 */
export function isRetryable(err: unknown): boolean {
  if (err instanceof FleetBusy) {
    return err.freedByWaiting;
  }
  if (err instanceof DependencyFailure) {
    return err.reason === "CONTAINERD_UNAVAILABLE" && err.nothingRan;
  }
  if (err instanceof Unreachable) {
    return err.nothingRan;
  }
  return err instanceof BerthError && err.reason === "CLUSTER_UNAVAILABLE";
}
