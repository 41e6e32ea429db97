// sandbox.files: the FileService of one sandbox, and directories moved as
// tar streams made and read by node-tar (the npm package "tar").

import * as fs from "node:fs";
import * as path from "node:path";
import { Readable } from "node:stream";
import * as tar from "tar";
import {
  Compression, DownloadRequest, DownloadResponse, FileInfo as PbFileInfo, FileType, ListDirError, ListDirRequest, ListDirResponse, MakeDirRequest,
  MakeDirResponse, ReadFileRequest, ReadFileResponse, RemoveRequest, RenameRequest, StatRequest, StatResponse, UploadRequest,
  UploadResponse, WriteFileRequest, WriteFileResponse, WriteMode,
} from "../gen/berth/v1/file";
import { Connection } from "./connection";
import { FileWatch, WatchOptions, watchRequest } from "./watch";
import { BerthError, FileNotFound, ProtocolError, fromServiceError, intArg, modeArg, num } from "./errors";
import { status as grpcStatus } from "@grpc/grpc-js";

/** The largest chunk sent in one WriteFile or Upload message (the proto's bound is 2 MiB). */
export const CHUNK = 1 << 20;

/** A file's type, as lstat(2) sees it. */
export type FileKind = "file" | "dir" | "symlink" | "fifo" | "socket" | "char_device" | "block_device" | "unknown";

const kinds: Record<number, FileKind> = {
  [FileType.FILE_TYPE_REGULAR]: "file", [FileType.FILE_TYPE_DIRECTORY]: "dir", [FileType.FILE_TYPE_SYMLINK]: "symlink",
  [FileType.FILE_TYPE_FIFO]: "fifo", [FileType.FILE_TYPE_SOCKET]: "socket", [FileType.FILE_TYPE_CHAR_DEVICE]: "char_device",
  [FileType.FILE_TYPE_BLOCK_DEVICE]: "block_device",
};

/**
 * One file as lstat(2) sees it; plain data, JSON-serialisable. mode is the
 * permission bits (st_mode & 0o7777); size in bytes (a number: see num);
 * modified an ISO 8601 time or null; name, path and symlinkTarget are
 * strings (names that are not UTF-8 show \xNN escapes).
 */
export interface FileInfo {
  name: string;
  path: string;
  type: FileKind;
  mode: number;
  size: number;
  uid: number;
  gid: number;
  modified: string | null;
  symlinkTarget: string;
}

function infoOf(i: PbFileInfo | undefined): FileInfo {
  if (!i) {
    throw new ProtocolError("berthd answered without the file's info");
  }
  return {
    name: i.displayName, path: i.displayPath, type: kinds[i.type] ?? "unknown", mode: i.mode, size: num(i.sizeBytes),
    uid: i.uid, gid: i.gid, modified: i.modifiedAt ? i.modifiedAt.toISOString() : null, symlinkTarget: i.displaySymlinkTarget,
  };
}

/** What files.write takes: a string (UTF-8), bytes, or a stream / async iterable of chunks (large files stream). */
export type WriteData = string | Uint8Array | Readable | AsyncIterable<Uint8Array | string>;

/** Options of files.write. */
export interface WriteOptions {
  /**
   * mode: permission bits as a number, written in octal: 0o644 (default:
   * the replaced file's, or 0o644). A string such as "0644" is refused
   * with InvalidArgument.
   */
  mode?: number;
  /** makeParents creates missing directories (default true). */
  makeParents?: boolean;
  /** append appends instead of replacing the file atomically. */
  append?: boolean;
}

/** berthd's counts of an uploadDir. */
export interface UploadSummary {
  files: number;
  directories: number;
  symlinks: number;
  hardLinks: number;
  contentBytes: number;
  archiveBytes: number;
  skippedCount: number;
}

const loc = (p: string) => ({ $case: "path" as const, value: p });

// write sends the messages of chunks on a client stream, waiting for
// "drain" when gRPC's buffer is full, then half-closes it.
async function pump(call: { write(m: unknown): boolean; once(e: "drain", f: () => void): unknown; end(): void },
  first: unknown, wrap: (c: Buffer) => unknown, chunks: AsyncIterable<Uint8Array | string>): Promise<void> {
  call.write(first);
  for await (const c of chunks) {
    const b = typeof c === "string" ? Buffer.from(c) : Buffer.from(c.buffer, c.byteOffset, c.byteLength);
    for (let i = 0; i < b.length; i += CHUNK) {
      if (!call.write(wrap(b.subarray(i, i + CHUNK)))) {
        await new Promise<void>((r) => call.once("drain", r));
      }
    }
  }
  call.end();
}

function iterable(data: WriteData): AsyncIterable<Uint8Array | string> {
  if (typeof data === "string" || data instanceof Uint8Array) {
    return (async function* () {
      yield data;
    })();
  }
  return data as AsyncIterable<Uint8Array | string>;
}

/**
 * The files of one sandbox (sandbox.files). Paths are absolute paths in
 * the sandbox; operations run as the sandbox's workload user. Errors:
 * FileNotFound, FileExists, FilePermissionDenied and the other BerthErrors
 * of docs/errors.md "File errors".
 */
export class Files {
  /** @internal */
  constructor(private readonly conn: Connection, private readonly sandboxId: string) {}

  /**
   * readStream yields the file's bytes in chunks of at most 1 MiB as they
   * arrive (limit 0: to the end), with backpressure. The stream ends with
   * FILE_CHANGED rather than yield a file that changed while read. offset
   * and limit are bytes, integers from 0 (else InvalidArgument).
   */
  async *readStream(p: string, options: { offset?: number; limit?: number } = {}): AsyncGenerator<Buffer> {
    const offsetBytes = BigInt(intArg("offset", options.offset) ?? 0);
    const limitBytes = BigInt(intArg("limit", options.limit) ?? 0);
    const call = this.conn.files.readFile(ReadFileRequest.fromPartial({ sandboxId: this.sandboxId, location: loc(p), offsetBytes, limitBytes }),
      this.conn.metadata());
    let want: number | undefined;
    let got = 0;
    try {
      for await (const m of call as AsyncIterable<ReadFileResponse>) {
        if (m.part?.$case === "header") {
          want = num(m.part.value.lengthBytes);
        } else if (m.part?.$case === "chunk") {
          got += m.part.value.length;
          yield Buffer.from(m.part.value);
        }
      }
    } catch (e) {
      throw fromServiceError(e);
    } finally {
      call.cancel();
    }
    if (want === undefined || got !== want) {
      throw new ProtocolError(`ReadFile ${p}: ${got} bytes arrived, the header said ${want}`);
    }
  }

  /**
   * watch opens (or, with watchId of an existing watch, resumes after
   * sinceSeq) a watch of the directory p: a FileWatch to iterate for
   * create/write/remove/rename events and overflow notes (docs/watch.md).
   * Rejects with FileNotFound, InvalidArgument, a BerthError of reason
   * NOT_A_DIRECTORY; with InvalidArgument before sending for a sinceSeq
   * or bufferEvents that is not an integer from 0.
   */
  async watch(p: string, options: WatchOptions = {}): Promise<FileWatch> {
    return FileWatch.open(this.conn, watchRequest(this.sandboxId, p, options));
  }

  /** read gives the file's bytes (readStream for large files). */
  async read(p: string, options: { offset?: number; limit?: number } = {}): Promise<Buffer> {
    const parts: Buffer[] = [];
    for await (const c of this.readStream(p, options)) {
      parts.push(c);
    }
    return Buffer.concat(parts);
  }

  /** readText gives the file decoded as UTF-8. */
  async readText(p: string): Promise<string> {
    return (await this.read(p)).toString("utf8");
  }

  /**
   * write writes data (a string as UTF-8, bytes, or a stream / async
   * iterable of chunks: large files stream with backpressure) to p and
   * resolves to the stored file's info. The file is replaced atomically
   * (readers see the old or the new one) unless append.
   */
  async write(p: string, data: WriteData, options: WriteOptions = {}): Promise<FileInfo> {
    const mode = modeArg("mode", options.mode);
    return new Promise<FileInfo>((resolve, reject) => {
      const call = this.conn.files.writeFile(this.conn.metadata(), (err, resp?: WriteFileResponse) =>
        err ? reject(fromServiceError(err)) : resolve(infoOf(resp!.info)));
      const size = typeof data === "string" ? Buffer.byteLength(data) : data instanceof Uint8Array ? data.length : undefined;
      const header = WriteFileRequest.fromPartial({
        part: {
          $case: "header",
          value: {
            sandboxId: this.sandboxId, location: loc(p), createParents: options.makeParents ?? true, mode,
            writeMode: options.append ? WriteMode.WRITE_MODE_APPEND : WriteMode.WRITE_MODE_REPLACE,
            sizeBytes: size === undefined ? undefined : BigInt(size),
          },
        },
      });
      pump(call, header, (c) => WriteFileRequest.fromPartial({ part: { $case: "chunk", value: c } }), iterable(data)).catch((e) => {
        call.cancel();
        reject(e);
      });
    });
  }

  /** stat gives lstat(2) of p. */
  async stat(p: string): Promise<FileInfo> {
    const r = await this.conn.call<StatRequest, StatResponse>(this.conn.files, "stat", StatRequest.fromPartial({ sandboxId: this.sandboxId, location: loc(p) }));
    return infoOf(r.info);
  }

  /** exists says whether p exists (a dangling symlink does). */
  async exists(p: string): Promise<boolean> {
    try {
      await this.stat(p);
      return true;
    } catch (e) {
      if (e instanceof FileNotFound) return false;
      throw e;
    }
  }

  /**
   * list gives the entries of directory p (depth levels deep, default 1;
   * an integer from 0 to 2^32 - 1, else InvalidArgument), in order.
   *
   * berthd lists a subdirectory it cannot read (PERMISSION_DENIED, ...)
   * and goes on, reporting it beside the entries; then, as the Go client's
   * Files.List, the whole listing is read and the first such directory
   * rejects with a BerthError of its reason (metadata.path names it) whose
   * entries hold every entry listed. A stream that fails midway rejects
   * with its error, the entries received before it in entries: nothing
   * received is discarded.
   */
  async list(p: string, options: { depth?: number } = {}): Promise<FileInfo[]> {
    const maxDepth = intArg("depth", options.depth, 0xffffffff) ?? 1;
    const call = this.conn.files.listDir(ListDirRequest.fromPartial({ sandboxId: this.sandboxId, location: loc(p), maxDepth }),
      this.conn.metadata());
    const out: FileInfo[] = [];
    let first: ListDirError | undefined;
    try {
      for await (const m of call as AsyncIterable<ListDirResponse>) {
        out.push(...m.entries.map(infoOf));
        first ??= m.errors[0];
      }
    } catch (e) {
      call.cancel();
      const err = fromServiceError(e);
      err.entries = out;
      throw err;
    }
    if (first) {
      const err = new BerthError(grpcStatus.FAILED_PRECONDITION, `list ${first.displayPath}: ${first.message}`, first.reason, { path: first.displayPath });
      err.entries = out;
      throw err;
    }
    return out;
  }

  /**
   * makeDir creates directory p (parents, default true: also its parents,
   * and an existing directory is fine). mode: permission bits as a number,
   * 0o755 (the default); a string is refused as in write.
   */
  async makeDir(p: string, options: { mode?: number; parents?: boolean } = {}): Promise<FileInfo> {
    const mode = modeArg("mode", options.mode);
    const r = await this.conn.call<MakeDirRequest, MakeDirResponse>(this.conn.files, "makeDir",
      MakeDirRequest.fromPartial({ sandboxId: this.sandboxId, location: loc(p), parents: options.parents ?? true, mode }));
    return infoOf(r.info);
  }

  /** remove removes p (recursive: a directory with its contents). */
  async remove(p: string, options: { recursive?: boolean } = {}): Promise<void> {
    await this.conn.call(this.conn.files, "remove", RemoveRequest.fromPartial({ sandboxId: this.sandboxId, location: loc(p), recursive: options.recursive ?? false }));
  }

  /** rename renames src to dst (overwrite: replace an existing dst). */
  async rename(src: string, dst: string, options: { overwrite?: boolean } = {}): Promise<void> {
    await this.conn.call(this.conn.files, "rename", RenameRequest.fromPartial({
      sandboxId: this.sandboxId, from: { $case: "fromPath", value: src }, to: { $case: "toPath", value: dst }, overwrite: options.overwrite ?? false,
    }));
  }

  /**
   * uploadDir copies the contents of localDir into remoteDir (created when
   * missing) as one tar stream made by node-tar: symlinks stay symlinks
   * (targets verbatim), permission bits and mtimes are kept; files belong
   * to the sandbox's workload user unless keepOwners. Atomic: on error
   * remoteDir is left as it was. Resolves to berthd's counts.
   */
  uploadDir(localDir: string, remoteDir: string, options: { keepOwners?: boolean } = {}): Promise<UploadSummary> {
    if (!fs.statSync(localDir).isDirectory()) {
      throw new Error(`uploadDir: ${localDir} is not a directory`);
    }
    const entries = fs.readdirSync(localDir).sort();
    return new Promise<UploadSummary>((resolve, reject) => {
      const call = this.conn.files.upload(this.conn.metadata(), (err, r?: UploadResponse) =>
        err ? reject(fromServiceError(err)) : resolve({
          files: num(r!.files), directories: num(r!.directories), symlinks: num(r!.symlinks), hardLinks: num(r!.hardLinks),
          contentBytes: num(r!.contentBytes), archiveBytes: num(r!.archiveBytes), skippedCount: num(r!.skippedCount),
        }));
      const header = UploadRequest.fromPartial({
        part: { $case: "header", value: { sandboxId: this.sandboxId, location: loc(remoteDir), compression: Compression.COMPRESSION_NONE, keepOwners: options.keepOwners ?? false } },
      });
      const archive = tar.create({ cwd: localDir, portable: !options.keepOwners, gzip: false }, entries) as unknown as AsyncIterable<Buffer>;
      pump(call, header, (c) => UploadRequest.fromPartial({ part: { $case: "chunk", value: c } }), archive).catch((e) => {
        call.cancel();
        reject(e);
      });
    });
  }

  /**
   * downloadDir copies the contents of remoteDir into localDir (created
   * when missing) from one tar stream read by node-tar: symlinks stay
   * symlinks (targets verbatim), permission bits (without setuid/setgid)
   * and mtimes are kept, files belong to the caller. Entries that would
   * land outside localDir (absolute names, "..", writes through a symlink:
   * node-tar's own checks) are refused, device nodes skipped: the sandbox
   * is not trusted.
   */
  async downloadDir(remoteDir: string, localDir: string): Promise<void> {
    fs.mkdirSync(localDir, { recursive: true });
    const root = path.resolve(localDir);
    const call = this.conn.files.download(DownloadRequest.fromPartial({ sandboxId: this.sandboxId, location: loc(remoteDir), compression: Compression.COMPRESSION_NONE }),
      this.conn.metadata());
    let refused: Error | undefined;
    const refuse = (why: string) => {
      refused ??= new Error(`downloadDir: ${why}`);
      return false;
    };
    // Symlinks are made after everything else (below), so that nothing is
    // extracted through one; node-tar would rewrite an absolute target.
    const links: { name: string; target: string }[] = [];
    const extract = tar.extract({
      cwd: root, strict: true, preserveOwner: false, chmod: true, processUmask: 0,
      filter: (name, entry) => {
        const e = entry as tar.ReadEntry;
        if (e.type === "CharacterDevice" || e.type === "BlockDevice") {
          return refuse(`archive entry ${name} is a device node`);
        }
        if (e.type === "SymbolicLink") {
          if (path.isAbsolute(name) || name.split("/").includes("..")) {
            return refuse(`archive entry ${name} is outside the directory`);
          }
          links.push({ name: name.replace(/\/+$/, ""), target: String(e.linkpath) });
          return false;
        }
        if (typeof e.mode === "number") e.mode &= ~0o6000;
        return true;
      },
    });
    const done = new Promise<void>((resolve, reject) => {
      extract.on("error", reject);
      extract.on("close", resolve);
    });
    try {
      for await (const m of call as AsyncIterable<DownloadResponse>) {
        if (m.part?.$case === "chunk") {
          if (!extract.write(Buffer.from(m.part.value))) {
            await new Promise((r) => extract.once("drain", r));
          }
        }
      }
      extract.end();
      await done;
    } catch (e) {
      call.cancel();
      throw fromServiceError(e);
    }
    if (refused) {
      throw refused;
    }
    for (const l of links) {
      const dest = path.join(root, l.name);
      const parent = fs.realpathSync(path.dirname(dest));
      if (parent !== root && !parent.startsWith(root + path.sep)) {
        throw new Error(`downloadDir: archive entry ${l.name} would be written through a symlink out of the directory`);
      }
      fs.rmSync(dest, { force: true });
      fs.symlinkSync(l.target, dest);
    }
  }
}
