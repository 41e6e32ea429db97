#!/usr/bin/python3
"""berth's Python SDK meeting each runtime condition: a command with stdin,
a file written by a command and read back, then FleetBusy (with its retry
delay), StaleHandle, Unreachable and RuntimeReplaced as typed exceptions.
It prints one line per step and exits 0 when every step saw what it should.

    BERTH_ADDR=unix:///run/berth/berthd.sock python3 examples/python/example.py

berthd must run with --max-execs-per-sandbox 1 --task-restart-limit 1 (for
FleetBusy and Unreachable) and have berth.dev/base:latest (or $BERTH_IMAGE).
The SDK is `pip install`ed (docs/clients.md) or found on PYTHONPATH as here.
The connection does not retry (retry=None), so that each condition reaches
this code; by default FleetBusy and Unreachable-before-start are retried.
"""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))

import berth  # noqa: E402
from berth.v1 import errors_pb2, sandbox_pb2  # noqa: E402

conn = berth.Connection(retry=None)


def restarted(sb, boot_id):
    """Polls until berthd runs the sandbox's new runtime; its boot id."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        info = sb.refresh()
        if info.state == sandbox_pb2.SANDBOX_STATE_RUNNING and info.runtime.agent_boot_id not in ("", boot_id):
            return info.runtime.agent_boot_id
        time.sleep(0.05)
    raise AssertionError(f"sandbox {sb.id} was not restarted within 10 s")


def stop_agent(sb):
    try:  # the workload stops the agent (PID 1): this command dies with it
        sb.commands.run(["kill", "-TERM", "1"])
    except berth.BerthError:
        pass


with berth.Sandbox.create(connection=conn) as sb:
    print(f"created sandbox {sb.id}")
    # A command fed on stdin.
    r = sb.commands.run(["sh", "-c", "cat; echo bye >&2; exit 3"], stdin=b"hello from python\n")
    assert (r.stdout, r.stderr, r.exit_code) == (b"hello from python\n", b"bye\n", 3), r
    print(f"exec {r.exec_id}: stdout {r.stdout!r}, exit {r.exit_code}")
    cat_id = r.exec_id
    # A file written by a command, read through the FileService.
    sb.commands.run("printf 'written in the sandbox' > /workspace/note.txt")
    content = sb.files.read("/workspace/note.txt")
    assert content == b"written in the sandbox", content
    print(f"read /workspace/note.txt: {content!r}")

    # FleetBusy: one command at a time per sandbox, and one runs.
    long = sb.commands.start(["sleep", "60"], exec_id="long")
    try:
        sb.commands.run(["true"])
        raise AssertionError("a second command ran")
    except berth.FleetBusy as e:
        assert e.code.name == "RESOURCE_EXHAUSTED" and berth.is_retryable(e)
        print(f"FLEET_BUSY: {e.detail.in_use} of {e.detail.limit} execs in use, retry after {e.retry_after}s")
    long.kill()
    long.wait(60)

    # StaleHandle: the agent restarts, and the first command's id belongs
    # to the old runtime.
    boot_id = sb.info.runtime.agent_boot_id
    stop_agent(sb)
    new_boot = restarted(sb, boot_id)
    try:
        sb.commands.connect(cat_id)
        raise AssertionError("attached to an exec of the old runtime")
    except berth.StaleHandle as e:
        assert e.detail.handle_runtime.agent_boot_id == boot_id
        print(f"STALE_HANDLE: exec {e.detail.exec_id} ran in runtime {boot_id[:8]}, now {new_boot[:8]}")

    # Unreachable: a second stop exceeds --task-restart-limit 1.
    stop_agent(sb)
    unreachable = None
    deadline = time.monotonic() + 10
    while unreachable is None and time.monotonic() < deadline:
        try:
            sb.commands.run(["true"])
            time.sleep(0.05)  # the task has not exited yet
        except berth.RuntimeReplaced:
            continue  # this `true` started as the task went down
        except berth.Unreachable as e:
            unreachable = e
    assert unreachable is not None, "no SANDBOX_UNREACHABLE"
    u = unreachable.detail
    print(f"SANDBOX_UNREACHABLE: cause {errors_pb2.UnreachableCause.Name(u.cause)}, {errors_pb2.Admitted.Name(u.admitted)}")

# RuntimeReplaced: the sandbox is deleted under a running command.
with berth.Sandbox.create(connection=conn) as sb:
    try:
        sb.commands.run("echo go; sleep 60", on_stdout=lambda _: sb.kill())
        raise AssertionError("the command outlived its sandbox")
    except berth.RuntimeReplaced as e:
        print(f"RUNTIME_REPLACED: cause {errors_pb2.ReplacedCause.Name(e.detail.cause)}, exec {e.detail.exec_id}")
conn.close()
print("python example: ok")
