"""Unit tests of the SDK's error model and retry policy: no berthd needed.
Statuses are built as berthd sends them (a google.rpc.Status with
ErrorInfo, RetryInfo and a berth.v1 detail in grpc-status-details-bin)."""

import os
import re
import sys
import unittest

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import berth  # noqa: E402
from berth._errors import from_rpc_error  # noqa: E402
from berth.v1 import errors_pb2  # noqa: E402
from google.rpc import error_details_pb2, status_pb2  # noqa: E402


class FakeRpcError(grpc.RpcError):
    def __init__(self, code, message, reason="", details=(), metadata=None):
        self._code, self._message = code, message
        st = status_pb2.Status(code=code.value[0], message=message)
        if reason:
            st.details.add().Pack(error_details_pb2.ErrorInfo(reason=reason, domain="berth.dev", metadata=metadata or {}))
        for d in details:
            st.details.add().Pack(d)
        self._trailers = (("grpc-status-details-bin", st.SerializeToString()),)

    def code(self):
        return self._code

    def details(self):
        return self._message

    def trailing_metadata(self):
        return self._trailers


def busy(delay_s=2, resource=errors_pb2.CAPACITY_RESOURCE_SANDBOX_EXECS):
    ri = error_details_pb2.RetryInfo()
    ri.retry_delay.FromSeconds(delay_s)
    return FakeRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "no capacity", "FLEET_BUSY",
                        [ri, errors_pb2.FleetBusy(resource=resource, limit=1, in_use=1, admitted=errors_pb2.ADMITTED_NOT_STARTED)])


def unreachable(admitted):
    return FakeRpcError(grpc.StatusCode.UNAVAILABLE, "agent did not answer", "SANDBOX_UNREACHABLE",
                        [errors_pb2.Unreachable(cause=errors_pb2.UNREACHABLE_CAUSE_CONNECT_TIMEOUT, admitted=admitted)])


class ErrorsTest(unittest.TestCase):
    def test_reason_picks_the_class(self):
        e = from_rpc_error(busy())
        self.assertIsInstance(e, berth.FleetBusy)
        self.assertEqual((e.reason, e.retry_after, e.detail.in_use), ("FLEET_BUSY", 2.0, 1))
        self.assertEqual(str(e), "no capacity (RESOURCE_EXHAUSTED, FLEET_BUSY)")
        nf = from_rpc_error(FakeRpcError(grpc.StatusCode.NOT_FOUND, "no file", "FILE_NOT_FOUND", metadata={"path": "/x"}))
        self.assertIsInstance(nf, berth.FileNotFound)
        self.assertIsInstance(nf, berth.NotFound)
        self.assertEqual(nf.metadata, {"path": "/x"})
        bad = error_details_pb2.BadRequest()
        bad.field_violations.add(field="image", description="is empty")
        ia = from_rpc_error(FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT, "bad", "INVALID_ARGUMENT", [bad]))
        self.assertEqual(ia.field_violations, [("image", "is empty")])
        plain = from_rpc_error(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "connection refused"))
        self.assertEqual((type(plain), plain.reason), (berth.BerthError, ""))
        # The message never decides: a reason-less status whose text names
        # a reason is still a plain BerthError.
        self.assertEqual(type(from_rpc_error(FakeRpcError(grpc.StatusCode.NOT_FOUND, "SANDBOX_NOT_FOUND"))), berth.BerthError)

    def test_session_and_context_reasons(self):
        # Each SESSION_* and CONTEXT_* reason the Go client names
        # (client/errors.go) picks its own subclass, the not-found ones
        # under NotFound; none is retried.
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "client", "errors.go")) as f:
            go = f.read()
        reasons = sorted(set(re.findall(r'"((?:SESSION|CONTEXT)_[A-Z_]+)"', go)))
        self.assertEqual(len(reasons), 7, reasons)
        want = {
            "SESSION_NOT_FOUND": (berth.SessionNotFound, grpc.StatusCode.NOT_FOUND),
            "SESSION_EXISTS": (berth.SessionExists, grpc.StatusCode.ALREADY_EXISTS),
            "SESSION_BUSY": (berth.SessionBusy, grpc.StatusCode.FAILED_PRECONDITION),
            "SESSION_ENDED": (berth.SessionEnded, grpc.StatusCode.FAILED_PRECONDITION),
            "CONTEXT_NOT_FOUND": (berth.ContextNotFound, grpc.StatusCode.NOT_FOUND),
            "CONTEXT_EXISTS": (berth.ContextExists, grpc.StatusCode.ALREADY_EXISTS),
            "CONTEXT_ENDED": (berth.ContextEnded, grpc.StatusCode.FAILED_PRECONDITION),
        }
        self.assertEqual(reasons, sorted(want))
        for reason, (cls, code) in want.items():
            e = from_rpc_error(FakeRpcError(code, "x", reason, metadata={"exec_id": "e1"}))
            self.assertIs(type(e), cls, reason)
            self.assertEqual((e.reason, e.metadata), (reason, {"exec_id": "e1"}))
            self.assertEqual(isinstance(e, berth.NotFound), reason.endswith("_NOT_FOUND"), reason)
            self.assertFalse(berth.is_retryable(e), reason)

    def test_retryable_as_the_go_client(self):
        self.assertTrue(berth.is_retryable(from_rpc_error(busy())))
        # Only a deletion frees disk, whatever delay an older berthd sent.
        for resource in (errors_pb2.CAPACITY_RESOURCE_DISK, errors_pb2.CAPACITY_RESOURCE_PRINCIPAL_DISK):
            self.assertFalse(berth.is_retryable(from_rpc_error(busy(resource=resource))), resource)
        self.assertTrue(berth.is_retryable(from_rpc_error(unreachable(errors_pb2.ADMITTED_NOT_STARTED))))
        self.assertFalse(berth.is_retryable(from_rpc_error(unreachable(errors_pb2.ADMITTED_UNKNOWN))))
        for reason, code in (("RUNTIME_REPLACED", grpc.StatusCode.ABORTED), ("STALE_HANDLE", grpc.StatusCode.FAILED_PRECONDITION),
                             ("SANDBOX_NOT_FOUND", grpc.StatusCode.NOT_FOUND)):
            self.assertFalse(berth.is_retryable(from_rpc_error(FakeRpcError(code, "x", reason))), reason)
        self.assertTrue(berth.is_retryable(from_rpc_error(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "etcd", "CLUSTER_UNAVAILABLE"))))

    def test_retry_policy(self):
        waits = []
        conn = berth.Connection("unix:///nonexistent.sock", token="",
                                retry=berth.RetryPolicy(max_attempts=3, initial_backoff=0.01, on_retry=lambda a, e, w: waits.append((a, e.reason, w))))
        self.addCleanup(conn.close)
        import berth._connection as c
        sleeps = []
        real_sleep = c.time.sleep
        c.time.sleep = sleeps.append
        self.addCleanup(setattr, c.time, "sleep", real_sleep)

        calls = iter([busy(2), unreachable(errors_pb2.ADMITTED_NOT_STARTED)])

        def fn():
            e = next(calls, None)
            if e is None:
                return "ran"
            raise from_rpc_error(e)
        self.assertEqual(conn.retry(fn), "ran")
        self.assertEqual([(a, r) for a, r, _ in waits], [(1, "FLEET_BUSY"), (2, "SANDBOX_UNREACHABLE")])
        self.assertTrue(2.0 <= sleeps[0] <= 2.4, sleeps)  # at least the server's delay, up to a fifth more
        self.assertTrue(0.005 <= sleeps[1] <= 0.01, sleeps)

        replaced = FakeRpcError(grpc.StatusCode.ABORTED, "runtime died", "RUNTIME_REPLACED", [errors_pb2.RuntimeReplaced()])
        attempts = []

        def fails():
            attempts.append(1)
            raise from_rpc_error(replaced)
        with self.assertRaises(berth.RuntimeReplaced):
            conn.retry(fails)
        self.assertEqual(len(attempts), 1)  # never retried

        attempts.clear()

        def always_busy():
            attempts.append(1)
            raise from_rpc_error(busy(1))
        with self.assertRaises(berth.FleetBusy):
            conn.retry(always_busy)
        self.assertEqual(len(attempts), 3)  # max_attempts


if __name__ == "__main__":
    unittest.main()
