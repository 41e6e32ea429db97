// sandbox.commands: commands in a sandbox over the Exec stream.

import { ClientDuplexStream } from "@grpc/grpc-js";
import { Readable } from "node:stream";
import {
  ExecRequest, ExecResponse, ExecResult, ExecState, ListExecsRequest, ListExecsResponse, ProcessSpec, Shell, SignalExecRequest,
  SignalExecResponse, Stream, execStateToJSON,
} from "../gen/berth/v1/exec";
import { Connection } from "./connection";
import { BerthError, ProtocolError, duration, fromServiceError, intArg, num, seconds } from "./errors";
import { status as grpcStatus } from "@grpc/grpc-js";

/** The largest stdin chunk sent in one message (the Go client's). */
export const STDIN_CHUNK = 1 << 20;

/**
 * Called with each chunk of output as it arrives, in order. When it returns
 * a promise the stream waits for it before the next chunk (a slow consumer
 * slows the command through gRPC's flow control; nothing is lost).
 */
export type OutputCallback = (chunk: Buffer) => void | Promise<void>;

/** What a command reads: bytes, a string (UTF-8), or a stream / async iterable of chunks. */
export type StdinData = string | Uint8Array | Readable | AsyncIterable<Uint8Array | string>;

/**
 * How a command ended; plain data, JSON-serialisable. exitCode is the exit
 * status (128+N when killed by signal N; null only if berthd reported
 * none); signal the name of the signal that killed it ("SIGKILL") or "";
 * timedOut is true when its timeout killed it, oomKilled when the OOM
 * killer did. stdout and stderr are the output decoded as UTF-8 (empty
 * with capture: false; for exact bytes use onStdout/onStderr, which get
 * Buffers). stdoutBytes/stderrBytes count all the command wrote, also
 * beyond a cap or lost to a detached ring (droppedBytes counts those
 * lost). duration is in seconds. Sizes are numbers (see num).
 */
export interface CommandResult {
  execId: string;
  exitCode: number | null;
  signal: string;
  timedOut: boolean;
  oomKilled: boolean;
  stdout: string;
  stderr: string;
  stdoutBytes: number;
  stderrBytes: number;
  stdoutTruncated: boolean;
  stderrTruncated: boolean;
  droppedBytes: number;
  duration: number;
}

/** Options of commands.run and commands.start. */
export interface RunOptions {
  /** cwd: an absolute directory (default the sandbox's workdir). */
  cwd?: string;
  /** env: added to the sandbox's environment. */
  env?: Record<string, string>;
  /** user: a name from the sandbox's /etc/passwd, "uid", "uid:gid" or a number (a uid from 0 to 2^32 - 1). */
  user?: string | number;
  /**
   * timeout: seconds the command may run (1 s to 24 h; the server's
   * bounds, else InvalidArgument; NaN, infinite, negative or not a number:
   * InvalidArgument before sending); on expiry berthd sends its process group
   * SIGTERM, then SIGKILL after its grace, and the result says timedOut.
   * Default: the server's (30 min).
   */
  timeout?: number;
  /** stdin: sent then closed; unset: the command reads /dev/null (start: true keeps it open for sendStdin). */
  stdin?: StdinData | true;
  onStdout?: OutputCallback;
  onStderr?: OutputCallback;
  /** capture: false keeps no output in the result (for huge outputs). */
  capture?: boolean;
  /** execId names the command (else berthd mints one). */
  execId?: string;
  /** shell runs a string command with "sh" (default) or "bash". */
  shell?: "sh" | "bash";
}

/** Options of commands.connect. */
export interface ConnectOptions {
  /** sinceSeq: replay the retained output after this sequence number (an integer; 0: all). */
  sinceSeq?: number;
  onStdout?: OutputCallback;
  onStderr?: OutputCallback;
  capture?: boolean;
}

/** One command of commands.list, JSON-serialisable. */
export interface CommandInfo {
  execId: string;
  state: "running" | "exited" | string;
  argv: string[];
  pid: number;
  lastSeq: number;
  startedAt: string | null;
}

type Call = ClientDuplexStream<ExecRequest, ExecResponse>;

/**
 * @internal userOf is the user of a command, session or sandbox: a name,
 * "uid[:gid]", a uid or [uid, gid], whose numbers are integers from 0 to
 * 2^32 - 1 (else InvalidArgument naming "user").
 */
export function userOf(u: string | number | [number, number] | undefined): string {
  if (u === undefined) return "";
  if (Array.isArray(u)) return u.map((id) => intArg("user", id, 0xffffffff)).join(":");
  if (typeof u === "number") return String(intArg("user", u, 0xffffffff));
  return String(u);
}

function processSpec(cmd: string | string[], o: RunOptions, stdin: boolean): ProcessSpec {
  const spec = ProcessSpec.fromPartial({ cwd: o.cwd ?? "", env: o.env ?? {}, stdin, user: userOf(o.user) });
  if (typeof cmd === "string") {
    spec.shellCommand = cmd;
    spec.shell = o.shell === "bash" ? Shell.SHELL_BASH : Shell.SHELL_SH;
  } else if (Array.isArray(cmd) && cmd.length > 0) {
    spec.argv = [...cmd];
  } else {
    throw new TypeError("commands.run: cmd must be a string (run by the shell) or a non-empty argv array");
  }
  if (o.timeout !== undefined) {
    spec.timeout = duration(o.timeout);
  }
  return spec;
}

function resultOf(execId: string, r: ExecResult | undefined, out: Buffer[], err: Buffer[], dropped: number): CommandResult {
  return {
    execId,
    exitCode: r?.exitCode ?? null,
    signal: r?.signal ?? "",
    timedOut: r?.timedOut ?? false,
    oomKilled: r?.oomKilled ?? false,
    stdout: Buffer.concat(out).toString("utf8"),
    stderr: Buffer.concat(err).toString("utf8"),
    stdoutBytes: num(r?.stdoutBytes),
    stderrBytes: num(r?.stderrBytes),
    stdoutTruncated: r?.stdoutTruncated ?? false,
    stderrTruncated: r?.stderrTruncated ?? false,
    droppedBytes: dropped,
    duration: seconds(r?.duration),
  };
}

/**
 * A running command. Its output is handed to onStdout/onStderr and kept
 * (with capture) until wait() gives the CommandResult. kill() signals it;
 * sendStdin() and closeStdin() feed it; disconnect() leaves it running, to
 * be followed again with commands.connect(execId, {sinceSeq: lastSeq}).
 */
export class CommandHandle {
  readonly execId: string;
  readonly pid: number;
  /** lastSeq is the sequence number of the last output received. */
  lastSeq: number;
  private readonly out: Buffer[] = [];
  private readonly err: Buffer[] = [];
  private dropped = 0;
  private ended = false;
  private disconnecting = false;
  private readonly result: Promise<CommandResult>;

  /** @internal use commands.run, start or connect. */
  constructor(private readonly conn: Connection, readonly sandboxId: string, private readonly call: Call, started: ExecResponse,
    private readonly opts: ConnectOptions) {
    if (started.event?.$case !== "started") {
      throw new ProtocolError("the exec stream's first event is not started");
    }
    this.execId = started.event.value.execId;
    this.pid = num(started.event.value.pid);
    this.lastSeq = opts.sinceSeq ?? 0;
    const capture = opts.capture ?? true;
    this.result = new Promise<CommandResult>((resolve, reject) => {
      let done = false;
      const finish = (e?: unknown, r?: CommandResult) => {
        if (done) return;
        done = true;
        this.ended = true;
        call.removeAllListeners("data");
        if (e === undefined) {
          resolve(r!);
        } else {
          call.cancel();
          reject(e);
        }
      };
      call.on("data", (ev: ExecResponse) => {
        try {
          const e = ev.event;
          if (e?.$case === "output") {
            const seq = num(e.value.seq);
            if (seq !== this.lastSeq + 1) {
              throw new ProtocolError(`exec ${this.execId}: output seq ${seq} after ${this.lastSeq} without a dropped event`);
            }
            this.lastSeq = seq;
            const data = Buffer.from(e.value.data);
            const stderr = e.value.stream === Stream.STREAM_STDERR;
            if (capture) (stderr ? this.err : this.out).push(data);
            const p = (stderr ? opts.onStderr : opts.onStdout)?.(data);
            if (p && typeof (p as Promise<void>).then === "function") {
              call.pause();
              (p as Promise<void>).then(() => call.resume(), (x) => finish(x));
            }
          } else if (e?.$case === "dropped") {
            this.dropped += num(e.value.lostBytes);
            this.lastSeq = Math.max(this.lastSeq, num(e.value.lastSeq));
          } else if (e?.$case === "exited") {
            const r = resultOf(this.execId, e.value.result, this.out, this.err, this.dropped);
            this.out.length = 0;
            this.err.length = 0;
            call.end();
            finish(undefined, r);
          }
        } catch (x) {
          finish(x);
        }
      });
      call.on("error", (e) => {
        if (this.disconnecting) {
          finish(new BerthError(grpcStatus.CANCELLED, `exec ${this.execId}: disconnected; the command runs on`));
        } else {
          finish(fromServiceError(e));
        }
      });
      call.on("end", () => finish(new ProtocolError(`exec ${this.execId}: the stream ended without an exited event`)));
    });
    this.result.catch(() => {}); // wait() reports it
  }

  /**
   * wait resolves to the CommandResult when the command ends (a non-zero
   * exit is a result, not an error); rejects with the BerthError that ended
   * the stream (e.g. RuntimeReplaced) or a callback's error.
   */
  wait(): Promise<CommandResult> {
    return this.result;
  }

  /** done says whether the stream has ended. */
  get done(): boolean {
    return this.ended;
  }

  /** The stdout received so far (with capture), as UTF-8. */
  get stdout(): string {
    return Buffer.concat(this.out).toString("utf8");
  }

  /** The stderr received so far (with capture), as UTF-8. */
  get stderr(): string {
    return Buffer.concat(this.err).toString("utf8");
  }

  /**
   * sendStdin sends data to the command's stdin (started with stdin: true
   * or given stdin), in messages of at most 1 MiB; resolves when the stream
   * took it (flow control).
   */
  async sendStdin(data: string | Uint8Array): Promise<void> {
    if (this.ended) {
      throw new BerthError(grpcStatus.FAILED_PRECONDITION, `exec ${this.execId}: the stream has ended`);
    }
    const b = typeof data === "string" ? Buffer.from(data) : Buffer.from(data);
    for (let i = 0; i < b.length; i += STDIN_CHUNK) {
      const ok = this.call.write(ExecRequest.fromPartial({ event: { $case: "stdin", value: { data: b.subarray(i, i + STDIN_CHUNK) } } }));
      if (!ok) {
        await new Promise((r) => this.call.once("drain", r));
      }
    }
  }

  /** closeStdin closes the command's stdin: it reads end of file. */
  closeStdin(): void {
    if (!this.ended) {
      this.call.write(ExecRequest.fromPartial({ event: { $case: "closeStdin", value: {} } }));
    }
  }

  /**
   * kill sends signal ("KILL", "TERM", "INT", ...) to the command's process
   * group (SignalExec: works with or without this stream). Resolves to
   * false when the command had ended already.
   */
  kill(signal = "KILL"): Promise<boolean> {
    return signalExec(this.conn, this.sandboxId, this.execId, signal);
  }

  /** disconnect ends this stream; the command runs on in the sandbox. */
  async disconnect(): Promise<void> {
    if (this.ended) return;
    this.disconnecting = true;
    this.call.cancel();
    await this.result.catch(() => {});
  }
}

async function signalExec(conn: Connection, sandboxId: string, execId: string, signal: string): Promise<boolean> {
  const resp = await conn.call<SignalExecRequest, SignalExecResponse>(conn.sandboxes, "signalExec",
    SignalExecRequest.fromPartial({ sandboxId, execId, signal }));
  return resp.state === ExecState.EXEC_STATE_RUNNING;
}

/** feedStdin sends stdin to handle and closes it; errors end up in wait(). */
async function feedStdin(h: CommandHandle, stdin: StdinData): Promise<void> {
  try {
    if (typeof stdin === "string" || stdin instanceof Uint8Array) {
      await h.sendStdin(stdin);
    } else {
      for await (const chunk of stdin as AsyncIterable<Uint8Array | string>) {
        await h.sendStdin(chunk);
      }
    }
    h.closeStdin();
  } catch {
    // the stream ended; wait() says why
  }
}

/** The commands of one sandbox (sandbox.commands). */
export class Commands {
  /** @internal */
  constructor(private readonly conn: Connection, private readonly sandboxId: string) {}

  /**
   * @internal open opens an Exec stream with first and resolves once
   * berthd says the command runs; retried under the policy (only
   * conditions under which nothing ran). Sessions run their commands
   * through it.
   */
  open(first: ExecRequest["event"], opts: ConnectOptions): Promise<CommandHandle> {
    return this.conn.retry(
      () =>
        new Promise<CommandHandle>((resolve, reject) => {
          const call: Call = this.conn.sandboxes.exec(this.conn.metadata());
          const onError = (e: unknown) => reject(fromServiceError(e));
          const onEnd = () => reject(new ProtocolError("the exec stream ended before the started event"));
          call.once("error", onError);
          call.once("end", onEnd);
          call.once("data", (ev: ExecResponse) => {
            call.removeListener("error", onError);
            call.removeListener("end", onEnd);
            call.pause(); // until the handle listens
            try {
              const h = new CommandHandle(this.conn, this.sandboxId, call, ev, opts);
              call.resume();
              resolve(h);
            } catch (e) {
              call.cancel();
              reject(e);
            }
          });
          call.write(ExecRequest.fromPartial({ event: first }));
        }),
    );
  }

  /**
   * run runs cmd and resolves to its CommandResult when it ends (a
   * non-zero exit is a result, not an error).
   *
   * cmd: a string runs as `sh -c cmd` (shell: "bash": bash), an array is
   * the exact argv. See RunOptions for the rest. If a callback throws, the
   * command is killed before the error propagates. Rejects with BerthError
   * subclasses: InvalidArgument, SandboxNotFound, FleetBusy (after the
   * retries), RuntimeReplaced, ...
   */
  async run(cmd: string | string[], options: RunOptions = {}): Promise<CommandResult> {
    const stdin = options.stdin;
    const spec = processSpec(cmd, options, stdin !== undefined);
    const h = await this.open({ $case: "start", value: { sandboxId: this.sandboxId, execId: options.execId ?? "", process: spec } } as any, options);
    if (stdin !== undefined && stdin !== true) {
      void feedStdin(h, stdin);
    }
    try {
      return await h.wait();
    } catch (e) {
      if (!(e instanceof BerthError)) {
        await h.kill("KILL").catch(() => {});
      }
      throw e;
    }
  }

  /**
   * start starts cmd as a background command and resolves to its handle
   * once it runs. The command lives on its own (berthd retains its
   * output): it outlives this stream and this process, and runs until it
   * exits, is killed, or options.timeout seconds pass (result.timedOut).
   * stdin: true leaves stdin open for sendStdin(); data is sent and closed.
   */
  async start(cmd: string | string[], options: RunOptions = {}): Promise<CommandHandle> {
    const stdin = options.stdin;
    const spec = processSpec(cmd, options, stdin !== undefined);
    const first = ExecRequest.fromPartial({
      event: { $case: "start", value: { sandboxId: this.sandboxId, execId: options.execId ?? "", process: spec, background: true } },
    });
    // The starting stream ends once berthd says the command runs; its
    // output is followed by an attach from the first seq.
    const execId = await this.conn.retry(
      () =>
        new Promise<string>((resolve, reject) => {
          const call: Call = this.conn.sandboxes.exec(this.conn.metadata());
          call.on("error", (e) => reject(fromServiceError(e)));
          call.on("end", () => reject(new ProtocolError("the background exec stream ended before the started event")));
          call.on("data", (ev: ExecResponse) => {
            if (ev.event?.$case === "started") {
              resolve(ev.event.value.execId);
              call.removeAllListeners("error");
              call.on("error", () => {});
              call.cancel();
            }
          });
          call.write(first);
        }),
    );
    const h = await this.connect(execId, options);
    if (stdin !== undefined && stdin !== true) {
      void feedStdin(h, stdin);
    }
    return h;
  }

  /**
   * connect follows the command execId again (its own or another
   * process's): berthd replays the retained output after sinceSeq (0: all),
   * then follows live. Rejects with ExecNotFound, StaleHandle (an exec of
   * an earlier runtime of the sandbox).
   */
  async connect(execId: string, options: ConnectOptions = {}): Promise<CommandHandle> {
    const sinceSeq = BigInt(intArg("sinceSeq", options.sinceSeq) ?? 0);
    return this.open({ $case: "attach", value: { sandboxId: this.sandboxId, execId, sinceSeq } } as any, options);
  }

  /** list gives the sandbox's commands that run or ended recently (ListExecs). */
  async list(): Promise<CommandInfo[]> {
    const resp = await this.conn.call<ListExecsRequest, ListExecsResponse>(this.conn.sandboxes, "listExecs", ListExecsRequest.fromPartial({ sandboxId: this.sandboxId }));
    return resp.execs.map((e) => ({
      execId: e.execId,
      state: execStateToJSON(e.state).replace(/^EXEC_STATE_/, "").toLowerCase(),
      argv: e.argv,
      pid: num(e.pid),
      lastSeq: num(e.lastSeq),
      startedAt: e.startedAt ? e.startedAt.toISOString() : null,
    }));
  }

  /** kill signals the command execId; resolves to false when it had ended already. */
  kill(execId: string, signal = "KILL"): Promise<boolean> {
    return signalExec(this.conn, this.sandboxId, execId, signal);
  }
}
