"""The connection to berthd and the retry policy (the Go client's:
client/client.go Dial, client/retry.go)."""

from __future__ import annotations

import dataclasses
import os
import random
import time
from typing import Callable, Optional, TypeVar

import grpc

from berth._errors import BerthError, FleetBusy, from_rpc_error, is_retryable
from berth.v1 import file_pb2_grpc, image_pb2_grpc, sandbox_pb2_grpc

#: The address used when neither addr nor $BERTH_ADDR is given (the CLI's).
DEFAULT_ADDR = "unix:///run/berth/berthd.sock"

T = TypeVar("T")


@dataclasses.dataclass
class RetryPolicy:
    """Which failures are retried and how, as the Go client's RetryPolicy:
    FleetBusy after the server's delay (at least it, up to a fifth more,
    capped by max_busy_delay), Unreachable and a containerd failure that ran
    nothing and CLUSTER_UNAVAILABLE with jittered exponential backoff (from
    initial_backoff, doubling up to max_backoff; CLUSTER_UNAVAILABLE at
    least its RetryInfo delay). RuntimeReplaced, StaleHandle and everything
    else are never retried. Retried: creating, getting, listing, pausing,
    resuming and deleting sandboxes, and the opening of a command (until
    berthd says it runs). Times in seconds."""

    max_attempts: int = 10
    initial_backoff: float = 0.1
    max_backoff: float = 5.0
    max_busy_delay: float = 30.0
    on_retry: Optional[Callable[[int, BerthError, float], None]] = None


class Connection:
    """A gRPC channel to berthd and its service stubs; shared by the
    Sandbox objects made with it. Safe for use from many threads.

    addr: "unix:///run/berth/berthd.sock", "unix:/path", a bare absolute
    path, or "host:port" (TLS unless insecure); default $BERTH_ADDR, else
    DEFAULT_ADDR. token: a bearer token sent as "authorization: Bearer" on
    every call; default $BERTH_TOKEN, else the contents of
    $BERTH_TOKEN_FILE; on a unix socket a caller without one is the
    principal of its uid. TLS (TCP only): ca_file, cert_file, key_file
    (PEM; defaults $BERTH_TLS_CA, $BERTH_TLS_CERT, $BERTH_TLS_KEY),
    server_name when the address's host is not in berthd's certificate,
    or credentials (a grpc.ChannelCredentials) instead. insecure talks
    plaintext TCP to a berthd run with --insecure-tcp. retry: a
    RetryPolicy (the default) or None to never retry. no_resume: calls
    through this connection never resume a paused sandbox nor wake a
    hibernated one (they raise BerthError with reason SANDBOX_PAUSED or
    SANDBOX_HIBERNATED and change nothing): every call carries the
    metadata "berth-no-resume: true", as the Go client's NoResume(ctx)
    (docs/state.md)."""

    def __init__(self, addr: Optional[str] = None, *, token: Optional[str] = None,
                 ca_file: Optional[str] = None, cert_file: Optional[str] = None, key_file: Optional[str] = None,
                 server_name: Optional[str] = None, credentials: Optional[grpc.ChannelCredentials] = None,
                 insecure: bool = False, retry: Optional[RetryPolicy] = RetryPolicy(), no_resume: bool = False):
        addr = addr or os.environ.get("BERTH_ADDR") or DEFAULT_ADDR
        if addr.startswith("/"):
            addr = "unix://" + addr
        self.addr = addr
        if token is None:
            token = os.environ.get("BERTH_TOKEN") or None
            token_file = os.environ.get("BERTH_TOKEN_FILE")
            if token is None and token_file:
                with open(token_file, encoding="utf-8") as f:
                    token = f.read().strip()
                if not token:
                    raise ValueError(f"$BERTH_TOKEN_FILE {token_file} is empty")
        self.metadata = (("authorization", "Bearer " + token),) if token else ()
        if no_resume:
            self.metadata += (("berth-no-resume", "true"),)
        options = [("grpc.keepalive_time_ms", 30000), ("grpc.keepalive_timeout_ms", 10000),
                   ("grpc.keepalive_permit_without_calls", 1)]
        if addr.startswith("unix:") or insecure:
            self.channel = grpc.insecure_channel(addr, options)
        else:
            if credentials is None:
                ca_file = ca_file or os.environ.get("BERTH_TLS_CA")
                cert_file = cert_file or os.environ.get("BERTH_TLS_CERT")
                key_file = key_file or os.environ.get("BERTH_TLS_KEY")
                if bool(cert_file) != bool(key_file):
                    raise ValueError("a TLS client certificate needs both its certificate and its key file")

                def read(path: Optional[str]) -> Optional[bytes]:
                    if not path:
                        return None
                    with open(path, "rb") as f:
                        return f.read()
                credentials = grpc.ssl_channel_credentials(read(ca_file), read(key_file), read(cert_file))
            if server_name:
                options.append(("grpc.ssl_target_name_override", server_name))
            self.channel = grpc.secure_channel(addr, credentials, options)
        self.retry_policy = retry
        self.sandboxes = sandbox_pb2_grpc.SandboxServiceStub(self.channel)
        self.files = file_pb2_grpc.FileServiceStub(self.channel)
        self.images = image_pb2_grpc.ImageServiceStub(self.channel)

    def close(self) -> None:
        """Closes the channel; streams and port forwards on it end."""
        self.channel.close()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def call(self, method: Callable[..., T], request, timeout: Optional[float] = None) -> T:
        """Calls a unary method once, converting its error."""
        try:
            return method(request, metadata=self.metadata, timeout=timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def retry(self, fn: Callable[[], T], deadline: Optional[float] = None) -> T:
        """Runs fn (which raises BerthError) under the retry policy until it
        succeeds, fails with something not to retry, the attempts run out,
        or the wait would pass deadline (time.monotonic()); the last error
        is raised."""
        p = self.retry_policy
        backoff = p.initial_backoff if p else 0.0
        attempt = 1
        while True:
            try:
                return fn()
            except BerthError as err:
                if p is None or attempt >= p.max_attempts or not is_retryable(err):
                    raise
                if isinstance(err, FleetBusy):
                    d = min(err.retry_after, p.max_busy_delay)
                    wait = d + random.uniform(0, d / 5)
                else:
                    wait = backoff / 2 + random.uniform(0, backoff / 2)
                    backoff = min(2 * backoff, p.max_backoff)
                    if err.reason == "CLUSTER_UNAVAILABLE" and err.retry_delay:
                        wait = max(wait, min(err.retry_delay, p.max_busy_delay))
                if deadline is not None and time.monotonic() + wait > deadline:
                    raise
                if p.on_retry:
                    p.on_retry(attempt, err, wait)
                time.sleep(wait)
                attempt += 1

    def unary(self, method: Callable[..., T], request, timeout: Optional[float] = None) -> T:
        """Calls a unary method under the retry policy."""
        deadline = time.monotonic() + timeout if timeout else None
        return self.retry(lambda: self.call(method, request, None if deadline is None else max(deadline - time.monotonic(), 0.001)), deadline)
