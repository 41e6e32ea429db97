// sandbox.files.watch: a stream of file events under a directory
// (docs/watch.md), the Go client's FileWatch and the Python SDK's.

import { ClientReadableStream } from "@grpc/grpc-js";
import {
  FileEvent as PbFileEvent, FileWatchOverflow as PbFileWatchOverflow, WatchFilesRequest, WatchFilesResponse, fileEventKindToJSON,
  fileWatchOverflowReasonToJSON,
} from "../gen/berth/v1/watch";
import { Connection } from "./connection";
import { ProtocolError, fromServiceError, intArg, num } from "./errors";

/** Options of files.watch. */
export interface WatchOptions {
  /** recursive watches every directory under the path, later ones too. */
  recursive?: boolean;
  /** include keeps events whose file name matches one of these shell patterns. */
  include?: string[];
  /** watchId with sinceSeq (an integer from 0) resumes an existing watch after that event. */
  watchId?: string;
  sinceSeq?: number;
  /** bufferEvents bounds the watch's ring, in events (an integer; default berthd's 65536). */
  bufferEvents?: number;
}

/**
 * One change under a watched directory, plain data. seq numbers the
 * watch's events from 1, contiguously (overflow notes included); kind is
 * "create", "write", "remove", "rename" (oldPath is the path before it)
 * or what docs/watch.md lists; path is absolute; isDir says whether it is
 * a directory.
 */
export interface FileEvent {
  seq: number;
  kind: string;
  path: string;
  oldPath: string;
  isDir: boolean;
}

/**
 * A note that events were lost: rescan. reason is "kernel" (inotify's
 * queue overflowed), "ring" (the watch's ring shed events firstSeq to
 * lastSeq before this stream read them) or "watches" (directory path could
 * not be watched); seq is its place in the watch's sequence, 0 for "ring".
 */
export interface FileWatchOverflow {
  reason: string;
  seq: number;
  firstSeq: number;
  lastSeq: number;
  path: string;
}

/** What a FileWatch yields: a change ("file") or a note that events were lost ("overflow": rescan). */
export type WatchEvent = { kind: "file"; event: FileEvent } | { kind: "overflow"; overflow: FileWatchOverflow };

function eventOf(e: PbFileEvent): FileEvent {
  return { seq: num(e.seq), kind: fileEventKindToJSON(e.kind).replace(/^FILE_EVENT_KIND_/, "").toLowerCase(), path: e.path, oldPath: e.oldPath, isDir: e.isDir };
}

function overflowOf(o: PbFileWatchOverflow): FileWatchOverflow {
  return {
    reason: fileWatchOverflowReasonToJSON(o.reason).replace(/^FILE_WATCH_OVERFLOW_REASON_/, "").toLowerCase(), seq: num(o.seq),
    firstSeq: num(o.firstSeq), lastSeq: num(o.lastSeq), path: o.path,
  };
}

/**
 * An open WatchFiles stream: iterate it (for await) for events in seq
 * order. watchId names the watch and lastSeq is the seq of the latest
 * event yielded (or of the watch when the stream opened):
 * files.watch(path, { watchId, sinceSeq: lastSeq }) resumes after a broken
 * stream, each later event exactly once. close() ends the stream; the
 * watch lives on (10 minutes without a stream).
 */
export class FileWatch implements AsyncIterable<WatchEvent> {
  lastSeq: number;
  private closed = false;

  /** @internal */
  constructor(private readonly call: ClientReadableStream<WatchFilesResponse>, private readonly it: AsyncIterator<WatchFilesResponse>, readonly watchId: string, readonly path: string, lastSeq: number) {
    this.lastSeq = lastSeq;
  }

  /** @internal open opens the stream and reads its started message. */
  static async open(conn: Connection, req: WatchFilesRequest): Promise<FileWatch> {
    const call = conn.sandboxes.watchFiles(req, conn.metadata()) as ClientReadableStream<WatchFilesResponse>;
    const it = (call as AsyncIterable<WatchFilesResponse>)[Symbol.asyncIterator]();
    let first: IteratorResult<WatchFilesResponse>;
    try {
      first = await it.next();
    } catch (e) {
      call.cancel();
      throw fromServiceError(e);
    }
    if (first.done || first.value.event?.$case !== "started") {
      call.cancel();
      throw new ProtocolError("the WatchFiles stream did not begin with its started message");
    }
    const s = first.value.event.value;
    return new FileWatch(call, it, s.watchId, s.path, num(s.lastSeq));
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<WatchEvent> {
    for (;;) {
      let r: IteratorResult<WatchFilesResponse>;
      try {
        r = await this.it.next();
      } catch (e) {
        if (this.closed) return;
        throw fromServiceError(e);
      }
      if (r.done) return;
      const ev = r.value.event;
      if (ev?.$case === "file") {
        const e = eventOf(ev.value);
        this.lastSeq = e.seq;
        yield { kind: "file", event: e };
      } else if (ev?.$case === "overflow") {
        const o = overflowOf(ev.value);
        if (o.seq > 0) this.lastSeq = o.seq;
        yield { kind: "overflow", overflow: o };
      }
    }
  }

  /** next resolves to the next n events (fewer only if the stream ends). */
  async next(n: number): Promise<WatchEvent[]> {
    const out: WatchEvent[] = [];
    if (n <= 0) return out;
    for await (const ev of this) {
      out.push(ev);
      if (out.length === n) break;
    }
    return out;
  }

  /** close ends the stream; the watch lives on, to be resumed. */
  close(): void {
    this.closed = true;
    this.call.cancel();
  }
}

/** @internal watchRequest is files.watch's request. */
export function watchRequest(sandboxId: string, path: string, o: WatchOptions): WatchFilesRequest {
  return WatchFilesRequest.fromPartial({
    sandboxId, path, recursive: o.recursive ?? false, include: o.include ?? [], watchId: o.watchId ?? "",
    sinceSeq: BigInt(intArg("sinceSeq", o.sinceSeq) ?? 0), bufferEvents: intArg("bufferEvents", o.bufferEvents, 0xffffffff) ?? 0,
  });
}
