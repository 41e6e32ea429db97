"""berth's Python SDK: sandboxes, their commands, files and ports, with
typed errors and the retry policy of the Go client.

    import berth
    with berth.Sandbox.create(user="1000:1000") as sb:
        sb.files.write("/workspace/hello.py", "print('hi')")
        r = sb.commands.run(["python3", "hello.py"], timeout=60, on_stdout=print)
        print(r.exit_code, r.stdout)

The generated gRPC modules stay available as berth.v1.*_pb2 and
*_pb2_grpc. docs/clients.md describes the SDK; docs/errors.md the errors.
"""

from berth._version import __version__
from berth._errors import (
    BerthError, ContextEnded, ContextExists, ContextNotFound, DependencyFailure, ExecNotFound, FileExists,
    FileNotFound, FilePermissionDenied, FleetBusy, ImageNotFound, InvalidArgument, NotFound, NotPermitted,
    PortClosed, ProtocolError, RuntimeReplaced, SandboxNotFound, SessionBusy, SessionEnded, SessionExists,
    SessionNotFound, StaleHandle, Unauthenticated, Unreachable, is_retryable,
)
from berth._connection import DEFAULT_ADDR, Connection, RetryPolicy
from berth._commands import CommandHandle, CommandResult, Commands
from berth._files import FileInfo, Files
from berth._watch import FileWatch
from berth._sessions import Session, Sessions
from berth._contexts import CodeContext, CodeContexts, Execution
from berth._ports import PortForward, Ports
from berth._sandbox import DEFAULT_IMAGE, Sandbox
from berth._volumes import Volumes
from berth._snapshots import Snapshots

__all__ = [
    "__version__", "Sandbox", "Connection", "RetryPolicy", "DEFAULT_ADDR", "DEFAULT_IMAGE",
    "Commands", "CommandHandle", "CommandResult", "Sessions", "Session", "CodeContexts", "CodeContext", "Execution", "Files", "FileInfo",
    "FileWatch", "Ports", "PortForward", "Volumes", "Snapshots",
    "BerthError", "InvalidArgument", "Unauthenticated", "NotPermitted", "NotFound", "SandboxNotFound",
    "ExecNotFound", "ImageNotFound", "FileNotFound", "FileExists", "FilePermissionDenied", "PortClosed",
    "FleetBusy", "Unreachable", "RuntimeReplaced", "StaleHandle", "DependencyFailure", "ProtocolError",
    "SessionNotFound", "SessionExists", "SessionBusy", "SessionEnded", "ContextNotFound", "ContextExists",
    "ContextEnded", "is_retryable",
]
