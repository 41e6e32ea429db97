// berth.Volumes: named volumes that sandboxes mount (docs/volumes.md), the
// Python SDK's Volumes with the same names.

import {
  CreateVolumeRequest, CreateVolumeResponse, DeleteVolumeRequest, GetVolumeRequest, GetVolumeResponse, ListVolumesRequest, ListVolumesResponse,
  Volume as PbVolume, VolumeMount,
} from "../gen/berth/v1/volume";
import { Connection, ConnectionOptions } from "./connection";
import { ProtocolError, intArg, num } from "./errors";

/**
 * A volume's record, plain data, JSON-serialisable. created is an ISO 8601
 * time or null; quotaBytes caps what it holds and usedBytes is what it
 * holds now (btrfs quota group exclusive bytes, read when berthd answered),
 * both in bytes (numbers: see num); sandboxIds lists the sandboxes that
 * mount it now, sorted.
 */
export interface VolumeInfo {
  name: string;
  owner: string;
  created: string | null;
  quotaBytes: number;
  usedBytes: number;
  sandboxIds: string[];
}

function infoOf(v: PbVolume | undefined): VolumeInfo {
  if (!v) throw new ProtocolError("berthd answered without the volume");
  return {
    name: v.name, owner: v.owner, created: v.created ? v.created.toISOString() : null, quotaBytes: num(v.quotaBytes), usedBytes: num(v.usedBytes),
    sandboxIds: [...v.sandboxIds],
  };
}

/**
 * A volume mount for Sandbox.create({ volumes }): "NAME:PATH" or
 * "NAME:PATH:ro", or { name, path, readOnly }.
 */
export type VolumeMountSpec = string | { name: string; path: string; readOnly?: boolean };

/** @internal volumeMounts reads Sandbox.create's volumes; berthd checks names and paths. */
export function volumeMounts(specs: VolumeMountSpec[] | undefined): VolumeMount[] {
  return (specs ?? []).map((s) => {
    if (typeof s !== "string") return { name: s.name, path: s.path, readOnly: s.readOnly ?? false };
    const parts = s.split(":");
    if ((parts.length !== 2 && parts.length !== 3) || (parts.length === 3 && parts[2] !== "ro" && parts[2] !== "rw")) {
      throw new TypeError(`volume mount ${JSON.stringify(s)}: want NAME:PATH or NAME:PATH:ro`);
    }
    return { name: parts[0], path: parts[1], readOnly: parts[2] === "ro" };
  });
}

/**
 * The caller's named volumes on one berthd: btrfs subvolumes with a quota
 * of their own, mounted into sandboxes at create and kept until delete.
 *
 *     const vols = new Volumes({ connection: conn });
 *     await vols.create("data", { quotaBytes: 1 << 30 });
 *     const sb = await Sandbox.create({ volumes: ["data:/data"], connection: conn });
 */
export class Volumes {
  readonly connection: Connection;
  private readonly owns: boolean;

  constructor(options: ConnectionOptions & { connection?: Connection } = {}) {
    this.owns = !options.connection;
    this.connection = options.connection ?? new Connection(options);
  }

  /**
   * create makes an empty volume; quotaBytes (bytes, an integer) 0 (default)
   * takes berthd's default disk quota. Rejects with InvalidArgument (name, quota_bytes),
   * a BerthError of reason VOLUME_EXISTS, FleetBusy past the caller's disk
   * cap. Not retried: a lost reply is found by get.
   */
  async create(name: string, options: { quotaBytes?: number } = {}): Promise<VolumeInfo> {
    const req = CreateVolumeRequest.fromPartial({ name, quotaBytes: BigInt(intArg("quotaBytes", options.quotaBytes) ?? 0) });
    return infoOf((await this.connection.call<CreateVolumeRequest, CreateVolumeResponse>(this.connection.sandboxes, "createVolume", req)).volume);
  }

  /** get resolves to the volume with its usage and the sandboxes that mount it; NotFound (VOLUME_NOT_FOUND) otherwise. */
  async get(name: string): Promise<VolumeInfo> {
    return infoOf((await this.connection.unary<GetVolumeRequest, GetVolumeResponse>(this.connection.sandboxes, "getVolume", GetVolumeRequest.fromPartial({ name }))).volume);
  }

  /** list gives the caller's volumes, ordered by name. */
  async list(): Promise<VolumeInfo[]> {
    return (await this.connection.unary<ListVolumesRequest, ListVolumesResponse>(this.connection.sandboxes, "listVolumes", ListVolumesRequest.fromPartial({}))).volumes.map(infoOf);
  }

  /** delete removes the volume and its files; a BerthError of reason VOLUME_IN_USE while a sandbox mounts it. */
  async delete(name: string): Promise<void> {
    await this.connection.unary(this.connection.sandboxes, "deleteVolume", DeleteVolumeRequest.fromPartial({ name }));
  }

  /** close closes the connection when this Volumes made it. */
  close(): void {
    if (this.owns) this.connection.close();
  }
}
