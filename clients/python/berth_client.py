"""berth's API for Python: the generated modules (berth.v1.*_pb2 and
*_pb2_grpc, google.rpc.status_pb2 and error_details_pb2; made by protoc and
grpc_python_plugin from buf.gen.clients.yaml) plus a connection to berthd
and the typed details of an error.

Needs grpcio and protobuf (Debian: python3-grpcio, python3-protobuf, for
the system python3) and this directory on sys.path.
"""

import dataclasses
from typing import Optional

import grpc

from berth.v1 import errors_pb2, file_pb2_grpc, image_pb2_grpc, sandbox_pb2_grpc
from google.rpc import error_details_pb2, status_pb2


class Berth:
    """The clients of one berthd: sandboxes, files, images.

    address is "unix:///run/berth/berthd.sock" (or a bare absolute path) for
    the unix socket, or "host:port" with tls (grpc.ssl_channel_credentials):
    berthd serves TCP only with TLS. token is a bearer token (README
    "Tokens"), sent on every call as "authorization: Bearer"; on the unix
    socket a caller without one is the principal of its uid.
    """

    def __init__(self, address: str, token: Optional[str] = None, tls: Optional[grpc.ChannelCredentials] = None):
        if address.startswith("/"):
            address = "unix://" + address
        options = [("grpc.keepalive_time_ms", 30000), ("grpc.keepalive_timeout_ms", 10000)]
        if tls is not None:
            self.channel = grpc.secure_channel(address, tls, options)
        else:
            self.channel = grpc.insecure_channel(address, options)
        self.metadata = (("authorization", "Bearer " + token),) if token else ()
        self.sandboxes = sandbox_pb2_grpc.SandboxServiceStub(self.channel)
        self.files = file_pb2_grpc.FileServiceStub(self.channel)
        self.images = image_pb2_grpc.ImageServiceStub(self.channel)

    def close(self):
        self.channel.close()


@dataclasses.dataclass
class Details:
    """The details of a berth error. error_info is always there for berth's
    own errors; its reason is the stable token to branch on."""

    error_info: Optional[error_details_pb2.ErrorInfo] = None
    retry_info: Optional[error_details_pb2.RetryInfo] = None
    bad_request: Optional[error_details_pb2.BadRequest] = None
    fleet_busy: Optional[errors_pb2.FleetBusy] = None
    unreachable: Optional[errors_pb2.Unreachable] = None
    runtime_replaced: Optional[errors_pb2.RuntimeReplaced] = None
    stale_handle: Optional[errors_pb2.StaleHandle] = None


_DETAILS = {
    "google.rpc.ErrorInfo": ("error_info", error_details_pb2.ErrorInfo),
    "google.rpc.RetryInfo": ("retry_info", error_details_pb2.RetryInfo),
    "google.rpc.BadRequest": ("bad_request", error_details_pb2.BadRequest),
    "berth.v1.FleetBusy": ("fleet_busy", errors_pb2.FleetBusy),
    "berth.v1.Unreachable": ("unreachable", errors_pb2.Unreachable),
    "berth.v1.RuntimeReplaced": ("runtime_replaced", errors_pb2.RuntimeReplaced),
    "berth.v1.StaleHandle": ("stale_handle", errors_pb2.StaleHandle),
}


def details(err: grpc.RpcError) -> Details:
    """Decodes the typed details of err, a grpc.RpcError from berthd, from
    its grpc-status-details-bin trailer (a google.rpc.Status). Never parse
    the message. An error without details (one the gRPC library made) gives
    an empty Details."""
    out = Details()
    for key, value in err.trailing_metadata() or ():
        if key != "grpc-status-details-bin":
            continue
        status = status_pb2.Status.FromString(value)
        for any_ in status.details:
            name = any_.type_url.rsplit("/", 1)[-1]
            if name in _DETAILS:
                field, cls = _DETAILS[name]
                msg = cls()
                any_.Unpack(msg)
                setattr(out, field, msg)
    return out
