#!/usr/bin/python3
"""A berth client in Python: creates a sandbox, streams an exec with stdin,
writes and reads a file, and meets each typed error (FleetBusy with
RetryInfo, StaleHandle, RuntimeReplaced, Unreachable, each with its
ErrorInfo), decoding their details. It prints one line per step and exits 0
when every step saw what it should.

    BERTH_ADDR=unix:///run/berth/berthd.sock /usr/bin/python3 examples/python/example.py

Debian's system python3 with python3-grpcio and python3-protobuf. berthd
must run with --max-execs-per-sandbox 1 --task-restart-limit 1 (for
FleetBusy and Unreachable) and have berth.dev/base:latest (or
$BERTH_IMAGE). On the unix socket the caller is the principal of its uid;
set BERTH_TOKEN to call with a bearer token instead (docs/security.md "Tokens").
"""

import os
import queue
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))

import grpc  # noqa: E402

import berth_client  # noqa: E402
from berth.v1 import errors_pb2, exec_pb2, file_pb2, sandbox_pb2  # noqa: E402

ADDR = os.environ.get("BERTH_ADDR", "unix:///run/berth/berthd.sock")
IMAGE = os.environ.get("BERTH_IMAGE", "berth.dev/base:latest")
b = berth_client.Berth(ADDR, token=os.environ.get("BERTH_TOKEN"))
TIMEOUT = 60


def exec_stream(first, on_event=None):
    """Runs an Exec stream that starts with first (an ExecRequest) and
    returns (started, stdout, stderr, result). on_event(event, send) sees
    each event; send(ExecRequest) writes to the stream."""
    requests = queue.Queue()
    requests.put(first)
    done = threading.Event()

    def gen():
        while True:
            try:
                r = requests.get(timeout=0.05)
            except queue.Empty:
                if done.is_set():
                    return
                continue
            if r is None:
                return
            yield r

    started, out, err, result = None, b"", b"", None
    try:
        for ev in b.sandboxes.Exec(gen(), metadata=b.metadata, timeout=TIMEOUT):
            kind = ev.WhichOneof("event")
            if kind == "started":
                started = ev.started
            elif kind == "output":
                if ev.output.stream == exec_pb2.STREAM_STDERR:
                    err += ev.output.data
                else:
                    out += ev.output.data
            elif kind == "exited":
                result = ev.exited.result
            if on_event:
                on_event(ev, requests.put)
    finally:
        done.set()
    return started, out, err, result


def start(sandbox_id, exec_id="", background=False, **process):
    return exec_pb2.ExecRequest(start=exec_pb2.ExecStart(
        sandbox_id=sandbox_id, exec_id=exec_id, background=background, process=exec_pb2.ProcessSpec(**process)))


def expect_error(what, fn, code, reason):
    """Runs fn, which must fail with code and ErrorInfo reason; returns the
    decoded details."""
    try:
        fn()
    except grpc.RpcError as e:
        d = berth_client.details(e)
        assert e.code() == code, f"{what}: {e.code()} ({e.details()}), want {code}"
        assert d.error_info is not None and d.error_info.reason == reason, f"{what}: reason {d.error_info}, want {reason}"
        assert d.error_info.domain == "berth.dev"
        return d
    raise AssertionError(f"{what}: succeeded, want {reason}")


def wait_restarted(sandbox_id, boot_id):
    for _ in range(200):
        sb = b.sandboxes.GetSandbox(sandbox_pb2.GetSandboxRequest(sandbox_id=sandbox_id), metadata=b.metadata, timeout=TIMEOUT).sandbox
        if sb.state == sandbox_pb2.SANDBOX_STATE_RUNNING and sb.runtime.agent_boot_id not in ("", boot_id):
            return sb.runtime.agent_boot_id
        time.sleep(0.05)
    raise AssertionError(f"sandbox {sandbox_id} was not restarted within 10 s")


def steps(sid, boot_id):
    # 2. An exec streamed with stdin: cat echoes it, then the exit status.
    def feed(ev, send):
        if ev.WhichOneof("event") == "started":
            send(exec_pb2.ExecRequest(stdin=exec_pb2.ExecStdin(data=b"hello from python\n")))
            send(exec_pb2.ExecRequest(close_stdin=exec_pb2.ExecCloseStdin()))

    started, out, err, result = exec_stream(start(sid, argv=["sh", "-c", "cat; echo bye >&2; exit 3"], stdin=True), feed)
    assert (out, err, result.exit_code) == (b"hello from python\n", b"bye\n", 3), (out, err, result)
    cat_id = started.exec_id
    print(f"exec {cat_id}: stdout {out!r}, exit {result.exit_code}")

    # 3. A file written by a command, read back through FileService.
    exec_stream(start(sid, shell_command="printf 'written in the sandbox' > /workspace/note.txt"))
    content = b"".join(m.chunk for m in b.files.ReadFile(file_pb2.ReadFileRequest(sandbox_id=sid, path="/workspace/note.txt"),
                                                          metadata=b.metadata, timeout=TIMEOUT) if m.WhichOneof("part") == "chunk")
    assert content == b"written in the sandbox", content
    print(f"read /workspace/note.txt: {content!r}")

    # 4. FleetBusy and RetryInfo: one exec at a time per sandbox, one runs.
    exec_stream(start(sid, exec_id="long", background=True, argv=["sleep", "60"]))
    busy = expect_error("second exec", lambda: exec_stream(start(sid, argv=["true"])), grpc.StatusCode.RESOURCE_EXHAUSTED, "FLEET_BUSY")
    assert busy.fleet_busy is not None and busy.retry_info is not None
    delay = busy.retry_info.retry_delay.ToTimedelta().total_seconds()
    print(f"FLEET_BUSY: {busy.fleet_busy.in_use} of {busy.fleet_busy.limit} execs in use, retry after {delay}s")
    b.sandboxes.SignalExec(exec_pb2.SignalExecRequest(sandbox_id=sid, exec_id="long", signal="KILL"), metadata=b.metadata, timeout=TIMEOUT)
    exec_stream(exec_pb2.ExecRequest(attach=exec_pb2.ExecAttach(sandbox_id=sid, exec_id="long")))  # until it exited

    # 5. StaleHandle: the workload stops the agent (kill -TERM 1), berthd
    # starts a new runtime, and the earlier exec id belongs to the old one.
    try:
        exec_stream(start(sid, argv=["kill", "-TERM", "1"]))
    except grpc.RpcError:
        pass
    new_boot = wait_restarted(sid, boot_id)
    stale = expect_error("attach to an exec of the old runtime",
                         lambda: exec_stream(exec_pb2.ExecRequest(attach=exec_pb2.ExecAttach(sandbox_id=sid, exec_id=cat_id))),
                         grpc.StatusCode.FAILED_PRECONDITION, "STALE_HANDLE")
    assert stale.stale_handle.handle_runtime.agent_boot_id == boot_id
    print(f"STALE_HANDLE: exec {stale.stale_handle.exec_id} ran in runtime {boot_id[:8]}, now {new_boot[:8]}")

    # 6. Unreachable: the second stop exceeds --task-restart-limit 1, so the
    # sandbox stays stopped and nothing runs.
    try:
        exec_stream(start(sid, argv=["kill", "-TERM", "1"]))
    except grpc.RpcError:
        pass
    unreachable = None
    for _ in range(200):
        try:
            exec_stream(start(sid, argv=["true"]))
            time.sleep(0.05)  # the task has not exited yet
        except grpc.RpcError as e:
            if berth_client.details(e).runtime_replaced is not None:
                # This `true` started as the task went down (ABORTED,
                # RUNTIME_REPLACED): harmless to run again.
                continue

            def fail(e=e):
                raise e
            unreachable = expect_error("exec in a stopped sandbox", fail, grpc.StatusCode.UNAVAILABLE, "SANDBOX_UNREACHABLE")
            break
    assert unreachable is not None and unreachable.unreachable is not None, "no SANDBOX_UNREACHABLE"
    u = unreachable.unreachable
    print(f"SANDBOX_UNREACHABLE: cause {errors_pb2.UnreachableCause.Name(u.cause)}, {errors_pb2.Admitted.Name(u.admitted)}")


def replaced():
    # 7. RuntimeReplaced: a sandbox deleted under a running exec.
    sid = b.sandboxes.CreateSandbox(sandbox_pb2.CreateSandboxRequest(image=IMAGE), metadata=b.metadata, timeout=TIMEOUT).sandbox.id

    def delete_at_start(ev, send):
        if ev.WhichOneof("event") == "started":
            b.sandboxes.DeleteSandbox(sandbox_pb2.DeleteSandboxRequest(sandbox_id=sid), metadata=b.metadata, timeout=TIMEOUT)

    d = expect_error("exec in a deleted sandbox", lambda: exec_stream(start(sid, argv=["sleep", "60"]), delete_at_start),
                     grpc.StatusCode.ABORTED, "RUNTIME_REPLACED")
    assert d.runtime_replaced is not None
    print(f"RUNTIME_REPLACED: cause {errors_pb2.ReplacedCause.Name(d.runtime_replaced.cause)}, exec {d.runtime_replaced.exec_id}")


def main():
    # 1. A sandbox.
    sb = b.sandboxes.CreateSandbox(sandbox_pb2.CreateSandboxRequest(image=IMAGE), metadata=b.metadata, timeout=TIMEOUT).sandbox
    print(f"created sandbox {sb.id}")
    try:
        steps(sb.id, sb.runtime.agent_boot_id)
    finally:
        try:
            b.sandboxes.DeleteSandbox(sandbox_pb2.DeleteSandboxRequest(sandbox_id=sb.id), metadata=b.metadata, timeout=TIMEOUT)
        except grpc.RpcError:
            pass
    replaced()
    print("python example: ok")
    b.close()


if __name__ == "__main__":
    main()
