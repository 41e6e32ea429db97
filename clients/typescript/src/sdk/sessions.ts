// sandbox.sessions: shell sessions (docs/sessions.md), the Python SDK's
// Sessions and the Go client's Session with the same names.

import { ProcessSpec, Shell } from "../gen/berth/v1/exec";
import {
  CreateSessionRequest, CreateSessionResponse, DeleteSessionRequest, ListSessionsRequest, ListSessionsResponse, SessionInfo as PbSessionInfo,
  sessionStateToJSON,
} from "../gen/berth/v1/session";
import { CommandResult, Commands, OutputCallback, userOf } from "./commands";
import { Connection } from "./connection";
import { BerthError, ProtocolError, duration, num } from "./errors";

/**
 * A session's record, plain data, JSON-serialisable. shell is "sh" or
 * "bash"; state "idle" (waits for a command), "busy" (currentExecId runs)
 * or "ended"; pid the shell's process id in the sandbox; createdAt an ISO
 * 8601 time or null; commands how many commands it has run; exitCode the
 * shell's exit status once ended (128+N when signal N killed it), else
 * null; user the user the shell runs as ("": the sandbox's workload user).
 */
export interface SessionInfo {
  sessionId: string;
  name: string;
  owner: string;
  shell: "sh" | "bash";
  state: string;
  pid: number;
  createdAt: string | null;
  currentExecId: string;
  commands: number;
  exitCode: number | null;
  user: string;
}

function infoOf(s: PbSessionInfo | undefined): SessionInfo {
  if (!s) throw new ProtocolError("berthd answered without the session");
  return {
    sessionId: s.sessionId, name: s.name, owner: s.owner, shell: s.shell === Shell.SHELL_BASH ? "bash" : "sh",
    state: sessionStateToJSON(s.state).replace(/^SESSION_STATE_/, "").toLowerCase(), pid: num(s.pid), createdAt: s.createdAt ? s.createdAt.toISOString() : null,
    currentExecId: s.currentExecId, commands: num(s.commands), exitCode: s.exitCode ?? null, user: s.user,
  };
}

/** Options of session.run. */
export interface SessionRunOptions {
  /**
   * timeout: seconds; at its end the command is interrupted like Ctrl-C
   * (exitCode 130, timedOut) and the session runs on. NaN, infinite or
   * negative: InvalidArgument before sending.
   */
  timeout?: number;
  onStdout?: OutputCallback;
  onStderr?: OutputCallback;
  /** capture: false keeps no output in the result. */
  capture?: boolean;
  /** execId names the command (else berthd mints one). */
  execId?: string;
}

/** Options of sessions.create. */
export interface SessionOptions {
  /** shell: "sh" (/bin/sh, default) or "bash". */
  shell?: "sh" | "bash";
  /** name: a label of the caller's, not unique. */
  name?: string;
  cwd?: string;
  env?: Record<string, string>;
  user?: string | number;
  /** sessionId names it (else berthd mints one). */
  sessionId?: string;
}

/**
 * A shell whose cwd, environment, variables, functions and background jobs
 * persist from one command to the next. info is the SessionInfo of its
 * creation (not refreshed: sessions.list gives the current one); id names it.
 */
export class Session {
  readonly id: string;

  /** @internal */
  constructor(private readonly conn: Connection, private readonly sandboxId: string, private readonly commands: Commands, readonly info: SessionInfo) {
    this.id = info.sessionId;
  }

  /**
   * run runs the shell command cmd in the session and resolves to its own
   * CommandResult (a non-zero exit is a result). One command at a time
   * (else FAILED_PRECONDITION SESSION_BUSY).
   */
  async run(cmd: string, options: SessionRunOptions = {}): Promise<CommandResult> {
    const spec = ProcessSpec.fromPartial({ sessionId: this.id, shellCommand: cmd });
    if (options.timeout !== undefined) spec.timeout = duration(options.timeout);
    const h = await this.commands.open({ $case: "start", value: { sandboxId: this.sandboxId, execId: options.execId ?? "", process: spec } } as any, options);
    try {
      return await h.wait();
    } catch (e) {
      if (!(e instanceof BerthError)) {
        await h.kill("INT").catch(() => {});
      }
      throw e;
    }
  }

  /** delete ends the shell and its background jobs and forgets the session. */
  async delete(): Promise<void> {
    await this.conn.call(this.conn.sandboxes, "deleteSession", DeleteSessionRequest.fromPartial({ sandboxId: this.sandboxId, sessionId: this.id }));
  }
}

/** The shell sessions of one sandbox (sandbox.sessions). */
export class Sessions {
  /** @internal */
  constructor(private readonly conn: Connection, private readonly sandboxId: string, private readonly commands: Commands) {}

  /** create starts a session; cwd, env and user as for commands.run. */
  async create(options: SessionOptions = {}): Promise<Session> {
    const req = CreateSessionRequest.fromPartial({
      sandboxId: this.sandboxId, sessionId: options.sessionId ?? "", name: options.name ?? "", cwd: options.cwd ?? "", env: options.env ?? {},
      user: userOf(options.user), shell: options.shell === "bash" ? Shell.SHELL_BASH : Shell.SHELL_SH,
    });
    const resp = await this.conn.call<CreateSessionRequest, CreateSessionResponse>(this.conn.sandboxes, "createSession", req);
    return new Session(this.conn, this.sandboxId, this.commands, infoOf(resp.session));
  }

  /** list gives the sandbox's sessions, oldest first. */
  async list(): Promise<SessionInfo[]> {
    const resp = await this.conn.call<ListSessionsRequest, ListSessionsResponse>(this.conn.sandboxes, "listSessions", ListSessionsRequest.fromPartial({ sandboxId: this.sandboxId }));
    return resp.sessions.map(infoOf);
  }
}
