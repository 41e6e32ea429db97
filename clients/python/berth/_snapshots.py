"""berth.Snapshots: stored copies of sandboxes' files (docs/state.md)."""

from __future__ import annotations

from typing import List, Optional, Sequence

from berth._connection import Connection
from berth.v1 import image_pb2, sandbox_pb2


class Snapshots:
    """The caller's snapshots on one berthd: point-in-time, crash-consistent
    copies of sandboxes' root file systems (btrfs, copy-on-write), taken
    with Sandbox.snapshot() and kept until delete, whatever happens to the
    sandbox. Sandbox.create(from_snapshot=id) starts a sandbox on one;
    commit makes an image of one.

        snap = sb.snapshot(labels={"step": "3"})
        with berth.Sandbox.create(from_snapshot=snap.id, connection=conn) as again: ...
        berth.Snapshots(conn).delete(snap.id)

    Errors carry reasons: SNAPSHOT_NOT_FOUND (NotFound, also for another
    principal's), SNAPSHOT_IN_USE, SNAPSHOT_LIMIT, SNAPSHOT_UNSUPPORTED
    (docs/errors.md)."""

    def __init__(self, connection: Optional[Connection] = None, **conn_kw):
        self._owns = connection is None
        self._conn = connection if connection is not None else Connection(**conn_kw)

    def list(self) -> List[sandbox_pb2.Snapshot]:
        """The caller's snapshots (an admin's: all), oldest first, each with
        id, sandbox_id, image, created, size_bytes and labels."""
        return list(self._conn.unary(self._conn.sandboxes.ListSnapshots, sandbox_pb2.ListSnapshotsRequest()).snapshots)

    def delete(self, snapshot_id: str) -> None:
        """Removes the snapshot. Raises NotFound (SNAPSHOT_NOT_FOUND), or
        BerthError with reason SNAPSHOT_IN_USE while a sandbox created from
        it exists."""
        self._conn.unary(self._conn.sandboxes.DeleteSnapshot, sandbox_pb2.DeleteSnapshotRequest(snapshot_id=snapshot_id))

    def commit(self, snapshot_id: str, reference: str, *, replace: bool = False, env: Optional[Sequence[str]] = None,
               working_dir: Optional[str] = None, entrypoint: Optional[Sequence[str]] = None,
               cmd: Optional[Sequence[str]] = None) -> image_pb2.Image:
        """Makes image reference of the snapshot, like docker commit: its
        image plus one layer of what the snapshot changed; Sandbox.create
        takes it. env ("KEY=VALUE" each), working_dir, entrypoint and cmd
        change the image's config (unset: the image's). replace (admins
        only) replaces a stored image of that name. Not retried: a lost
        reply is found in the image list. Raises InvalidArgument
        (snapshot_id, reference), NotFound (SNAPSHOT_NOT_FOUND,
        IMAGE_NOT_FOUND), BerthError with reason IMAGE_EXISTS, NO_SPACE,
        SNAPSHOT_LIMIT."""
        changes = sandbox_pb2.ImageConfigChanges(env=list(env or ()), working_dir=working_dir or "",
                                                 entrypoint=list(entrypoint or ()), cmd=list(cmd or ()))
        req = sandbox_pb2.CommitSnapshotRequest(snapshot_id=snapshot_id, reference=reference, replace=replace, changes=changes)
        return self._conn.call(self._conn.sandboxes.CommitSnapshot, req).image

    def close(self) -> None:
        """Closes the connection when Snapshots made it."""
        if self._owns:
            self._conn.close()

    def __enter__(self) -> "Snapshots":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

