"""sandbox.files: the FileService of one sandbox, and directories moved as
tar streams made and read by Python's tarfile."""

from __future__ import annotations

import dataclasses
import datetime
import io
import os
import queue
import stat as statmod
import tarfile
import threading
from typing import BinaryIO, Iterable, Iterator, List, Optional, Union

import grpc

from berth._connection import Connection
from berth._errors import UINT32_MAX, BerthError, FileNotFound, ProtocolError, from_rpc_error, int_arg, mode_arg, timestamp
from berth._watch import FileWatch, open_watch
from berth.v1 import file_pb2

#: The largest chunk sent in one WriteFile or Upload message (the proto's
#: bound is 2 MiB).
CHUNK = 1 << 20

_TYPES = {
    file_pb2.FILE_TYPE_REGULAR: "file", file_pb2.FILE_TYPE_DIRECTORY: "dir", file_pb2.FILE_TYPE_SYMLINK: "symlink",
    file_pb2.FILE_TYPE_FIFO: "fifo", file_pb2.FILE_TYPE_SOCKET: "socket",
    file_pb2.FILE_TYPE_CHAR_DEVICE: "char_device", file_pb2.FILE_TYPE_BLOCK_DEVICE: "block_device",
}


@dataclasses.dataclass
class FileInfo:
    """One file as lstat(2) sees it. type is "file", "dir", "symlink",
    "fifo", "socket", "char_device" or "block_device"; mode the permission
    bits (st_mode & 0o7777); size in bytes; name and path are str (names
    that are not UTF-8 show \\xNN escapes: raw_path has the bytes)."""

    name: str
    path: str
    type: str
    mode: int
    size: int
    uid: int
    gid: int
    modified: Optional[datetime.datetime]
    symlink_target: str
    raw_path: bytes

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"

    @classmethod
    def _of(cls, i: file_pb2.FileInfo) -> "FileInfo":
        return cls(name=i.display_name, path=i.display_path, type=_TYPES.get(i.type, "unknown"), mode=i.mode,
                   size=i.size_bytes, uid=i.uid, gid=i.gid, modified=timestamp(i.modified_at),
                   symlink_target=i.display_symlink_target, raw_path=i.path)


Data = Union[bytes, str, BinaryIO, Iterable[bytes]]


def _chunks(data: Data) -> Iterator[bytes]:
    if isinstance(data, str):
        data = data.encode()
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = bytes(data)
        for i in range(0, len(data), CHUNK):
            yield data[i:i + CHUNK]
        return
    if hasattr(data, "read"):
        while True:
            chunk = data.read(CHUNK)  # type: ignore[union-attr]
            if not chunk:
                return
            yield chunk
        return
    for chunk in data:  # type: ignore[union-attr]
        for i in range(0, len(chunk), CHUNK):
            yield chunk[i:i + CHUNK]


class _QueueWriter(io.RawIOBase):
    """A write-only file whose writes go, in order, to a bounded queue: the
    tar stream of upload_dir, made in one thread and sent in another."""

    def __init__(self, q: "queue.Queue[Optional[bytes]]"):
        super().__init__()
        self._q = q
        self._buf = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # type: ignore[override]
        self._buf += b
        while len(self._buf) >= CHUNK:
            self._q.put(bytes(self._buf[:CHUNK]))
            del self._buf[:CHUNK]
        return len(b)

    def flush_all(self) -> None:
        if self._buf:
            self._q.put(bytes(self._buf))
            self._buf.clear()


class _ChunkReader(io.RawIOBase):
    """A read-only file over an iterator of bytes: the tar stream of
    download_dir, read by tarfile as it arrives."""

    def __init__(self, chunks: Iterator[bytes]):
        super().__init__()
        self._chunks = chunks
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        while not self._buf:
            try:
                self._buf = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


class Files:
    """The files of one sandbox (sandbox.files). Paths are absolute paths in
    the sandbox; operations run as the sandbox's workload user. Errors:
    FileNotFound, FileExists, FilePermissionDenied and the other BerthErrors
    of docs/errors.md "File errors"."""

    def __init__(self, conn: Connection, sandbox_id: str):
        self._conn = conn
        self._id = sandbox_id

    def read_stream(self, path: str, *, offset: int = 0, limit: int = 0) -> Iterator[bytes]:
        """Yields the file's bytes in chunks of at most 1 MiB as they arrive
        (limit 0: to the end). The stream ends with FILE_CHANGED rather than
        yield a file that changed while read."""
        req = file_pb2.ReadFileRequest(sandbox_id=self._id, path=path, offset_bytes=int_arg("offset", offset),
                                       limit_bytes=int_arg("limit", limit))
        call = self._conn.files.ReadFile(req, metadata=self._conn.metadata)
        try:
            want, got = None, 0
            for m in call:
                if m.WhichOneof("part") == "header":
                    want = m.header.length_bytes
                else:
                    got += len(m.chunk)
                    yield m.chunk
            if want is None or got != want:
                raise ProtocolError(f"ReadFile {path}: {got} bytes arrived, the header said {want}")
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        finally:
            call.cancel()

    def watch(self, path: str, *, recursive: bool = False, include: Optional[List[str]] = None,
              watch_id: Optional[str] = None, since_seq: int = 0, buffer_events: int = 0) -> FileWatch:
        """Opens (or, with watch_id of an existing watch, resumes after
        since_seq) a watch of the directory path: a FileWatch to iterate
        for create/write/remove/rename events and overflow notes
        (docs/watch.md). include: shell patterns on file names. Raises
        FileNotFound, InvalidArgument, BerthError NOT_A_DIRECTORY."""
        return open_watch(self._conn, self._id, path, recursive=recursive, include=include, watch_id=watch_id,
                          since_seq=since_seq, buffer_events=buffer_events)

    def read(self, path: str, *, offset: int = 0, limit: int = 0) -> bytes:
        """The file's bytes (read_stream for large files)."""
        return b"".join(self.read_stream(path, offset=offset, limit=limit))

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """The file decoded as text."""
        return self.read(path).decode(encoding)

    def write(self, path: str, data: Data, *, mode: Optional[int] = None, make_parents: bool = True,
              append: bool = False) -> FileInfo:
        """Writes data (bytes, str as UTF-8, a binary file object read in
        1 MiB chunks, or an iterable of bytes: large files stream) to path
        and returns the stored file's info. The file is replaced atomically
        (readers see the old or the new one) unless append. mode: permission
        bits (default: the replaced file's, or 0o644). make_parents creates
        missing directories."""
        header = file_pb2.WriteFileHeader(sandbox_id=self._id, path=path, create_parents=make_parents,
                                          write_mode=file_pb2.WRITE_MODE_APPEND if append else file_pb2.WRITE_MODE_REPLACE)
        if mode is not None:
            header.mode = mode_arg("mode", mode)
        if isinstance(data, (bytes, str)):
            header.size_bytes = len(data.encode() if isinstance(data, str) else data)

        def requests():
            yield file_pb2.WriteFileRequest(header=header)
            for chunk in _chunks(data):
                yield file_pb2.WriteFileRequest(chunk=chunk)
        try:
            return FileInfo._of(self._conn.files.WriteFile(requests(), metadata=self._conn.metadata).info)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def stat(self, path: str) -> FileInfo:
        """lstat(2) of path."""
        return FileInfo._of(self._conn.call(self._conn.files.Stat, file_pb2.StatRequest(sandbox_id=self._id, path=path)).info)

    def exists(self, path: str) -> bool:
        """Whether path exists (a dangling symlink does)."""
        try:
            self.stat(path)
            return True
        except FileNotFound:
            return False

    def list(self, path: str, *, depth: int = 1) -> List[FileInfo]:
        """The entries of directory path (depth levels deep), in order.

        berthd lists a subdirectory it cannot read (PERMISSION_DENIED, ...)
        and goes on, reporting it beside the entries; then, as the Go
        client's Files.List, the whole listing is read and the first such
        directory raises a BerthError of its reason (metadata["path"] names
        it) whose entries attribute holds every entry listed. A stream that
        fails midway raises its error with the entries received before it
        in entries: nothing received is discarded."""
        req = file_pb2.ListDirRequest(sandbox_id=self._id, path=path, max_depth=int_arg("depth", depth, UINT32_MAX))
        out: List[FileInfo] = []
        first: Optional[file_pb2.ListDirError] = None
        try:
            for m in self._conn.files.ListDir(req, metadata=self._conn.metadata):
                out += [FileInfo._of(i) for i in m.entries]
                if first is None and m.errors:
                    first = m.errors[0]
        except grpc.RpcError as e:
            err = from_rpc_error(e)
            err.entries = out
            raise err from None
        if first is not None:
            err = BerthError(grpc.StatusCode.FAILED_PRECONDITION, f"list {first.display_path}: {first.message}",
                             reason=first.reason, metadata={"path": first.display_path})
            err.entries = out
            raise err
        return out

    def make_dir(self, path: str, *, mode: Optional[int] = None, parents: bool = True) -> FileInfo:
        """Creates directory path (parents: also its parents, and an existing
        directory is fine, as mkdir -p). mode default 0o755."""
        req = file_pb2.MakeDirRequest(sandbox_id=self._id, path=path, parents=parents)
        if mode is not None:
            req.mode = mode_arg("mode", mode)
        return FileInfo._of(self._conn.call(self._conn.files.MakeDir, req).info)

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Removes path (recursive: a directory with its contents)."""
        self._conn.call(self._conn.files.Remove, file_pb2.RemoveRequest(sandbox_id=self._id, path=path, recursive=recursive))

    def rename(self, src: str, dst: str, *, overwrite: bool = False) -> None:
        """Renames src to dst (overwrite: replace an existing dst)."""
        self._conn.call(self._conn.files.Rename, file_pb2.RenameRequest(sandbox_id=self._id, from_path=src, to_path=dst,
                                                                        overwrite=overwrite))

    def upload_dir(self, local_dir: str, remote_dir: str, *, keep_owners: bool = False) -> file_pb2.UploadResponse:
        """Copies the contents of local_dir into remote_dir (created when
        missing) as one tar stream made with tarfile: symlinks stay symlinks
        (targets verbatim), permission bits and mtimes are kept; files belong
        to the sandbox's workload user unless keep_owners. Atomic: on error
        remote_dir is left as it was. Returns berthd's counts."""
        if not os.path.isdir(local_dir):
            raise NotADirectoryError(f"upload_dir: {local_dir} is not a directory")
        q: "queue.Queue[Optional[bytes]]" = queue.Queue(maxsize=8)
        failure: List[BaseException] = []
        stop = threading.Event()

        def make_tar() -> None:
            w = _QueueWriter(q)
            try:
                with tarfile.open(fileobj=w, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
                    for name in sorted(os.listdir(local_dir)):
                        if stop.is_set():
                            return
                        tar.add(os.path.join(local_dir, name), arcname=name, recursive=True)
                w.flush_all()
            except BaseException as e:  # reported after the call
                failure.append(e)
            finally:
                q.put(None)

        def requests():
            yield file_pb2.UploadRequest(header=file_pb2.UploadHeader(sandbox_id=self._id, path=remote_dir,
                                                                      compression=file_pb2.COMPRESSION_NONE,
                                                                      keep_owners=keep_owners))
            while True:
                chunk = q.get()
                if chunk is None:
                    if failure:  # end the call without completing the archive
                        raise failure[0]
                    return
                yield file_pb2.UploadRequest(chunk=chunk)

        t = threading.Thread(target=make_tar, name="berth-upload-tar", daemon=True)
        t.start()
        try:
            return self._conn.files.Upload(requests(), metadata=self._conn.metadata)
        except grpc.RpcError as e:
            if failure:
                raise failure[0] from None
            raise from_rpc_error(e) from None
        finally:
            stop.set()
            while t.is_alive():  # unblock a tar writer waiting on a full queue
                try:
                    q.get(timeout=0.1)
                except queue.Empty:
                    pass

    def download_dir(self, remote_dir: str, local_dir: str) -> None:
        """Copies the contents of remote_dir into local_dir (created when
        missing) from one tar stream read with tarfile: symlinks stay
        symlinks (targets verbatim, absolute ones too), permission bits
        (without setuid/setgid) and mtimes are kept, files belong to the
        caller. Entries that would land outside local_dir (absolute names,
        "..", writes through a symlink) and device nodes are refused with
        ValueError: the sandbox is not trusted."""
        os.makedirs(local_dir, exist_ok=True)
        root = os.path.realpath(local_dir)
        call = self._conn.files.Download(file_pb2.DownloadRequest(sandbox_id=self._id, path=remote_dir,
                                                                  compression=file_pb2.COMPRESSION_NONE),
                                         metadata=self._conn.metadata)

        def chunks() -> Iterator[bytes]:
            for m in call:
                if m.WhichOneof("part") == "chunk":
                    yield m.chunk
        dirs = []
        try:
            with tarfile.open(fileobj=io.BufferedReader(_ChunkReader(chunks())), mode="r|") as tar:  # type: ignore[call-overload]
                for m in tar:
                    _check_member(m, root)
                    m.uid, m.gid, m.uname, m.gname = os.geteuid(), os.getegid(), "", ""
                    m.mode &= ~(statmod.S_ISUID | statmod.S_ISGID)
                    if m.isdir():
                        dirs.append((m.name, m.mode, m.mtime))
                        m.mode = 0o700  # writable while its entries are extracted
                    tar.extract(m, root)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        finally:
            call.cancel()
        for name, mode, mtime in reversed(dirs):
            p = os.path.join(root, name)
            os.chmod(p, mode & 0o7777)
            os.utime(p, (mtime, mtime))


def _check_member(m: tarfile.TarInfo, root: str) -> None:
    """Refuses an entry of a downloaded archive that would escape root or
    make a device, as tarfile's "tar" filter (Python 3.12) does."""
    name = m.name
    if os.path.isabs(name) or ".." in name.split("/"):
        raise ValueError(f"download_dir: archive entry {name!r} is outside the directory")
    if m.ischr() or m.isblk():
        raise ValueError(f"download_dir: archive entry {name!r} is a device node")
    # A symlink entry replaces what is at its name; anything else is
    # written through it, so the whole path must stay inside.
    parent, base = os.path.split(os.path.join(root, name.rstrip("/")))
    dest = os.path.join(os.path.realpath(parent), base) if m.issym() else os.path.realpath(os.path.join(root, name))
    if os.path.commonpath([root, dest]) != root:
        raise ValueError(f"download_dir: archive entry {name!r} would be written through a symlink out of the directory")
    if m.islnk():
        target = os.path.realpath(os.path.join(root, m.linkname))
        if os.path.isabs(m.linkname) or os.path.commonpath([root, target]) != root:
            raise ValueError(f"download_dir: hard link {name!r} points outside the directory")
