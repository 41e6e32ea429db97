"""berth.Sandbox: one sandbox and its commands, files and ports."""

from __future__ import annotations

import os
from typing import Dict, Iterable, Optional, Tuple, Union

from berth._commands import Commands, user_arg
from berth._sessions import Sessions
from berth._contexts import CodeContexts
from berth._connection import Connection
from berth._errors import SandboxNotFound, duration, int_arg, seconds_arg
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
               volumes: Optional[Iterable[VolumeMountSpec]] = None,
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
