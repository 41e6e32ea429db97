"""berth.Volumes: named volumes that sandboxes mount (docs/volumes.md)."""

from __future__ import annotations

from typing import Iterable, List, Optional, Tuple, Union

from berth._connection import Connection
from berth._errors import int_arg
from berth.v1 import volume_pb2

# A volume mount for Sandbox.create(volumes=...): a VolumeMount, a
# (name, path) or (name, path, read_only) tuple, or "NAME:PATH[:ro]".
VolumeMountSpec = Union[volume_pb2.VolumeMount, Tuple[str, str], Tuple[str, str, bool], str]


def volume_mounts(specs: Optional[Iterable[VolumeMountSpec]]) -> List[volume_pb2.VolumeMount]:
    """The VolumeMounts of Sandbox.create's volumes argument; berthd checks
    names and paths (InvalidArgument naming volumes[N].path)."""
    out = []
    for s in specs or ():
        if isinstance(s, volume_pb2.VolumeMount):
            out.append(s)
        elif isinstance(s, str):
            parts = s.split(":")
            if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
                raise ValueError(f"volume mount {s!r}: want NAME:PATH or NAME:PATH:ro")
            out.append(volume_pb2.VolumeMount(name=parts[0], path=parts[1], read_only=len(parts) == 3 and parts[2] == "ro"))
        else:
            out.append(volume_pb2.VolumeMount(name=s[0], path=s[1], read_only=bool(s[2]) if len(s) > 2 else False))
    return out


class Volumes:
    """The caller's named volumes on one berthd: btrfs subvolumes with a
    quota of their own, mounted into sandboxes at create
    (Sandbox.create(volumes=[("data", "/data")])) and kept until delete.

        vols = berth.Volumes(conn)
        vols.create("data", quota_bytes=1 << 30)
        with berth.Sandbox.create(volumes=["data:/data"]) as sb: ..."""

    def __init__(self, connection: Optional[Connection] = None, **conn_kw):
        self._owns = connection is None
        self._conn = connection if connection is not None else Connection(**conn_kw)

    def create(self, name: str, *, quota_bytes: int = 0) -> volume_pb2.Volume:
        """Makes an empty volume; quota_bytes 0 takes berthd's default disk
        quota. Raises InvalidArgument (name, quota_bytes), BerthError with
        reason VOLUME_EXISTS, FleetBusy past the caller's disk cap. Not
        retried: a lost reply is found by get."""
        req = volume_pb2.CreateVolumeRequest(name=name, quota_bytes=int_arg("quota_bytes", quota_bytes))
        return self._conn.call(self._conn.sandboxes.CreateVolume, req).volume

    def get(self, name: str) -> volume_pb2.Volume:
        """The volume with its usage (used_bytes, quota_bytes) and the
        sandboxes that mount it. Raises NotFound (VOLUME_NOT_FOUND)."""
        return self._conn.unary(self._conn.sandboxes.GetVolume, volume_pb2.GetVolumeRequest(name=name)).volume

    def list(self) -> List[volume_pb2.Volume]:
        """The caller's volumes, ordered by name."""
        return list(self._conn.unary(self._conn.sandboxes.ListVolumes, volume_pb2.ListVolumesRequest()).volumes)

    def delete(self, name: str) -> None:
        """Removes the volume and its files. Raises NotFound, or BerthError
        with reason VOLUME_IN_USE (metadata sandbox_ids) while a sandbox
        mounts it."""
        self._conn.unary(self._conn.sandboxes.DeleteVolume, volume_pb2.DeleteVolumeRequest(name=name))

    def close(self) -> None:
        """Closes the connection when Volumes made it."""
        if self._owns:
            self._conn.close()

    def __enter__(self) -> "Volumes":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
