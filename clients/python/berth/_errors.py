"""berth's error model in Python: every failed call raises a BerthError
(or a subclass chosen by the status's ErrorInfo reason), made from the
gRPC status and its typed details, never from the message text. See
docs/errors.md for the reasons, and the Go client (client/errors.go,
client/conditions.go) whose types these mirror."""

from __future__ import annotations

import datetime
import math
import numbers
from typing import Any, Dict, List, Optional, Tuple

import grpc

from berth.v1 import errors_pb2
from google.rpc import error_details_pb2, status_pb2

#: The google.rpc.ErrorInfo domain of berth's errors.
ERROR_DOMAIN = "berth.dev"

#: The delay FleetBusy.retry_after gives when the status carries none.
DEFAULT_BUSY_DELAY = 1.0


class BerthError(Exception):
    """An error from berthd, or from gRPC on the way to it.

    code is the grpc.StatusCode; reason the stable token of the status's
    ErrorInfo (domain berth.dev, e.g. "SANDBOX_NOT_FOUND"; "" for errors
    gRPC made itself, such as UNAVAILABLE when berthd cannot be reached);
    message is for people, never parse it; metadata is the ErrorInfo's
    metadata (e.g. {"path": "/x"}); field_violations the (field,
    description) pairs of a BadRequest; retry_delay the RetryInfo delay in
    seconds (None without one); detail the typed berth.v1 detail
    (FleetBusy, Unreachable, RuntimeReplaced, StaleHandle,
    DependencyFailure) or None; entries, for an error of files.list, the
    FileInfo entries received before it was raised (else None)."""

    entries: Optional[List[Any]] = None

    def __init__(self, code: grpc.StatusCode, message: str, reason: str = "",
                 metadata: Optional[Dict[str, str]] = None,
                 field_violations: Optional[List[Tuple[str, str]]] = None,
                 retry_delay: Optional[float] = None, detail: Any = None):
        self.code = code
        self.message = message or f"berthd returned {code.name} without a message"
        self.reason = reason
        self.metadata = dict(metadata or {})
        self.field_violations = list(field_violations or [])
        self.retry_delay = retry_delay
        self.detail = detail
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.reason:
            return f"{self.message} ({self.code.name}, {self.reason})"
        return f"{self.message} ({self.code.name})"

    @property
    def details(self) -> Dict[str, Any]:
        """The error's details as a dict: reason, metadata, field
        violations, retry delay and the typed detail's fields."""
        from google.protobuf import json_format
        d: Dict[str, Any] = {"code": self.code.name, "reason": self.reason, "metadata": self.metadata}
        if self.field_violations:
            d["field_violations"] = self.field_violations
        if self.retry_delay is not None:
            d["retry_delay"] = self.retry_delay
        if self.detail is not None:
            d["detail"] = json_format.MessageToDict(self.detail, preserving_proto_field_name=True)
        return d


class InvalidArgument(BerthError):
    """INVALID_ARGUMENT: a request field is invalid; field_violations name it."""


class Unauthenticated(BerthError):
    """UNAUTHENTICATED: no or an unknown token, no client certificate."""


class NotPermitted(BerthError):
    """NOT_PERMITTED: the principal may not call this (image writes are for admins)."""


class NotFound(BerthError):
    """A NOT_FOUND reason: see the subclasses."""


class SandboxNotFound(NotFound):
    """SANDBOX_NOT_FOUND: no such sandbox, or another principal's."""


class ExecNotFound(NotFound):
    """EXEC_NOT_FOUND: no such exec in the sandbox's current runtime."""


class ImageNotFound(NotFound):
    """IMAGE_NOT_FOUND: the image is not in berthd's store."""


class FileNotFound(NotFound):
    """FILE_NOT_FOUND: the path or a parent is missing; metadata["path"] names it."""


class SessionNotFound(NotFound):
    """SESSION_NOT_FOUND: no such shell session in the sandbox."""


class SessionExists(BerthError):
    """SESSION_EXISTS (ALREADY_EXISTS): the session id is taken."""


class SessionBusy(BerthError):
    """SESSION_BUSY (FAILED_PRECONDITION): a command runs in the session;
    metadata["exec_id"] names it."""


class SessionEnded(BerthError):
    """SESSION_ENDED (FAILED_PRECONDITION): the session's shell exited;
    delete the session."""


class ContextNotFound(NotFound):
    """CONTEXT_NOT_FOUND: no such code context in the sandbox."""


class ContextExists(BerthError):
    """CONTEXT_EXISTS (ALREADY_EXISTS): the context id is taken by a running
    context."""


class ContextEnded(BerthError):
    """CONTEXT_ENDED (FAILED_PRECONDITION): the context's interpreter
    ended; restart the context."""


class FileExists(BerthError):
    """FILE_EXISTS: the target exists and may not be replaced."""


class FilePermissionDenied(BerthError):
    """PERMISSION_DENIED: the sandbox's workload user may not."""


class PortClosed(BerthError):
    """PORT_CLOSED: nothing accepts connections on the port in the sandbox."""


class FleetBusy(BerthError):
    """FLEET_BUSY (RESOURCE_EXHAUSTED): no capacity for a new sandbox or
    exec now; nothing started. detail is a berth.v1.FleetBusy (resource,
    limit, in_use); retry the same call after retry_after seconds, which a
    client with a RetryPolicy does by itself."""

    @property
    def retry_after(self) -> float:
        """Seconds to wait: the RetryInfo delay, else the detail's, else
        DEFAULT_BUSY_DELAY; never zero."""
        if self.retry_delay:
            return self.retry_delay
        if self.detail is not None and self.detail.HasField("retry_delay"):
            d = self.detail.retry_delay.ToTimedelta().total_seconds()
            if d > 0:
                return d
        return DEFAULT_BUSY_DELAY

    @property
    def freed_by_waiting(self) -> bool:
        """Whether waiting alone can free the capacity that ran out: False
        for disk (CAPACITY_RESOURCE_DISK, CAPACITY_RESOURCE_PRINCIPAL_DISK),
        which stays promised until a sandbox or snapshot is deleted, so
        is_retryable says no; True for sandboxes, memory, execs and Run
        buffers, which others' work frees as it ends."""
        resource = self.detail.resource if self.detail is not None else 0
        return resource not in (errors_pb2.CAPACITY_RESOURCE_DISK, errors_pb2.CAPACITY_RESOURCE_PRINCIPAL_DISK)


class Unreachable(BerthError):
    """SANDBOX_UNREACHABLE (UNAVAILABLE): the sandbox's agent did not
    answer; detail (berth.v1.Unreachable) gives the cause. Retried by the
    retry policy only when nothing_ran."""

    @property
    def nothing_ran(self) -> bool:
        return self.detail is not None and self.detail.admitted == errors_pb2.ADMITTED_NOT_STARTED


class RuntimeReplaced(BerthError):
    """RUNTIME_REPLACED (ABORTED): the sandbox's runtime died under the
    command, whose processes are gone; it may have run partly. Never
    retried automatically."""


class StaleHandle(BerthError):
    """STALE_HANDLE (FAILED_PRECONDITION): the exec id belongs to an earlier
    runtime of the sandbox; nothing was done. Start a new command."""


class DependencyFailure(BerthError):
    """CONTAINERD_UNAVAILABLE, SERVER_DISK_FULL, SERVER_DESCRIPTORS_EXHAUSTED:
    something berthd depends on failed (detail: berth.v1.DependencyFailure).
    A containerd failure that changed nothing is retried by the policy."""

    @property
    def nothing_ran(self) -> bool:
        return self.detail is not None and self.detail.admitted == errors_pb2.ADMITTED_NOT_STARTED


class ProtocolError(BerthError):
    """berthd broke a stream's protocol (an exec stream without started or
    exited): output may be lost, so the SDK gives up instead of guessing."""

    def __init__(self, message: str):
        super().__init__(grpc.StatusCode.INTERNAL, message, reason="")


_BY_REASON = {
    "INVALID_ARGUMENT": InvalidArgument,
    "UNAUTHENTICATED": Unauthenticated,
    "NOT_PERMITTED": NotPermitted,
    "SANDBOX_NOT_FOUND": SandboxNotFound,
    "EXEC_NOT_FOUND": ExecNotFound,
    "IMAGE_NOT_FOUND": ImageNotFound,
    "FILE_NOT_FOUND": FileNotFound,
    "SESSION_NOT_FOUND": SessionNotFound,
    "SESSION_EXISTS": SessionExists,
    "SESSION_BUSY": SessionBusy,
    "SESSION_ENDED": SessionEnded,
    "CONTEXT_NOT_FOUND": ContextNotFound,
    "CONTEXT_EXISTS": ContextExists,
    "CONTEXT_ENDED": ContextEnded,
    "FILE_EXISTS": FileExists,
    "PERMISSION_DENIED": FilePermissionDenied,
    "PORT_CLOSED": PortClosed,
    "FLEET_BUSY": FleetBusy,
    "SANDBOX_UNREACHABLE": Unreachable,
    "RUNTIME_REPLACED": RuntimeReplaced,
    "STALE_HANDLE": StaleHandle,
    "CONTAINERD_UNAVAILABLE": DependencyFailure,
    "SERVER_DISK_FULL": DependencyFailure,
    "SERVER_DESCRIPTORS_EXHAUSTED": DependencyFailure,
}

_DETAILS = {
    "berth.v1.FleetBusy": errors_pb2.FleetBusy,
    "berth.v1.Unreachable": errors_pb2.Unreachable,
    "berth.v1.RuntimeReplaced": errors_pb2.RuntimeReplaced,
    "berth.v1.StaleHandle": errors_pb2.StaleHandle,
    "berth.v1.DependencyFailure": errors_pb2.DependencyFailure,
}


def from_rpc_error(err: grpc.RpcError) -> BerthError:
    """Converts a grpc.RpcError into the BerthError subclass of its reason,
    decoding the grpc-status-details-bin trailer (a google.rpc.Status)."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    message = err.details() if hasattr(err, "details") else str(err)
    reason, metadata, violations, delay, detail = "", {}, [], None, None
    trailers = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    for key, value in trailers or ():
        if key != "grpc-status-details-bin":
            continue
        status = status_pb2.Status.FromString(value)
        for any_ in status.details:
            name = any_.type_url.rsplit("/", 1)[-1]
            if name == "google.rpc.ErrorInfo":
                info = error_details_pb2.ErrorInfo()
                any_.Unpack(info)
                if info.domain == ERROR_DOMAIN and not reason:
                    reason, metadata = info.reason, dict(info.metadata)
            elif name == "google.rpc.BadRequest":
                bad = error_details_pb2.BadRequest()
                any_.Unpack(bad)
                violations += [(v.field, v.description) for v in bad.field_violations]
            elif name == "google.rpc.RetryInfo":
                info = error_details_pb2.RetryInfo()
                any_.Unpack(info)
                delay = max(info.retry_delay.ToTimedelta().total_seconds(), 0.0)
            elif name in _DETAILS:
                detail = _DETAILS[name]()
                any_.Unpack(detail)
    cls = _BY_REASON.get(reason, BerthError)
    e = cls(code, message or "", reason, metadata, violations, delay, detail)
    e.__cause__ = err
    return e


def is_retryable(err: BaseException) -> bool:
    """Whether err is safe to retry as is, as the Go client's IsRetryable:
    FleetBusy that waiting can cure (after retry_after; not a full disk
    budget: freed_by_waiting), Unreachable and a containerd
    DependencyFailure whose call ran nothing, and CLUSTER_UNAVAILABLE.
    RuntimeReplaced and StaleHandle never are."""
    if isinstance(err, FleetBusy):
        return err.freed_by_waiting
    if isinstance(err, DependencyFailure):
        return err.reason == "CONTAINERD_UNAVAILABLE" and err.nothing_ran
    if isinstance(err, Unreachable):
        return err.nothing_ran
    return isinstance(err, BerthError) and err.reason == "CLUSTER_UNAVAILABLE"


def invalid_argument(field: str, description: str) -> InvalidArgument:
    """The InvalidArgument the SDK raises for a bad argument before anything
    is sent: field names the parameter as the caller wrote it ("depth",
    "timeout"), in field_violations and the message, as berthd's own
    BadRequest would."""
    return InvalidArgument(grpc.StatusCode.INVALID_ARGUMENT, f"{field} {description}", "INVALID_ARGUMENT",
                           field_violations=[(field, description)])


#: The largest uint32 and uint64 of the API, the bounds of int_arg.
UINT32_MAX = 2 ** 32 - 1
UINT64_MAX = 2 ** 64 - 1

#: The longest google.protobuf.Duration, in seconds (10000 years).
MAX_DURATION = 315_576_000_000


def int_arg(field: str, v: Any, maximum: int = UINT64_MAX, minimum: int = 0) -> Any:
    """Checks a count, size, sequence number or id: an int from minimum to
    maximum (default 0 to 2**64 - 1, a uint64 of the API; any
    numbers.Integral but bool); None passes. Else InvalidArgument naming
    field."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not minimum <= v <= maximum:
        raise invalid_argument(field, f"{v!r} is not an int from {minimum} to {maximum}")
    return int(v)


def mode_arg(field: str, v: Any) -> Optional[int]:
    """Checks permission bits: an int from 0 to 0o7777, written in octal as
    0o755. A string such as "0755" is refused rather than guessed at
    (decimal or octal). None passes."""
    if isinstance(v, str):
        raise invalid_argument(field, f"{v!r} is a string: give the permission bits as an int, such as 0o755")
    return int_arg(field, v, 0o7777)


def seconds_arg(field: str, v: Any) -> Optional[float]:
    """Checks a timeout or delay in seconds: a real number (int, float, any
    numbers.Real but bool), finite, from 0 to 10000 years; None passes.
    Else InvalidArgument naming field."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or not 0 <= v <= MAX_DURATION:
        raise invalid_argument(field, f"{v!r} is not a number of seconds from 0 to {MAX_DURATION}")
    return float(v)


def duration(sec: float, field: str = "timeout") -> Any:
    """sec, the argument field in seconds (checked by seconds_arg), as a
    google.protobuf.Duration."""
    from google.protobuf import duration_pb2
    seconds_arg(field, sec)
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(sec * 1e9))
    return d


def seconds(d: Any) -> float:
    """A google.protobuf.Duration as float seconds."""
    return d.seconds + d.nanos / 1e9


def timestamp(t: Any) -> Optional[datetime.datetime]:
    """A google.protobuf.Timestamp as an aware datetime (None when unset)."""
    if not t.seconds and not t.nanos:
        return None
    return t.ToDatetime(tzinfo=datetime.timezone.utc)
