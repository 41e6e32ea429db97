"""sandbox.sessions: shell sessions (docs/sessions.md)."""

from __future__ import annotations

from typing import Dict, List, Optional, Union

from berth._commands import CommandResult, Commands, OutputCallback, user_arg
from berth._connection import Connection
from berth._errors import BerthError, duration
from berth.v1 import exec_pb2, session_pb2


class Session:
    """A shell whose cwd, environment, variables, functions and background
    jobs persist from one command to the next. info is the SessionInfo of
    its creation; id names it."""

    def __init__(self, conn: Connection, sandbox_id: str, commands: Commands, info: session_pb2.SessionInfo):
        self._conn = conn
        self._sandbox_id = sandbox_id
        self._commands = commands
        self.info = info
        self.id: str = info.session_id

    def run(self, cmd: str, *, timeout: Optional[float] = None, on_stdout: Optional[OutputCallback] = None,
            on_stderr: Optional[OutputCallback] = None, capture: bool = True, exec_id: Optional[str] = None) -> CommandResult:
        """Runs the shell command cmd in the session and returns its own
        CommandResult. timeout: seconds; at its end the command is
        interrupted like Ctrl-C (exit 130, timed_out) and the session runs
        on. One command at a time (else FailedPrecondition SESSION_BUSY)."""
        spec = exec_pb2.ProcessSpec(session_id=self.id, shell_command=cmd)
        if timeout is not None:
            spec.timeout.CopyFrom(duration(timeout))
        first = exec_pb2.ExecRequest(start=exec_pb2.ExecStart(sandbox_id=self._sandbox_id, exec_id=exec_id or "", process=spec))
        h = self._commands._open(first, on_stdout, on_stderr, capture)
        try:
            return h.wait()
        except BaseException:
            if not h.done:
                try:
                    h.kill("INT")
                except BerthError:
                    pass
                h.disconnect()
            raise

    def delete(self) -> None:
        """Ends the shell and its background jobs and forgets the session."""
        self._conn.call(self._conn.sandboxes.DeleteSession,
                        session_pb2.DeleteSessionRequest(sandbox_id=self._sandbox_id, session_id=self.id))


class Sessions:
    """The shell sessions of one sandbox (sandbox.sessions)."""

    def __init__(self, conn: Connection, sandbox_id: str, commands: Commands):
        self._conn = conn
        self._sandbox_id = sandbox_id
        self._commands = commands

    def create(self, *, shell: str = "sh", name: str = "", cwd: Optional[str] = None, env: Optional[Dict[str, str]] = None,
               user: Union[None, int, str] = None, session_id: Optional[str] = None) -> Session:
        """Starts a session: shell "sh" (/bin/sh) or "bash"; cwd, env and
        user as for commands.run; session_id names it (else minted)."""
        req = session_pb2.CreateSessionRequest(
            sandbox_id=self._sandbox_id, session_id=session_id or "", name=name, cwd=cwd or "", env=env or {},
            user=user_arg(user), shell=exec_pb2.SHELL_BASH if shell == "bash" else exec_pb2.SHELL_SH)
        resp = self._conn.call(self._conn.sandboxes.CreateSession, req)
        return Session(self._conn, self._sandbox_id, self._commands, resp.session)

    def list(self) -> List[session_pb2.SessionInfo]:
        """The sandbox's sessions, oldest first."""
        return list(self._conn.call(self._conn.sandboxes.ListSessions,
                                    session_pb2.ListSessionsRequest(sandbox_id=self._sandbox_id)).sessions)
