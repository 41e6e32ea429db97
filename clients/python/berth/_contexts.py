"""sandbox.contexts: code contexts, long-lived Python interpreters
(docs/contexts.md), in the shape of E2B's run_code."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import grpc

from berth._connection import Connection
from berth._errors import duration, from_rpc_error
from berth.v1 import context_pb2


@dataclass
class Execution:
    """What a cell did: stdout and stderr (text, in order), results (rich
    results as CodeResult: data maps MIME types to bytes, is_main_result
    marks the last expression's value), error (a CodeError with name,
    value, traceback; None when the cell ran through), timed_out."""
    stdout: str = ""
    stderr: str = ""
    results: List[context_pb2.CodeResult] = field(default_factory=list)
    error: Optional[context_pb2.CodeError] = None
    timed_out: bool = False

    @property
    def text(self) -> Optional[str]:
        """The text/plain of the main result, None when there is none."""
        for r in self.results:
            if r.is_main_result:
                return r.data["text/plain"].decode()
        return None


class CodeContext:
    """A Python interpreter whose variables persist from one cell to the
    next. info is the CodeContextInfo of its creation; id names it."""

    def __init__(self, conn: Connection, sandbox_id: str, info: context_pb2.CodeContextInfo):
        self._conn = conn
        self._sandbox_id = sandbox_id
        self.info = info
        self.id: str = info.context_id

    def run_code(self, code: str, *, timeout: Optional[float] = None,
                 on_stdout: Optional[Callable[[str], None]] = None, on_stderr: Optional[Callable[[str], None]] = None,
                 on_result: Optional[Callable[[context_pb2.CodeResult], None]] = None,
                 on_error: Optional[Callable[[context_pb2.CodeError], None]] = None) -> Execution:
        """Runs code as one cell and returns its Execution; the callbacks
        see each event as it comes. timeout: seconds; at its end the cell
        gets KeyboardInterrupt and the context lives on. Raises BerthError
        with reason CONTEXT_NOT_FOUND or CONTEXT_ENDED."""
        req = context_pb2.ExecuteCodeRequest(sandbox_id=self._sandbox_id, context_id=self.id, code=code)
        if timeout is not None:
            req.timeout.CopyFrom(duration(timeout))
        ex = Execution()
        try:
            for ev in self._conn.sandboxes.ExecuteCode(req, metadata=self._conn.metadata):
                kind = ev.WhichOneof("event")
                if kind == "stdout":
                    ex.stdout += ev.stdout
                    if on_stdout:
                        on_stdout(ev.stdout)
                elif kind == "stderr":
                    ex.stderr += ev.stderr
                    if on_stderr:
                        on_stderr(ev.stderr)
                elif kind == "result":
                    ex.results.append(ev.result)
                    if on_result:
                        on_result(ev.result)
                elif kind == "error":
                    ex.error = ev.error
                    if on_error:
                        on_error(ev.error)
                elif kind == "done":
                    ex.timed_out = ev.done.timed_out
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        return ex

    def interrupt(self) -> None:
        """Raises KeyboardInterrupt in the running cell."""
        self._conn.call(self._conn.sandboxes.InterruptCodeContext,
                        context_pb2.InterruptCodeContextRequest(sandbox_id=self._sandbox_id, context_id=self.id))

    def restart(self) -> None:
        """Replaces the interpreter with a fresh one: every variable is gone."""
        self.info = self._conn.call(self._conn.sandboxes.RestartCodeContext,
                                    context_pb2.RestartCodeContextRequest(sandbox_id=self._sandbox_id, context_id=self.id)).context

    def delete(self) -> None:
        """Ends the interpreter."""
        self._conn.call(self._conn.sandboxes.DeleteCodeContext,
                        context_pb2.DeleteCodeContextRequest(sandbox_id=self._sandbox_id, context_id=self.id))


class CodeContexts:
    """The code contexts of one sandbox (sandbox.contexts)."""

    def __init__(self, conn: Connection, sandbox_id: str):
        self._conn = conn
        self._sandbox_id = sandbox_id

    def create(self, *, language: str = "python", cwd: Optional[str] = None, env: Optional[Dict[str, str]] = None,
               user: Optional[str] = None, context_id: Optional[str] = None) -> CodeContext:
        """Starts a context: a python3 interpreter (the image needs python3:
        else FailedPrecondition INTERPRETER_MISSING)."""
        req = context_pb2.CreateCodeContextRequest(sandbox_id=self._sandbox_id, context_id=context_id or "",
                                                   language=language, cwd=cwd or "", env=env or {}, user=user or "")
        return CodeContext(self._conn, self._sandbox_id, self._conn.call(self._conn.sandboxes.CreateCodeContext, req).context)

    def list(self) -> List[context_pb2.CodeContextInfo]:
        """The contexts whose interpreter runs, oldest first."""
        return list(self._conn.call(self._conn.sandboxes.ListCodeContexts,
                                    context_pb2.ListCodeContextsRequest(sandbox_id=self._sandbox_id)).contexts)
