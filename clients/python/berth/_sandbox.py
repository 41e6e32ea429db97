"""berth.Sandbox: one sandbox and its commands, files and ports."""

from __future__ import annotations

import os
from typing import Dict, Iterable, List, Optional, Tuple, Union

from berth._commands import Commands, user_arg
from berth._sessions import Sessions
from berth._contexts import CodeContexts
from berth._connection import Connection
from berth._errors import SandboxNotFound, duration, int_arg, invalid_argument, seconds_arg
from berth._files import Files
from berth._ports import Ports
from berth._volumes import VolumeMountSpec, volume_mounts
from berth.v1 import sandbox_pb2

#: The image Sandbox.create uses when none is given and $BERTH_IMAGE is unset.
DEFAULT_IMAGE = "berth.dev/base:latest"

class Sandbox:
    """A sandbox on berthd. Make one with Sandbox.create(...) or attach to
    an existing one with Sandbox.connect(id); use it as a context manager:

        with berth.Sandbox.create(user="1000:1000") as sb:
            print(sb.commands.run("echo hi").stdout)

    Leaving the with block of a created sandbox deletes it (kill());
    of a connected one only closes the connection (close()).
    sb.commands, sb.files and sb.ports act on it; sb.id names it."""

    def __init__(self, conn: Connection, info: sandbox_pb2.Sandbox, owns_connection: bool, created: bool):
        self._conn = conn
        self._owns = owns_connection
        self._created = created
        self.info = info
        self.id: str = info.id
        self.commands = Commands(conn, self.id)
        self.sessions = Sessions(conn, self.id, self.commands)
        self.contexts = CodeContexts(conn, self.id)
        self.files = Files(conn, self.id)
        self.ports = Ports(conn, self.id)

    @staticmethod
    def _connection(connection: Optional[Connection], addr: Optional[str], token: Optional[str], conn_kw) -> Tuple[Connection, bool]:
        if connection is not None:
            return connection, False
        return Connection(addr, token=token, **conn_kw), True

    @classmethod
    def create(cls, image: Optional[str] = None, *, user: Union[None, int, str, Tuple[int, int]] = None,
               env: Optional[Dict[str, str]] = None, workdir: Optional[str] = None, labels: Optional[Dict[str, str]] = None,
               sandbox_id: Optional[str] = None, memory_bytes: Optional[int] = None, cpu_millis: Optional[int] = None,
               disk_bytes: Optional[int] = None, idle_timeout: Optional[float] = None, max_lifetime: Optional[float] = None,
               runtime: Optional[str] = None, network: Optional[str] = None, from_snapshot: Optional[str] = None,
               volumes: Optional[Iterable[VolumeMountSpec]] = None, idle_action: Optional[str] = None,
               timeout: Optional[float] = 120.0, connection: Optional[Connection] = None, addr: Optional[str] = None,
               token: Optional[str] = None, **conn_kw) -> "Sandbox":
        """Creates a sandbox and returns it once it runs.

        image: a reference in berthd's image store (default $BERTH_IMAGE,
        else DEFAULT_IMAGE). user: the workload user processes run as and
        files are created as, "uid", "uid:gid", an int or a (uid, gid)
        tuple, or a name "dev" / "dev:staff" of the image's /etc/passwd
        and /etc/group (an unknown one is InvalidArgument);
        default root without capabilities. env, workdir (default
        /workspace), labels. memory_bytes, cpu_millis, disk_bytes: limits
        (unset: the server's defaults). idle_timeout and max_lifetime in
        seconds. runtime: "runc" or "gvisor"; network: "none" or "egress".
        volumes: the caller's volumes (berth.Volumes) to mount, each
        "NAME:PATH[:ro]", (name, path[, read_only]) or a VolumeMount.
        idle_action: what the idle timeout does, "delete" (the server's
        default), "pause" or "hibernate" (docs/state.md). from_snapshot:
        a snapshot's id (Sandbox.snapshot, berth.Snapshots) to start from.
        sandbox_id names it (else berthd mints one); a create retried by the
        retry policy after a failure that ran nothing is safe.

        The connection: connection=Connection(...) to share one, else one is
        made from addr, token and conn_kw (see Connection; defaults from
        $BERTH_ADDR, $BERTH_TOKEN, $BERTH_TLS_*). Raises FleetBusy (after
        the retries), ImageNotFound, InvalidArgument, ..."""
        req = sandbox_pb2.CreateSandboxRequest(sandbox_id=sandbox_id or "", image=image or os.environ.get("BERTH_IMAGE") or DEFAULT_IMAGE,
                                               labels=labels or {}, env=env or {}, user=user_arg(user), workdir=workdir or "",
                                               runtime=runtime or "", from_snapshot=from_snapshot or "",
                                               volumes=volume_mounts(volumes))
        if memory_bytes is not None:
            req.resources.memory_bytes = int_arg("memory_bytes", memory_bytes)
        if cpu_millis is not None:
            req.resources.cpu_millis = int_arg("cpu_millis", cpu_millis)
        if disk_bytes is not None:
            req.resources.disk_bytes = int_arg("disk_bytes", disk_bytes)
        if idle_timeout is not None:
            req.idle_timeout.CopyFrom(duration(idle_timeout, "idle_timeout"))
        if max_lifetime is not None:
            req.max_lifetime.CopyFrom(duration(max_lifetime, "max_lifetime"))
        seconds_arg("timeout", timeout)
        if network is not None:
            if network.lower() not in ("none", "egress"):
                raise ValueError(f"Sandbox.create: network {network!r} is neither 'none' nor 'egress'")
            req.network.mode = sandbox_pb2.NetworkMode.Value("NETWORK_MODE_" + network.upper())
        if idle_action is not None:
            req.idle_action = _enum_arg(sandbox_pb2.IdleAction, "IDLE_ACTION_", "idle_action", idle_action, ("delete", "pause", "hibernate"))
        conn, owns = cls._connection(connection, addr, token, conn_kw)
        try:
            info = conn.unary(conn.sandboxes.CreateSandbox, req, timeout).sandbox
        except BaseException:
            if owns:
                conn.close()
            raise
        return cls(conn, info, owns, created=True)

    @classmethod
    def connect(cls, sandbox_id: str, *, connection: Optional[Connection] = None, addr: Optional[str] = None,
                token: Optional[str] = None, **conn_kw) -> "Sandbox":
        """Returns the existing sandbox sandbox_id (SandboxNotFound when
        there is none, or it is another principal's)."""
        conn, owns = cls._connection(connection, addr, token, conn_kw)
        try:
            info = conn.unary(conn.sandboxes.GetSandbox, sandbox_pb2.GetSandboxRequest(sandbox_id=sandbox_id)).sandbox
        except BaseException:
            if owns:
                conn.close()
            raise
        return cls(conn, info, owns, created=False)

    def refresh(self) -> sandbox_pb2.Sandbox:
        """Reads the sandbox's record again (state, runtime, usage) into info."""
        self.info = self._conn.unary(self._conn.sandboxes.GetSandbox, sandbox_pb2.GetSandboxRequest(sandbox_id=self.id)).sandbox
        return self.info

    def pause(self) -> None:
        """Freezes every process of the sandbox (runc: its cgroup freezer;
        gVisor: runsc pause): it uses no CPU and keeps its memory, files,
        connections and attached commands; info.state becomes
        SANDBOX_STATE_PAUSED. Any later call that needs the sandbox
        (commands, files, ports) resumes it first. Pausing a paused sandbox
        changes nothing. Raises SandboxNotFound, BerthError with reason
        SANDBOX_NOT_RUNNING."""
        self.info = self._conn.unary(self._conn.sandboxes.PauseSandbox, sandbox_pb2.PauseSandboxRequest(sandbox_id=self.id)).sandbox

    def resume(self) -> None:
        """Thaws a paused sandbox, or wakes a hibernated one; its processes
        go on where they stopped. Resuming a running sandbox changes
        nothing. Errors as pause()."""
        self.info = self._conn.unary(self._conn.sandboxes.ResumeSandbox, sandbox_pb2.ResumeSandboxRequest(sandbox_id=self.id)).sandbox

    def hibernate(self) -> str:
        """Releases the sandbox's memory and CPU and keeps its files; the
        next call that needs it wakes it. Returns what was kept:
        "memory_kept" (gVisor: memory and processes checkpointed to disk
        and restored at the wake, command ids stay valid) or
        "processes_ended" (runc: every process ended; the wake starts a
        fresh agent, so commands of before are StaleHandle). info.state
        becomes SANDBOX_STATE_HIBERNATED. Errors as pause()."""
        r = self._conn.unary(self._conn.sandboxes.HibernateSandbox, sandbox_pb2.HibernateSandboxRequest(sandbox_id=self.id))
        self.info = r.sandbox
        return sandbox_pb2.Hibernation.Name(r.hibernation).removeprefix("HIBERNATION_").lower()

    def snapshot(self, *, labels: Optional[Dict[str, str]] = None) -> sandbox_pb2.Snapshot:
        """Stores a point-in-time, crash-consistent copy of the sandbox's
        root file system (paused, synced, btrfs snapshot, resumed: every
        write the workload saw complete before the call is in it) and
        returns it (id, size_bytes, ...); memory is not kept. It belongs to
        the caller and outlives the sandbox until berth.Snapshots.delete.
        Not retried: a lost reply is found by berth.Snapshots.list. Raises
        SandboxNotFound, BerthError with reason SNAPSHOT_UNSUPPORTED (not
        the btrfs snapshotter) or SNAPSHOT_LIMIT."""
        req = sandbox_pb2.CreateSnapshotRequest(sandbox_id=self.id, labels=labels or {})
        return self._conn.call(self._conn.sandboxes.CreateSnapshot, req).snapshot

    def fork(self, count: int = 1, *, memory: bool = False, request_id: Optional[str] = None,
             labels: Optional[Dict[str, str]] = None, timeout: Optional[float] = 300.0) -> List["Sandbox"]:
        """Makes count (1-16) new sandboxes from this one's files as of one
        point in time, each with its own id, network address and quota and
        this one's create spec; returns them in order, sharing this
        Sandbox's connection (leaving their with block deletes them). With
        memory (gVisor only) every process of this sandbox goes on in each
        child where a checkpoint stopped it. All or nothing. request_id
        makes the call idempotent, and only then is it retried: the same
        request_id returns the same children. timeout in seconds. Raises
        InvalidArgument (count, request_id, labels), SandboxNotFound,
        BerthError with reason SNAPSHOT_UNSUPPORTED (also memory of a runc
        sandbox) or SANDBOX_EXISTS (request_id of another fork), and
        create's errors for a child (FleetBusy, ...)."""
        req = sandbox_pb2.ForkSandboxRequest(sandbox_id=self.id, count=int_arg("count", count, 16, 1), request_id=request_id or "",
                                             labels=labels or {}, memory=memory)
        seconds_arg("timeout", timeout)
        if request_id:
            resp = self._conn.unary(self._conn.sandboxes.ForkSandbox, req, timeout)
        else:
            resp = self._conn.call(self._conn.sandboxes.ForkSandbox, req, timeout)
        return [Sandbox(self._conn, info, False, created=True) for info in resp.sandboxes]

    def kill(self) -> None:
        """Deletes the sandbox (its processes and files); idempotent towards
        a sandbox already gone."""
        try:
            self._conn.unary(self._conn.sandboxes.DeleteSandbox, sandbox_pb2.DeleteSandboxRequest(sandbox_id=self.id))
        except SandboxNotFound:
            pass

    def close(self) -> None:
        """Closes the connection when this Sandbox made it; the sandbox
        runs on (kill() deletes it)."""
        if self._owns:
            self._conn.close()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self._created:
                self.kill()
        finally:
            self.close()

    def __repr__(self) -> str:
        return f"<berth.Sandbox {self.id}>"


def _enum_arg(enum, prefix: str, field: str, value: str, allowed: Tuple[str, ...]) -> int:
    """The enum value prefix+VALUE of one of allowed (lowercase), else
    InvalidArgument naming field."""
    if not isinstance(value, str) or value.lower() not in allowed:
        raise invalid_argument(field, f"{value!r} is none of {', '.join(allowed)}")
    return enum.Value(prefix + value.upper())
