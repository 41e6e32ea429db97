// The connection to berthd and the retry policy (the Go client's:
// client/client.go Dial, client/retry.go; the Python SDK's Connection).

import * as fs from "node:fs";
import { ChannelCredentials, ChannelOptions, Metadata, credentials } from "@grpc/grpc-js";
import { SandboxServiceClient } from "../gen/berth/v1/sandbox";
import { FileServiceClient } from "../gen/berth/v1/file";
import { ImageServiceClient } from "../gen/berth/v1/image";
import { BerthError, FleetBusy, fromServiceError, isRetryable } from "./errors";

/** The address used when neither addr nor $BERTH_ADDR is given (the CLI's). */
export const DEFAULT_ADDR = "unix:///run/berth/berthd.sock";

/**
 * Which failures are retried and how, as the Go client's RetryPolicy:
 * FleetBusy after the server's delay (at least it, up to a fifth more,
 * capped by maxBusyDelay), Unreachable and a containerd failure that ran
 * nothing and CLUSTER_UNAVAILABLE with jittered exponential backoff (from
 * initialBackoff, doubling up to maxBackoff; CLUSTER_UNAVAILABLE at least
 * its RetryInfo delay). RuntimeReplaced, StaleHandle and everything else
 * are never retried. Retried: creating, getting and deleting sandboxes and
 * the opening of a command (until berthd says it runs). Times in seconds.
 */
export interface RetryPolicy {
  maxAttempts?: number;
  initialBackoff?: number;
  maxBackoff?: number;
  maxBusyDelay?: number;
  /** onRetry is called before each wait: the attempt that failed, its error, the wait in seconds. */
  onRetry?: (attempt: number, err: BerthError, wait: number) => void;
}

/** Options of a Connection; every one has a default from the environment. */
export interface ConnectionOptions {
  /**
   * addr: "unix:///run/berth/berthd.sock", "unix:/path", a bare absolute
   * path, or "host:port" (TLS unless insecure); default $BERTH_ADDR, else
   * DEFAULT_ADDR.
   */
  addr?: string;
  /**
   * token: a bearer token sent as "authorization: Bearer" on every call;
   * default $BERTH_TOKEN, else the contents of $BERTH_TOKEN_FILE. On a unix
   * socket a caller without one is the principal of its uid.
   */
  token?: string;
  /** TLS (TCP only), PEM files: defaults $BERTH_TLS_CA, $BERTH_TLS_CERT, $BERTH_TLS_KEY. */
  caFile?: string;
  certFile?: string;
  keyFile?: string;
  /** serverName when the address's host is not in berthd's certificate. */
  serverName?: string;
  /** credentials instead of the files. */
  credentials?: ChannelCredentials;
  /** insecure talks plaintext TCP to a berthd run with --insecure-tcp. */
  insecure?: boolean;
  /** retry: the policy (default: the Go client's), or null to never retry. */
  retry?: RetryPolicy | null;
  /**
   * noResume: calls through this connection never resume a paused sandbox
   * nor wake a hibernated one (they reject with a BerthError of reason
   * SANDBOX_PAUSED or SANDBOX_HIBERNATED and change nothing): every call
   * carries the metadata "berth-no-resume: true", as the Go client's
   * NoResume(ctx) (docs/state.md).
   */
  noResume?: boolean;
}

const defaultPolicy: Required<Omit<RetryPolicy, "onRetry">> = { maxAttempts: 10, initialBackoff: 0.1, maxBackoff: 5, maxBusyDelay: 30 };

const sleep = (sec: number) => new Promise<void>((r) => setTimeout(r, sec * 1000));

/**
 * A gRPC channel to berthd and its service clients, shared by the Sandbox
 * objects made with it. close() ends it (and the streams on it).
 */
export class Connection {
  readonly addr: string;
  readonly sandboxes: SandboxServiceClient;
  readonly files: FileServiceClient;
  readonly images: ImageServiceClient;
  readonly retryPolicy: RetryPolicy | null;
  private readonly token: string | undefined;
  private readonly noResume: boolean;

  constructor(options: ConnectionOptions = {}) {
    let addr = options.addr || process.env.BERTH_ADDR || DEFAULT_ADDR;
    if (addr.startsWith("/")) {
      addr = "unix://" + addr;
    }
    this.addr = addr;
    let token = options.token ?? (process.env.BERTH_TOKEN || undefined);
    const tokenFile = process.env.BERTH_TOKEN_FILE;
    if (token === undefined && tokenFile) {
      token = fs.readFileSync(tokenFile, "utf8").trim();
      if (!token) {
        throw new Error(`$BERTH_TOKEN_FILE ${tokenFile} is empty`);
      }
    }
    this.token = token || undefined;
    this.noResume = options.noResume ?? false;
    // berthd pings idle connections every 30 s and permits client pings
    // every 10 s or more while calls are open (not on an idle connection:
    // that is answered with GOAWAY).
    const opts: ChannelOptions = { "grpc.keepalive_time_ms": 30000, "grpc.keepalive_timeout_ms": 10000 };
    let creds: ChannelCredentials;
    if (addr.startsWith("unix:") || options.insecure) {
      creds = credentials.createInsecure();
    } else if (options.credentials) {
      creds = options.credentials;
    } else {
      const ca = options.caFile || process.env.BERTH_TLS_CA;
      const cert = options.certFile || process.env.BERTH_TLS_CERT;
      const key = options.keyFile || process.env.BERTH_TLS_KEY;
      if (!!cert !== !!key) {
        throw new Error("a TLS client certificate needs both its certificate and its key file");
      }
      const read = (p?: string) => (p ? fs.readFileSync(p) : null);
      creds = credentials.createSsl(read(ca), read(key), read(cert));
    }
    if (options.serverName) {
      opts["grpc.ssl_target_name_override"] = options.serverName;
      opts["grpc.default_authority"] = options.serverName;
    }
    this.sandboxes = new SandboxServiceClient(addr, creds, opts);
    const shared = { channelOverride: this.sandboxes.getChannel() };
    this.files = new FileServiceClient(addr, creds, shared);
    this.images = new ImageServiceClient(addr, creds, shared);
    this.retryPolicy = options.retry === null ? null : { ...defaultPolicy, ...(options.retry ?? {}) };
  }

  /** metadata returns the per-call metadata: the bearer token, if any, and berth-no-resume with noResume. */
  metadata(): Metadata {
    const md = new Metadata();
    if (this.token) {
      md.set("authorization", "Bearer " + this.token);
    }
    if (this.noResume) {
      md.set("berth-no-resume", "true");
    }
    return md;
  }

  /** close closes the channel; streams and port forwards on it end. */
  close(): void {
    this.sandboxes.close();
  }

  /**
   * call calls a unary method once (client[method](request)), converting
   * its error; timeout in seconds.
   */
  call<Req, Resp>(client: any, method: string, request: Req, timeout?: number): Promise<Resp> {
    return new Promise((resolve, reject) => {
      const options = timeout ? { deadline: Date.now() + timeout * 1000 } : {};
      client[method](request, this.metadata(), options, (err: unknown, resp: Resp) => (err ? reject(fromServiceError(err)) : resolve(resp)));
    });
  }

  /**
   * retry runs fn under the retry policy until it succeeds, fails with
   * something not to retry, the attempts run out, or the wait would pass
   * deadline (Date.now() milliseconds); the last error is thrown.
   */
  async retry<T>(fn: () => Promise<T>, deadline?: number): Promise<T> {
    const p = this.retryPolicy ? { ...defaultPolicy, ...this.retryPolicy } : null;
    let backoff = p ? p.initialBackoff : 0;
    for (let attempt = 1; ; attempt++) {
      try {
        return await fn();
      } catch (e) {
        const err = fromServiceError(e);
        if (!p || attempt >= p.maxAttempts || !isRetryable(err)) {
          throw err;
        }
        let wait: number;
        if (err instanceof FleetBusy) {
          const d = Math.min(err.retryAfter, p.maxBusyDelay);
          wait = d + Math.random() * (d / 5);
        } else {
          wait = backoff / 2 + Math.random() * (backoff / 2);
          backoff = Math.min(2 * backoff, p.maxBackoff);
          if (err.reason === "CLUSTER_UNAVAILABLE" && err.retryDelay) {
            wait = Math.max(wait, Math.min(err.retryDelay, p.maxBusyDelay));
          }
        }
        if (deadline !== undefined && Date.now() + wait * 1000 > deadline) {
          throw err;
        }
        p.onRetry?.(attempt, err, wait);
        await sleep(wait);
      }
    }
  }

  /** unary calls a unary method under the retry policy; timeout in seconds bounds all attempts. */
  unary<Req, Resp>(client: any, method: string, request: Req, timeout?: number): Promise<Resp> {
    const deadline = timeout ? Date.now() + timeout * 1000 : undefined;
    return this.retry(
      () => this.call<Req, Resp>(client, method, request, deadline === undefined ? undefined : Math.max((deadline - Date.now()) / 1000, 0.001)),
      deadline,
    );
  }
}
