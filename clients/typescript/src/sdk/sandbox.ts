// berth.Sandbox: one sandbox and its commands, files and ports.

import {
  CreateSandboxRequest, CreateSandboxResponse, DeleteSandboxRequest, GetSandboxRequest, GetSandboxResponse, NetworkMode,
  Sandbox as PbSandbox, sandboxStateToJSON,
} from "../gen/berth/v1/sandbox";
import { Commands, userOf } from "./commands";
import { Connection, ConnectionOptions } from "./connection";
import { SandboxNotFound, duration, intArg, num, secondsArg } from "./errors";
import { Files } from "./files";
import { Ports } from "./ports";
import { Sessions } from "./sessions";
import { VolumeMountSpec, volumeMounts } from "./volumes";
import { CodeContexts } from "./contexts";

/** The image Sandbox.create uses when none is given and $BERTH_IMAGE is unset. */
export const DEFAULT_IMAGE = "berth.dev/base:latest";

/** A sandbox's record, JSON-serialisable: state is "running", "paused", "stopped", ... */
export interface SandboxInfo {
  id: string;
  image: string;
  state: string;
  user: string;
  workdir: string;
  owner: string;
  labels: Record<string, string>;
  /** agentBootId is random per start of the sandbox's agent (a new one after a runtime restart). */
  agentBootId: string;
  createdAt: string | null;
  memoryBytes: number;
}

function infoOf(s: PbSandbox | undefined): SandboxInfo {
  if (!s) throw new Error("berthd answered without the sandbox");
  return {
    id: s.id, image: s.image, state: sandboxStateToJSON(s.state).replace(/^SANDBOX_STATE_/, "").toLowerCase(), user: s.user, workdir: s.workdir,
    owner: s.owner, labels: { ...s.labels }, agentBootId: s.runtime?.agentBootId ?? "", createdAt: s.createdAt ? s.createdAt.toISOString() : null,
    memoryBytes: num(s.resources?.memoryBytes),
  };
}

/**
 * Options of Sandbox.create: the sandbox's, then the connection's
 * (ConnectionOptions). Numbers are checked before anything is sent: sizes
 * and cpuMillis integers from 0, times finite seconds from 0, else
 * InvalidArgument naming the option.
 */
export interface CreateOptions extends ConnectionOptions {
  /** image: a reference in berthd's image store (default $BERTH_IMAGE, else DEFAULT_IMAGE). */
  image?: string;
  /**
   * user: the workload user processes run as and files are created as:
   * "uid", "uid:gid", a number, or [uid, gid]; default root without
   * capabilities.
   */
  user?: string | number | [number, number];
  env?: Record<string, string>;
  /** workdir default /workspace. */
  workdir?: string;
  labels?: Record<string, string>;
  /** sandboxId names it (else berthd mints one); a create retried after a failure that ran nothing is safe. */
  sandboxId?: string;
  /** memoryBytes, diskBytes: bytes; cpuMillis: thousandths of a CPU; 0 or unset: berthd's defaults. */
  memoryBytes?: number;
  cpuMillis?: number;
  diskBytes?: number;
  /** idleTimeout and maxLifetime in seconds. */
  idleTimeout?: number;
  maxLifetime?: number;
  runtime?: "runc" | "gvisor";
  network?: "none" | "egress";
  fromSnapshot?: string;
  /** volumes: the caller's volumes (Volumes) to mount, each "NAME:PATH[:ro]" or { name, path, readOnly }. */
  volumes?: VolumeMountSpec[];
  /** timeout: seconds for the whole create with its retries (default 120). */
  timeout?: number;
  /** connection: share one Connection instead of making one from the options. */
  connection?: Connection;
}

/**
 * A sandbox on berthd. Make one with Sandbox.create({...}) or attach to an
 * existing one with Sandbox.connect(id); with `await using` (TypeScript
 * 5.2+, or call kill()/close() in a finally):
 *
 *     await using sb = await Sandbox.create({ user: "1000:1000" });
 *     console.log((await sb.commands.run("echo hi")).stdout);
 *
 * Disposing a created sandbox deletes it (kill()); a connected one only
 * closes the connection (close()). sb.commands, sb.files and sb.ports act
 * on it; sb.id names it.
 */
export class Sandbox {
  readonly id: string;
  readonly commands: Commands;
  readonly files: Files;
  readonly ports: Ports;
  readonly sessions: Sessions;
  readonly contexts: CodeContexts;

  private constructor(readonly connection: Connection, public info: SandboxInfo, private readonly owns: boolean, private readonly created: boolean) {
    this.id = info.id;
    this.commands = new Commands(connection, this.id);
    this.files = new Files(connection, this.id);
    this.ports = new Ports(connection, this.id);
    this.sessions = new Sessions(connection, this.id, this.commands);
    this.contexts = new CodeContexts(connection, this.id);
  }

  /**
   * create creates a sandbox and resolves to it once it runs. Rejects with
   * FleetBusy (after the retries), ImageNotFound, InvalidArgument, ...
   */
  static async create(options: CreateOptions = {}): Promise<Sandbox> {
    if (options.network !== undefined && options.network !== "none" && options.network !== "egress") {
      throw new TypeError(`Sandbox.create: network ${JSON.stringify(options.network)} is neither "none" nor "egress"`);
    }
    const req = CreateSandboxRequest.fromPartial({
      sandboxId: options.sandboxId ?? "", image: options.image || process.env.BERTH_IMAGE || DEFAULT_IMAGE, labels: options.labels ?? {},
      env: options.env ?? {}, user: userOf(options.user), workdir: options.workdir ?? "", runtime: options.runtime ?? "", fromSnapshot: options.fromSnapshot ?? "",
      volumes: volumeMounts(options.volumes),
    });
    if (options.memoryBytes !== undefined || options.cpuMillis !== undefined || options.diskBytes !== undefined) {
      req.resources = {
        pidsLimit: 0n, cpuMillis: BigInt(intArg("cpuMillis", options.cpuMillis) ?? 0), memoryBytes: BigInt(intArg("memoryBytes", options.memoryBytes) ?? 0),
        diskBytes: BigInt(intArg("diskBytes", options.diskBytes) ?? 0),
        shmBytes: 0n, openFilesLimit: 0n,
      };
    }
    if (options.idleTimeout !== undefined) req.idleTimeout = duration(options.idleTimeout, "idleTimeout");
    if (options.maxLifetime !== undefined) req.maxLifetime = duration(options.maxLifetime, "maxLifetime");
    if (options.network !== undefined) {
      req.network = { mode: options.network === "egress" ? NetworkMode.NETWORK_MODE_EGRESS : NetworkMode.NETWORK_MODE_NONE, allow: [], maxConnections: 0, egressBytesPerSecond: 0n, ingressBytesPerSecond: 0n };
    }
    const timeout = secondsArg("timeout", options.timeout) ?? 120;
    const conn = options.connection ?? new Connection(options);
    try {
      const r = await conn.unary<CreateSandboxRequest, CreateSandboxResponse>(conn.sandboxes, "createSandbox", req, timeout);
      return new Sandbox(conn, infoOf(r.sandbox), !options.connection, true);
    } catch (e) {
      if (!options.connection) conn.close();
      throw e;
    }
  }

  /** connect resolves to the existing sandbox id (SandboxNotFound when there is none, or it is another principal's). */
  static async connect(id: string, options: ConnectionOptions & { connection?: Connection } = {}): Promise<Sandbox> {
    const conn = options.connection ?? new Connection(options);
    try {
      const r = await conn.unary<GetSandboxRequest, GetSandboxResponse>(conn.sandboxes, "getSandbox", GetSandboxRequest.fromPartial({ sandboxId: id }));
      return new Sandbox(conn, infoOf(r.sandbox), !options.connection, false);
    } catch (e) {
      if (!options.connection) conn.close();
      throw e;
    }
  }

  /** refresh reads the sandbox's record again into info. */
  async refresh(): Promise<SandboxInfo> {
    const r = await this.connection.unary<GetSandboxRequest, GetSandboxResponse>(this.connection.sandboxes, "getSandbox", GetSandboxRequest.fromPartial({ sandboxId: this.id }));
    this.info = infoOf(r.sandbox);
    return this.info;
  }

  /** kill deletes the sandbox (its processes and files); idempotent towards a sandbox already gone. */
  async kill(): Promise<void> {
    try {
      await this.connection.unary(this.connection.sandboxes, "deleteSandbox", DeleteSandboxRequest.fromPartial({ sandboxId: this.id }));
    } catch (e) {
      if (!(e instanceof SandboxNotFound)) throw e;
    }
  }

  /** close closes the connection when this Sandbox made it; the sandbox runs on (kill() deletes it). */
  close(): void {
    if (this.owns) this.connection.close();
  }

  /** Symbol.asyncDispose: kill() a created sandbox, then close(). */
  async [Symbol.asyncDispose](): Promise<void> {
    try {
      if (this.created) await this.kill();
    } finally {
      this.close();
    }
  }

  toJSON(): SandboxInfo {
    return this.info;
  }
}
