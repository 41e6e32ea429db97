"""sandbox.files.watch: a stream of file events under a directory
(docs/watch.md), the Go client's FileWatch."""

from __future__ import annotations

from typing import Iterator, List, Optional, Union

import grpc

from berth._connection import Connection
from berth._errors import UINT32_MAX, ProtocolError, from_rpc_error, int_arg
from berth.v1 import watch_pb2

# What a FileWatch yields: a change, or a note that events were lost.
WatchEvent = Union[watch_pb2.FileEvent, watch_pb2.FileWatchOverflow]


class FileWatch:
    """An open WatchFiles stream. Iterate it for FileEvent (seq, kind, path,
    old_path, is_dir) and FileWatchOverflow (reason KERNEL, WATCHES or
    RING: events were lost, rescan) in seq order. watch_id names the
    watch and last_seq is the seq of the latest event yielded (or of the
    watch when the stream opened): files.watch(path, watch_id=w.watch_id,
    since_seq=w.last_seq) resumes after a broken stream, each later event
    exactly once. close() ends the stream; the watch lives on (10 minutes
    without a stream)."""

    def __init__(self, call):
        self._call = call
        try:
            first = next(call)
        except grpc.RpcError as e:
            call.cancel()
            raise from_rpc_error(e) from None
        except StopIteration:
            raise ProtocolError("the WatchFiles stream ended before its started message") from None
        if first.WhichOneof("event") != "started":
            call.cancel()
            raise ProtocolError(f"WatchFiles sent {first.WhichOneof('event')} before started")
        self.watch_id: str = first.started.watch_id
        self.path: str = first.started.path
        self.last_seq: int = first.started.last_seq

    def __iter__(self) -> Iterator[WatchEvent]:
        try:
            for m in self._call:
                kind = m.WhichOneof("event")
                if kind == "file":
                    self.last_seq = m.file.seq
                    yield m.file
                elif kind == "overflow":
                    if m.overflow.seq:
                        self.last_seq = m.overflow.seq
                    yield m.overflow
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.CANCELLED and self._closed():
                return
            raise from_rpc_error(e) from None

    def next_events(self, n: int) -> List[WatchEvent]:
        """The next n events (fewer only if the stream ends)."""
        out: List[WatchEvent] = []
        it = iter(self)
        for ev in it:
            out.append(ev)
            if len(out) == n:
                break
        return out

    def _closed(self) -> bool:
        return not self._call.is_active()

    def close(self) -> None:
        """Ends the stream; the watch lives on, to be resumed."""
        self._call.cancel()

    def __enter__(self) -> "FileWatch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_watch(conn: Connection, sandbox_id: str, path: str, *, recursive: bool, include: Optional[List[str]],
               watch_id: Optional[str], since_seq: int, buffer_events: int) -> FileWatch:
    int_arg("since_seq", since_seq)
    int_arg("buffer_events", buffer_events, UINT32_MAX)
    req = watch_pb2.WatchFilesRequest(sandbox_id=sandbox_id, path=path, recursive=recursive, include=include or [],
                                      watch_id=watch_id or "", since_seq=since_seq, buffer_events=buffer_events)
    return FileWatch(conn.sandboxes.WatchFiles(req, metadata=conn.metadata))
