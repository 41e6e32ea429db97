// sandbox.contexts: code contexts, long-lived Python interpreters
// (docs/contexts.md), in the shape of E2B's runCode.

import {
  CodeContextInfo, CodeError, CodeResult, CreateCodeContextRequest, CreateCodeContextResponse, DeleteCodeContextRequest,
  ExecuteCodeRequest, ExecuteCodeResponse, InterruptCodeContextRequest, ListCodeContextsRequest, ListCodeContextsResponse,
  RestartCodeContextRequest, RestartCodeContextResponse,
} from "../gen/berth/v1/context";
import { Connection } from "./connection";
import { duration, fromServiceError } from "./errors";

/**
 * What a cell did: stdout and stderr (text, in order), results (rich
 * results: data maps MIME types to bytes, isMainResult marks the last
 * expression's value), error (name, value, traceback; undefined when the
 * cell ran through), timedOut.
 */
export interface Execution {
  stdout: string;
  stderr: string;
  results: CodeResult[];
  error?: CodeError;
  timedOut: boolean;
  /** text is the text/plain of the main result, undefined when none. */
  text?: string;
}

/**
 * RunCodeOptions: timeout in seconds (KeyboardInterrupt at its end; NaN,
 * infinite or negative: InvalidArgument); callbacks see each event as it
 * comes.
 */
export interface RunCodeOptions {
  timeout?: number;
  onStdout?: (text: string) => void;
  onStderr?: (text: string) => void;
  onResult?: (r: CodeResult) => void;
  onError?: (e: CodeError) => void;
}

/** A Python interpreter whose variables persist from one cell to the next. */
export class CodeContext {
  readonly id: string;

  /** @internal use sandbox.contexts.create. */
  constructor(private readonly conn: Connection, private readonly sandboxId: string, public info: CodeContextInfo) {
    this.id = info.contextId;
  }

  /** runCode runs code as one cell. Rejects with a BerthError with reason CONTEXT_NOT_FOUND or CONTEXT_ENDED. */
  runCode(code: string, opts: RunCodeOptions = {}): Promise<Execution> {
    const req = ExecuteCodeRequest.fromPartial({ sandboxId: this.sandboxId, contextId: this.id, code });
    if (opts.timeout !== undefined) {
      try {
        req.timeout = duration(opts.timeout);
      } catch (e) {
        return Promise.reject(e);
      }
    }
    const ex: Execution = { stdout: "", stderr: "", results: [], timedOut: false };
    return new Promise((resolve, reject) => {
      const call = this.conn.sandboxes.executeCode(req, this.conn.metadata());
      call.on("data", (m: ExecuteCodeResponse) => {
        const ev = m.event;
        switch (ev?.$case) {
          case "stdout":
            ex.stdout += ev.value;
            opts.onStdout?.(ev.value);
            break;
          case "stderr":
            ex.stderr += ev.value;
            opts.onStderr?.(ev.value);
            break;
          case "result":
            ex.results.push(ev.value);
            if (ev.value.isMainResult && ev.value.data["text/plain"] !== undefined) ex.text = Buffer.from(ev.value.data["text/plain"]).toString();
            opts.onResult?.(ev.value);
            break;
          case "error":
            ex.error = ev.value;
            opts.onError?.(ev.value);
            break;
          case "done":
            ex.timedOut = ev.value.timedOut;
            break;
        }
      });
      call.on("error", (err) => reject(fromServiceError(err)));
      call.on("end", () => resolve(ex));
    });
  }

  /** interrupt raises KeyboardInterrupt in the running cell. */
  async interrupt(): Promise<void> {
    await this.conn.call(this.conn.sandboxes, "interruptCodeContext", InterruptCodeContextRequest.fromPartial({ sandboxId: this.sandboxId, contextId: this.id }));
  }

  /** restart replaces the interpreter with a fresh one: every variable is gone. */
  async restart(): Promise<void> {
    const r = await this.conn.call<RestartCodeContextRequest, RestartCodeContextResponse>(this.conn.sandboxes, "restartCodeContext",
      RestartCodeContextRequest.fromPartial({ sandboxId: this.sandboxId, contextId: this.id }));
    this.info = r.context!;
  }

  /** delete ends the interpreter. */
  async delete(): Promise<void> {
    await this.conn.call(this.conn.sandboxes, "deleteCodeContext", DeleteCodeContextRequest.fromPartial({ sandboxId: this.sandboxId, contextId: this.id }));
  }
}

/** The code contexts of one sandbox (sandbox.contexts). */
export class CodeContexts {
  /** @internal */
  constructor(private readonly conn: Connection, private readonly sandboxId: string) {}

  /** create starts a python3 interpreter (else FailedPrecondition INTERPRETER_MISSING). */
  async create(opts: { language?: string; cwd?: string; env?: Record<string, string>; user?: string; contextId?: string } = {}): Promise<CodeContext> {
    const r = await this.conn.call<CreateCodeContextRequest, CreateCodeContextResponse>(this.conn.sandboxes, "createCodeContext",
      CreateCodeContextRequest.fromPartial({ sandboxId: this.sandboxId, ...opts }));
    return new CodeContext(this.conn, this.sandboxId, r.context!);
  }

  /** list lists the contexts whose interpreter runs, oldest first. */
  async list(): Promise<CodeContextInfo[]> {
    const r = await this.conn.call<ListCodeContextsRequest, ListCodeContextsResponse>(this.conn.sandboxes, "listCodeContexts",
      ListCodeContextsRequest.fromPartial({ sandboxId: this.sandboxId }));
    return r.contexts;
  }
}
