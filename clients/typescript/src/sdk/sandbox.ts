// berth.Sandbox: one sandbox and its commands, files and ports.

import {
  CreateSandboxRequest, CreateSandboxResponse, CreateSnapshotRequest, CreateSnapshotResponse, DeleteSandboxRequest, ForkSandboxRequest,
  ForkSandboxResponse, GetSandboxRequest, GetSandboxResponse, HibernateSandboxRequest, HibernateSandboxResponse, IdleAction, NetworkMode,
  PauseSandboxRequest, PauseSandboxResponse, ResumeSandboxRequest, ResumeSandboxResponse, Sandbox as PbSandbox, hibernationToJSON,
  idleActionToJSON, sandboxStateToJSON,
} from "../gen/berth/v1/sandbox";
import { Commands, userOf } from "./commands";
import { Connection, ConnectionOptions } from "./connection";
import { SandboxNotFound, duration, intArg, invalidArgument, num, secondsArg } from "./errors";
import { Files } from "./files";
import { Ports } from "./ports";
import { Sessions } from "./sessions";
import { VolumeMountSpec, volumeMounts } from "./volumes";
import { CodeContexts } from "./contexts";
import { SnapshotInfo, snapshotInfoOf } from "./snapshots";

/** The image Sandbox.create uses when none is given and $BERTH_IMAGE is unset. */
export const DEFAULT_IMAGE = "berth.dev/base:latest";

/** A sandbox's record, JSON-serialisable: state is "running", "paused", "hibernated", "stopped", ...; idleAction "delete", "pause" or "hibernate". */
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
  idleAction: string;
}

function lowerEnum(name: string, prefix: string): string {
  return name.replace(prefix, "").toLowerCase();
}

const idleActions: Record<string, IdleAction> = { delete: IdleAction.IDLE_ACTION_DELETE, pause: IdleAction.IDLE_ACTION_PAUSE, hibernate: IdleAction.IDLE_ACTION_HIBERNATE };

function infoOf(s: PbSandbox | undefined): SandboxInfo {
  if (!s) throw new Error("berthd answered without the sandbox");
  return {
    id: s.id, image: s.image, state: sandboxStateToJSON(s.state).replace(/^SANDBOX_STATE_/, "").toLowerCase(), user: s.user, workdir: s.workdir,
    owner: s.owner, labels: { ...s.labels }, agentBootId: s.runtime?.agentBootId ?? "", createdAt: s.createdAt ? s.createdAt.toISOString() : null,
    memoryBytes: num(s.resources?.memoryBytes), idleAction: lowerEnum(idleActionToJSON(s.idleAction), "IDLE_ACTION_"),
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
  /** fromSnapshot: a snapshot's id (sb.snapshot(), Snapshots) to start from. */
  fromSnapshot?: string;
  /** idleAction: what the idle timeout does: "delete" (the server's default), "pause" or "hibernate" (docs/state.md). */
  idleAction?: "delete" | "pause" | "hibernate";
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
    if (options.idleAction !== undefined) {
      const a = idleActions[String(options.idleAction)];
      if (!Object.hasOwn(idleActions, String(options.idleAction))) {
        throw invalidArgument("idleAction", `${JSON.stringify(options.idleAction)} is none of "delete", "pause", "hibernate"`);
      }
      req.idleAction = a;
    }
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

  /**
   * pause freezes every process of the sandbox (runc: its cgroup freezer;
   * gVisor: runsc pause): it uses no CPU and keeps its memory, files,
   * connections and attached commands; info.state becomes "paused". Any
   * later call that needs the sandbox (commands, files, ports) resumes it
   * first. Pausing a paused sandbox changes nothing. Rejects with
   * SandboxNotFound, a BerthError of reason SANDBOX_NOT_RUNNING.
   */
  async pause(): Promise<void> {
    const r = await this.connection.unary<PauseSandboxRequest, PauseSandboxResponse>(this.connection.sandboxes, "pauseSandbox", PauseSandboxRequest.fromPartial({ sandboxId: this.id }));
    this.info = infoOf(r.sandbox);
  }

  /** resume thaws a paused sandbox or wakes a hibernated one; resuming a running one changes nothing. Errors as pause(). */
  async resume(): Promise<void> {
    const r = await this.connection.unary<ResumeSandboxRequest, ResumeSandboxResponse>(this.connection.sandboxes, "resumeSandbox", ResumeSandboxRequest.fromPartial({ sandboxId: this.id }));
    this.info = infoOf(r.sandbox);
  }

  /**
   * hibernate releases the sandbox's memory and CPU and keeps its files;
   * the next call that needs it wakes it. Resolves to what was kept:
   * "memory_kept" (gVisor: memory and processes checkpointed and restored
   * at the wake, command ids stay valid) or "processes_ended" (runc: every
   * process ended; the wake starts a fresh agent, so commands of before
   * are StaleHandle). info.state becomes "hibernated". Errors as pause().
   */
  async hibernate(): Promise<string> {
    const r = await this.connection.unary<HibernateSandboxRequest, HibernateSandboxResponse>(this.connection.sandboxes, "hibernateSandbox", HibernateSandboxRequest.fromPartial({ sandboxId: this.id }));
    this.info = infoOf(r.sandbox);
    return lowerEnum(hibernationToJSON(r.hibernation), "HIBERNATION_");
  }

  /**
   * snapshot stores a point-in-time, crash-consistent copy of the
   * sandbox's root file system (paused, synced, btrfs snapshot, resumed:
   * every write the workload saw complete before the call is in it);
   * memory is not kept. It belongs to the caller and outlives the sandbox
   * until Snapshots.delete. Not retried: a lost reply is found by
   * Snapshots.list. Rejects with SandboxNotFound, a BerthError of reason
   * SNAPSHOT_UNSUPPORTED (not the btrfs snapshotter) or SNAPSHOT_LIMIT.
   */
  async snapshot(options: { labels?: Record<string, string> } = {}): Promise<SnapshotInfo> {
    const req = CreateSnapshotRequest.fromPartial({ sandboxId: this.id, labels: options.labels ?? {} });
    const r = await this.connection.call<CreateSnapshotRequest, CreateSnapshotResponse>(this.connection.sandboxes, "createSnapshot", req);
    return snapshotInfoOf(r.snapshot);
  }

  /**
   * fork makes count (1-16, default 1) new sandboxes from this one's files
   * as of one point in time, each with its own id, network address and
   * quota and this one's create spec; resolves to them in order, sharing
   * this Sandbox's connection (disposing them deletes them). With memory
   * (gVisor only) every process of this sandbox goes on in each child
   * where a checkpoint stopped it. All or nothing. requestId makes the
   * call idempotent, and only then is it retried: the same requestId
   * gives the same children. timeout in seconds (default 300). Rejects
   * with InvalidArgument (count, requestId, labels), SandboxNotFound, a
   * BerthError of reason SNAPSHOT_UNSUPPORTED (also memory of a runc
   * sandbox) or SANDBOX_EXISTS (requestId of another fork), and create's
   * errors for a child (FleetBusy, ...).
   */
  async fork(options: { count?: number; memory?: boolean; requestId?: string; labels?: Record<string, string>; timeout?: number } = {}): Promise<Sandbox[]> {
    const req = ForkSandboxRequest.fromPartial({
      sandboxId: this.id, count: intArg("count", options.count ?? 1, 16, 1), requestId: options.requestId ?? "", labels: options.labels ?? {},
      memory: options.memory ?? false,
    });
    const timeout = secondsArg("timeout", options.timeout) ?? 300;
    const r = options.requestId
      ? await this.connection.unary<ForkSandboxRequest, ForkSandboxResponse>(this.connection.sandboxes, "forkSandbox", req, timeout)
      : await this.connection.call<ForkSandboxRequest, ForkSandboxResponse>(this.connection.sandboxes, "forkSandbox", req, timeout);
    return r.sandboxes.map((s) => new Sandbox(this.connection, infoOf(s), false, true));
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
