"""sandbox.ports: a local TCP listener whose connections are relayed to a
port in the sandbox over PortForward streams (like kubectl port-forward)."""

from __future__ import annotations

import socket
import threading
from typing import List, Optional

import grpc

from berth._connection import Connection
from berth._errors import from_rpc_error, int_arg
from berth.v1 import port_pb2

#: How much is read from a local connection for one PortForward message.
READ_BYTES = 256 << 10


class PortForward:
    """A listener on host:port (address is "host:port") relaying each
    connection to the sandbox's 127.0.0.1:remote_port through its own
    PortForward stream, with gRPC's flow control end to end. A connection
    to a port nothing listens on in the sandbox is closed at once (berthd:
    PORT_CLOSED); errors of the last failed connection are in last_error.
    close() (or leaving a with block) stops listening and closes the
    relayed connections."""

    def __init__(self, conn: Connection, sandbox_id: str, remote_port: int, host: str = "127.0.0.1", local_port: int = 0):
        self._conn = conn
        self._sandbox_id = sandbox_id
        self.remote_port = remote_port
        self._listener = socket.create_server((host, local_port))
        self.host, self.port = self._listener.getsockname()[:2]
        self.address = f"{self.host}:{self.port}"
        self.last_error: Optional[BaseException] = None
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._open: List[socket.socket] = []
        self._calls: List[grpc.RpcContext] = []
        threading.Thread(target=self._accept, name=f"berth-forward-{remote_port}", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                s, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._closed.is_set():
                    s.close()
                    return
                self._open.append(s)
            threading.Thread(target=self._relay, args=(s,), name=f"berth-forward-conn-{self.remote_port}", daemon=True).start()

    def _relay(self, s: socket.socket) -> None:
        def requests():
            yield port_pb2.PortForwardRequest(start=port_pb2.PortForwardStart(sandbox_id=self._sandbox_id, port=self.remote_port))
            while True:  # gRPC reads this generator from a thread of its own
                try:
                    data = s.recv(READ_BYTES)
                except OSError:
                    return
                if not data:
                    return  # the local side closed its writing side: half-close
                yield port_pb2.PortForwardRequest(data=data)

        call = self._conn.sandboxes.PortForward(requests(), metadata=self._conn.metadata)
        with self._lock:
            self._calls.append(call)
        try:
            for m in call:
                kind = m.WhichOneof("event")
                if kind == "data":
                    s.sendall(m.data)
                elif kind == "eof":
                    s.shutdown(socket.SHUT_WR)
        except grpc.RpcError as e:
            if not self._closed.is_set():
                self.last_error = from_rpc_error(e)
        except OSError as e:
            self.last_error = e
            call.cancel()
        finally:
            try:  # wakes the request thread's recv and sends FIN at once
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
            with self._lock:
                if s in self._open:
                    self._open.remove(s)
                if call in self._calls:
                    self._calls.remove(call)

    def close(self) -> None:
        """Stops listening and ends every relayed connection."""
        self._closed.set()
        self._listener.close()
        with self._lock:
            for c in self._calls:
                c.cancel()
            for s in self._open:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def __enter__(self) -> "PortForward":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Ports:
    """The ports of one sandbox (sandbox.ports)."""

    def __init__(self, conn: Connection, sandbox_id: str):
        self._conn = conn
        self._sandbox_id = sandbox_id

    def forward(self, port: int, *, local_port: int = 0, host: str = "127.0.0.1") -> PortForward:
        """Listens on host:local_port (0: a free port) and relays each
        connection to port inside the sandbox; .address is what to dial."""
        int_arg("port", port, 65535, 1)
        int_arg("local_port", local_port, 65535)
        return PortForward(self._conn, self._sandbox_id, port, host, local_port)
