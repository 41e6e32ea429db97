"""sandbox.commands: commands in a sandbox over the Exec stream."""

from __future__ import annotations

import dataclasses
import io
import queue
import threading
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import grpc

from berth._connection import Connection
from berth._errors import UINT32_MAX, BerthError, ProtocolError, duration, from_rpc_error, int_arg, seconds, seconds_arg
from berth.v1 import exec_pb2

#: The largest stdin chunk sent in one message (the Go client's).
STDIN_CHUNK = 1 << 20

OutputCallback = Callable[[bytes], None]
Stdin = Union[None, bytes, str, io.IOBase, Iterable[bytes]]

@dataclasses.dataclass
class CommandResult:
    """How a command ended. exit_code is the exit status (128+N when killed
    by signal N; None only if berthd reported none); signal the name of the
    signal that killed it ("SIGKILL") or ""; timed_out is True when its
    timeout killed it; oom_killed when the OOM killer did. stdout and
    stderr are the bytes received exactly (empty when capture was off);
    stdout_bytes/stderr_bytes count all the command wrote, also beyond a
    cap or lost to a detached ring (dropped_bytes counts those lost).
    duration is in seconds."""

    exec_id: str
    exit_code: Optional[int]
    signal: str = ""
    timed_out: bool = False
    oom_killed: bool = False
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    dropped_bytes: int = 0
    duration: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether the command exited with status 0."""
        return self.exit_code == 0

    @property
    def text(self) -> str:
        """stdout decoded as UTF-8 (invalid bytes replaced)."""
        return self.stdout.decode("utf-8", "replace")

def user_arg(user: Union[None, int, str, Tuple[int, int]]) -> str:
    """The user of a command, session or sandbox: a name, "uid[:gid]", a
    uid or (uid, gid), whose numbers are ints from 0 to 2**32 - 1 (else
    InvalidArgument naming "user")."""
    if user is None:
        return ""
    if isinstance(user, tuple):
        return ":".join(str(int_arg("user", u, UINT32_MAX)) for u in user)
    if isinstance(user, str):
        return user
    return str(int_arg("user", user, UINT32_MAX))


def process_spec(cmd: Union[str, Sequence[str]], cwd: Optional[str], env: Optional[Dict[str, str]], user: Union[None, int, str],
                 timeout: Optional[float], stdin: bool, shell: str = "sh") -> exec_pb2.ProcessSpec:
    """The ProcessSpec of a command: a str runs under the shell (/bin/sh -c,
    or bash with shell="bash"), a sequence is the exact argv."""
    spec = exec_pb2.ProcessSpec(cwd=cwd or "", env=env or {}, stdin=stdin)
    if isinstance(cmd, str):
        spec.shell_command = cmd
        spec.shell = exec_pb2.SHELL_BASH if shell == "bash" else exec_pb2.SHELL_SH
    else:
        spec.argv.extend(cmd)
    spec.user = user_arg(user)
    if timeout is not None:
        spec.timeout.CopyFrom(duration(timeout))
    return spec

class CommandHandle:
    """A running command: its output is received by a thread of the handle
    and handed to on_stdout/on_stderr (bytes, in order, from that thread;
    a slow callback slows the command, nothing is lost) and kept in stdout
    and stderr when capture is on.

    wait() returns the CommandResult; kill() signals it; send_stdin() and
    close_stdin() feed it; disconnect() leaves it running, to be followed
    again with commands.connect(exec_id, since_seq=last_seq)."""

    def __init__(self, conn: Connection, sandbox_id: str, first: exec_pb2.ExecRequest,
                 on_stdout: Optional[OutputCallback], on_stderr: Optional[OutputCallback], capture: bool,
                 since_seq: int = 0):
        self._conn = conn
        self.sandbox_id = sandbox_id
        self._on_stdout, self._on_stderr, self._capture = on_stdout, on_stderr, capture
        self._out: List[bytes] = []
        self._err: List[bytes] = []
        self._dropped = 0
        self.last_seq = since_seq
        self._requests: "queue.Queue[Optional[exec_pb2.ExecRequest]]" = queue.Queue()
        self._result: Optional[CommandResult] = None
        self._error: Optional[BaseException] = None
        self._done = threading.Event()
        self._requests.put(first)
        self._call = conn.sandboxes.Exec(self._request_iter(), metadata=conn.metadata)
        self._responses = iter(self._call)
        try:
            ev = next(self._responses)
        except grpc.RpcError as e:
            self._close_requests()
            raise from_rpc_error(e) from None
        except StopIteration:
            self._close_requests()
            raise ProtocolError("the exec stream ended before the started event") from None
        if ev.WhichOneof("event") != "started":
            self._call.cancel()
            self._close_requests()
            raise ProtocolError(f"the exec stream's first event is {ev.WhichOneof('event')}, want started")
        self.started = ev.started
        self.exec_id: str = ev.started.exec_id
        self.pid: int = ev.started.pid
        self._thread = threading.Thread(target=self._receive, name=f"berth-exec-{self.exec_id}", daemon=True)
        self._thread.start()

    def _request_iter(self):
        while True:
            r = self._requests.get()
            if r is None:
                return
            yield r

    def _close_requests(self) -> None:
        self._requests.put(None)

    def _receive(self) -> None:
        try:
            for ev in self._responses:
                kind = ev.WhichOneof("event")
                if kind == "output":
                    o = ev.output
                    if o.seq != self.last_seq + 1:
                        raise ProtocolError(f"exec {self.exec_id}: output seq {o.seq} after {self.last_seq} without a dropped event")
                    self.last_seq = o.seq
                    if o.stream == exec_pb2.STREAM_STDERR:
                        if self._capture:
                            self._err.append(o.data)
                        if self._on_stderr:
                            self._on_stderr(o.data)
                    else:
                        if self._capture:
                            self._out.append(o.data)
                        if self._on_stdout:
                            self._on_stdout(o.data)
                elif kind == "dropped":
                    self._dropped += ev.dropped.lost_bytes
                    self.last_seq = max(self.last_seq, ev.dropped.last_seq)
                elif kind == "exited":
                    r = ev.exited.result
                    self._result = CommandResult(
                        exec_id=self.exec_id,
                        exit_code=r.exit_code if r.HasField("exit_code") else None,
                        signal=r.signal, timed_out=r.timed_out, oom_killed=r.oom_killed,
                        stdout=b"".join(self._out), stderr=b"".join(self._err),
                        stdout_bytes=r.stdout_bytes, stderr_bytes=r.stderr_bytes,
                        stdout_truncated=r.stdout_truncated, stderr_truncated=r.stderr_truncated,
                        dropped_bytes=self._dropped, duration=seconds(r.duration))
                    self._out, self._err = [], []
            if self._result is None:
                raise ProtocolError(f"exec {self.exec_id}: the stream ended without an exited event")
        except grpc.RpcError as e:
            self._error = from_rpc_error(e)
        except BaseException as e:  # a callback's error, or ProtocolError
            self._error = e
            self._call.cancel()
        finally:
            self._close_requests()
            self._done.set()

    def wait(self, timeout: Optional[float] = None) -> CommandResult:
        """Waits for the command to end and returns its result; raises the
        BerthError that ended the stream (e.g. RuntimeReplaced), a callback's
        exception, or TimeoutError when timeout seconds pass first (the
        command runs on)."""
        if not self._done.wait(seconds_arg("timeout", timeout)):
            raise TimeoutError(f"exec {self.exec_id} still runs after {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    @property
    def done(self) -> bool:
        """Whether the stream has ended (wait() then returns at once)."""
        return self._done.is_set()

    @property
    def stdout(self) -> bytes:
        """The stdout received so far (with capture)."""
        return self._result.stdout if self._result else b"".join(list(self._out))

    @property
    def stderr(self) -> bytes:
        """The stderr received so far (with capture)."""
        return self._result.stderr if self._result else b"".join(list(self._err))

    def send_stdin(self, data: Union[bytes, str]) -> None:
        """Sends data to the command's stdin (started with stdin=True or
        given stdin=...), in messages of at most 1 MiB."""
        if isinstance(data, str):
            data = data.encode()
        if self._done.is_set():
            raise BerthError(grpc.StatusCode.FAILED_PRECONDITION, f"exec {self.exec_id}: the stream has ended", reason="")
        for i in range(0, len(data), STDIN_CHUNK):
            self._requests.put(exec_pb2.ExecRequest(stdin=exec_pb2.ExecStdin(data=data[i:i + STDIN_CHUNK])))

    def close_stdin(self) -> None:
        """Closes the command's stdin: it reads end of file."""
        if not self._done.is_set():
            self._requests.put(exec_pb2.ExecRequest(close_stdin=exec_pb2.ExecCloseStdin()))

    def kill(self, signal: str = "KILL") -> bool:
        """Sends signal ("KILL", "TERM", "INT", ...) to the command's process
        group (SignalExec: works with or without this stream). Returns False
        when the command had ended already."""
        resp = self._conn.call(self._conn.sandboxes.SignalExec,
                               exec_pb2.SignalExecRequest(sandbox_id=self.sandbox_id, exec_id=self.exec_id, signal=signal))
        return resp.state == exec_pb2.EXEC_STATE_RUNNING

    def disconnect(self) -> None:
        """Ends this stream; the command runs on in the sandbox."""
        self._call.cancel()
        self._done.wait()

def feed_stdin(handle: CommandHandle, stdin: Stdin) -> None:
    """Sends stdin (bytes, str, a binary file object or an iterable of
    bytes) to handle and closes it, from a thread for files and iterables."""
    if isinstance(stdin, (bytes, str)):
        handle.send_stdin(stdin)
        handle.close_stdin()
        return

    def pump() -> None:
        try:
            if hasattr(stdin, "read"):
                while True:
                    chunk = stdin.read(STDIN_CHUNK)  # type: ignore[union-attr]
                    if not chunk:
                        break
                    handle.send_stdin(chunk)
            else:
                for chunk in stdin:  # type: ignore[union-attr]
                    handle.send_stdin(chunk)
            handle.close_stdin()
        except BerthError:
            pass  # the stream ended; wait() says why
    threading.Thread(target=pump, name=f"berth-stdin-{handle.exec_id}", daemon=True).start()

class Commands:
    """The commands of one sandbox (sandbox.commands)."""

    def __init__(self, conn: Connection, sandbox_id: str):
        self._conn = conn
        self._sandbox_id = sandbox_id

    def _open(self, first: exec_pb2.ExecRequest, on_stdout, on_stderr, capture, since_seq=0) -> CommandHandle:
        # The opening is retried under the policy until berthd says the
        # command runs (only conditions under which nothing ran).
        return self._conn.retry(lambda: CommandHandle(self._conn, self._sandbox_id, first, on_stdout, on_stderr, capture, since_seq))

    def start(self, cmd: Union[str, Sequence[str]], *, cwd: Optional[str] = None, env: Optional[Dict[str, str]] = None,
              user: Union[None, int, str] = None, timeout: Optional[float] = None, stdin: Union[Stdin, bool] = None,
              on_stdout: Optional[OutputCallback] = None, on_stderr: Optional[OutputCallback] = None,
              capture: bool = True, exec_id: Optional[str] = None, shell: str = "sh") -> CommandHandle:
        """Starts cmd as a background command and returns its handle once it
        runs. The command lives on its own (berthd retains its output):
        it outlives this stream and this process, and runs until it exits,
        is killed, or timeout seconds pass (then SIGTERM, SIGKILL after the
        server's grace: result.timed_out). stdin=True leaves stdin open for
        send_stdin(); bytes, str, a file or an iterable are sent and
        closed. exec_id names it (else berthd mints one). Other arguments as
        for run()."""
        spec = process_spec(cmd, cwd, env, user, timeout, stdin is not None and stdin is not False, shell)
        first = exec_pb2.ExecRequest(start=exec_pb2.ExecStart(sandbox_id=self._sandbox_id, exec_id=exec_id or "",
                                                             process=spec, background=True))
        started = self._conn.retry(lambda: self._start_background(first))
        h = self.connect(started.exec_id, on_stdout=on_stdout, on_stderr=on_stderr, capture=capture)
        if stdin is not None and stdin is not True and stdin is not False:
            feed_stdin(h, stdin)
        return h

    def _start_background(self, first: exec_pb2.ExecRequest) -> exec_pb2.ExecStarted:
        try:
            for ev in self._conn.sandboxes.Exec(iter([first]), metadata=self._conn.metadata):
                if ev.WhichOneof("event") == "started":
                    return ev.started
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        raise ProtocolError("the background exec stream ended before the started event")

    def run(self, cmd: Union[str, Sequence[str]], *, cwd: Optional[str] = None, env: Optional[Dict[str, str]] = None,
            user: Union[None, int, str] = None, timeout: Optional[float] = None, stdin: Stdin = None,
            on_stdout: Optional[OutputCallback] = None, on_stderr: Optional[OutputCallback] = None,
            background: bool = False, capture: bool = True, exec_id: Optional[str] = None,
            shell: str = "sh"):
        """Runs cmd and returns its CommandResult when it ends (a non-zero
        exit is a result, not an exception).

        cmd: a str runs as `sh -c cmd` (shell="bash": bash), a list is the
        exact argv. cwd: an absolute directory (default the sandbox's
        workdir). env: added to the sandbox's environment. user: run as
        another user, a name from the sandbox's /etc/passwd, "uid" or
        "uid:gid". timeout: seconds the command may run (1 s to 24 h; the
        server's bounds, else InvalidArgument); on expiry berthd sends its
        process group SIGTERM, then SIGKILL after its grace, and the result
        says timed_out. Default: the server's (30 min). stdin: bytes, str,
        a binary file or an iterable of bytes, sent then closed; None: the
        command reads /dev/null. on_stdout/on_stderr: called with each chunk
        of bytes as it arrives, in order, from a receiving thread.
        capture=False keeps no output in the result (for huge outputs).
        background=True returns a CommandHandle at once (see start()).

        If this call is interrupted (KeyboardInterrupt, a callback raising)
        the command is killed before the exception propagates.
        Raises BerthError subclasses: InvalidArgument, SandboxNotFound,
        FleetBusy (after the retries), RuntimeReplaced, ..."""
        if background:
            return self.start(cmd, cwd=cwd, env=env, user=user, timeout=timeout, stdin=stdin, on_stdout=on_stdout,
                              on_stderr=on_stderr, capture=capture, exec_id=exec_id, shell=shell)
        spec = process_spec(cmd, cwd, env, user, timeout, stdin is not None, shell)
        first = exec_pb2.ExecRequest(start=exec_pb2.ExecStart(sandbox_id=self._sandbox_id, exec_id=exec_id or "", process=spec))
        h = self._open(first, on_stdout, on_stderr, capture)
        try:
            if stdin is not None:
                feed_stdin(h, stdin)
            return h.wait()
        except BaseException:
            if not h.done:
                try:
                    h.kill("KILL")
                except BerthError:
                    pass
                h.disconnect()
            raise

    def connect(self, exec_id: str, *, since_seq: int = 0, on_stdout: Optional[OutputCallback] = None,
                on_stderr: Optional[OutputCallback] = None, capture: bool = True) -> CommandHandle:
        """Follows the command exec_id again (its own or another process's):
        berthd replays the retained output after since_seq (0: all), then
        follows live. Raises ExecNotFound, StaleHandle (an exec of an
        earlier runtime of the sandbox)."""
        int_arg("since_seq", since_seq)
        first = exec_pb2.ExecRequest(attach=exec_pb2.ExecAttach(sandbox_id=self._sandbox_id, exec_id=exec_id, since_seq=since_seq))
        return self._open(first, on_stdout, on_stderr, capture, since_seq)

    def list(self) -> List[exec_pb2.ExecInfo]:
        """The sandbox's commands that run or ended recently (ListExecs)."""
        return list(self._conn.call(self._conn.sandboxes.ListExecs, exec_pb2.ListExecsRequest(sandbox_id=self._sandbox_id)).execs)

    def kill(self, exec_id: str, signal: str = "KILL") -> bool:
        """Signals the command exec_id; False when it had ended already."""
        resp = self._conn.call(self._conn.sandboxes.SignalExec,
                               exec_pb2.SignalExecRequest(sandbox_id=self._sandbox_id, exec_id=exec_id, signal=signal))
        return resp.state == exec_pb2.EXEC_STATE_RUNNING

