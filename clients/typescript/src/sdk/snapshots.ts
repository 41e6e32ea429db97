// berth.Snapshots: stored copies of sandboxes' files (docs/state.md), the
// Python SDK's Snapshots with the same names.

import {
  CommitSnapshotRequest, CommitSnapshotResponse, DeleteSnapshotRequest, ListSnapshotsRequest, ListSnapshotsResponse,
  Snapshot as PbSnapshot,
} from "../gen/berth/v1/sandbox";
import { Connection, ConnectionOptions } from "./connection";
import { ProtocolError, num } from "./errors";

/**
 * A snapshot's record, plain data, JSON-serialisable: created is an ISO
 * 8601 time or null; sizeBytes what it holds beyond its image and
 * diskBytes what it counts against its owner's disk, in bytes (numbers:
 * see num); image the image a sandbox created from it runs.
 */
export interface SnapshotInfo {
  id: string;
  sandboxId: string;
  owner: string;
  image: string;
  created: string | null;
  sizeBytes: number;
  diskBytes: number;
  labels: Record<string, string>;
}

/** @internal snapshotInfoOf reads a Snapshot message. */
export function snapshotInfoOf(s: PbSnapshot | undefined): SnapshotInfo {
  if (!s) throw new ProtocolError("berthd answered without the snapshot");
  return {
    id: s.id, sandboxId: s.sandboxId, owner: s.owner, image: s.image, created: s.created ? s.created.toISOString() : null,
    sizeBytes: num(s.sizeBytes), diskBytes: num(s.diskBytes), labels: { ...s.labels },
  };
}

/** Options of Snapshots.commit: the image's config changes (unset: the snapshot's image's), and replace (admins only). */
export interface CommitOptions {
  replace?: boolean;
  /** env: "KEY=VALUE" variables set in the image's Env. */
  env?: string[];
  workingDir?: string;
  entrypoint?: string[];
  cmd?: string[];
}

/**
 * The caller's snapshots on one berthd: point-in-time, crash-consistent
 * copies of sandboxes' root file systems (btrfs, copy-on-write), taken with
 * sb.snapshot() and kept until delete, whatever happens to the sandbox.
 *
 *     const snap = await sb.snapshot({ labels: { step: "3" } });
 *     const again = await Sandbox.create({ fromSnapshot: snap.id, connection: conn });
 *     await new Snapshots({ connection: conn }).delete(snap.id);
 *
 * Errors carry reasons: SNAPSHOT_NOT_FOUND (also for another principal's),
 * SNAPSHOT_IN_USE, SNAPSHOT_LIMIT, SNAPSHOT_UNSUPPORTED (docs/errors.md).
 */
export class Snapshots {
  readonly connection: Connection;
  private readonly owns: boolean;

  constructor(options: ConnectionOptions & { connection?: Connection } = {}) {
    this.owns = !options.connection;
    this.connection = options.connection ?? new Connection(options);
  }

  /** list gives the caller's snapshots (an admin's: all), oldest first. */
  async list(): Promise<SnapshotInfo[]> {
    const r = await this.connection.unary<ListSnapshotsRequest, ListSnapshotsResponse>(this.connection.sandboxes, "listSnapshots", ListSnapshotsRequest.fromPartial({}));
    return r.snapshots.map(snapshotInfoOf);
  }

  /** delete removes the snapshot; a BerthError of reason SNAPSHOT_NOT_FOUND, or SNAPSHOT_IN_USE while a sandbox created from it exists. */
  async delete(id: string): Promise<void> {
    await this.connection.unary(this.connection.sandboxes, "deleteSnapshot", DeleteSnapshotRequest.fromPartial({ snapshotId: id }));
  }

  /**
   * commit makes image reference of the snapshot, like docker commit: its
   * image plus one layer of what the snapshot changed; Sandbox.create
   * takes it. Resolves to the image's name. Not retried: a lost reply is
   * found in the image list. Rejects with InvalidArgument (snapshot_id,
   * reference), a BerthError of reason SNAPSHOT_NOT_FOUND, IMAGE_NOT_FOUND,
   * IMAGE_EXISTS, NO_SPACE or SNAPSHOT_LIMIT.
   */
  async commit(id: string, reference: string, options: CommitOptions = {}): Promise<string> {
    const req = CommitSnapshotRequest.fromPartial({
      snapshotId: id, reference, replace: options.replace ?? false,
      changes: { env: options.env ?? [], workingDir: options.workingDir ?? "", entrypoint: options.entrypoint ?? [], cmd: options.cmd ?? [] },
    });
    const r = await this.connection.call<CommitSnapshotRequest, CommitSnapshotResponse>(this.connection.sandboxes, "commitSnapshot", req);
    if (!r.image) throw new ProtocolError("berthd answered without the image");
    return r.image.name;
  }

  /** close closes the connection when this Snapshots made it. */
  close(): void {
    if (this.owns) this.connection.close();
  }
}
