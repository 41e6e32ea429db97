"""Unit tests of the SDK's argument checks: no berthd needed. A timeout or
other numeric argument of the wrong type, negative, NaN, infinite or too
large raises InvalidArgument naming the parameter before anything is
sent."""

import math
from fractions import Fraction
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import berth  # noqa: E402
from berth._commands import Commands  # noqa: E402
from berth._contexts import CodeContext  # noqa: E402
from berth._files import Files  # noqa: E402
from berth._ports import Ports  # noqa: E402
from berth._sessions import Session  # noqa: E402
from berth.v1 import context_pb2, session_pb2  # noqa: E402


class Unsent:
    """A connection whose every call fails the test: nothing may be sent."""

    metadata = ()

    def __getattr__(self, name):
        if name in ("sandboxes", "files"):
            return self

        def sent(*a, **kw):
            raise AssertionError(f"{name} was called: the request was sent")
        return sent


conn = Unsent()
files = Files(conn, "sb-1")
commands = Commands(conn, "sb-1")
session = Session(conn, "sb-1", commands, session_pb2.SessionInfo(session_id="s-1"))
context = CodeContext(conn, "sb-1", context_pb2.CodeContextInfo(context_id="c-1"))
ports = Ports(conn, "sb-1")
volumes = berth.Volumes(connection=conn)
create = berth.Sandbox.create

CASES = [
    ("commands.run timeout str", "timeout", lambda: commands.run("true", timeout="5")),
    ("commands.run timeout -1", "timeout", lambda: commands.run("true", timeout=-1)),
    ("commands.run timeout nan", "timeout", lambda: commands.run("true", timeout=math.nan)),
    ("commands.run timeout inf", "timeout", lambda: commands.run("true", timeout=math.inf)),
    ("commands.run user -1", "user", lambda: commands.run("true", user=-1)),
    ("commands.start timeout nan", "timeout", lambda: commands.start("true", timeout=math.nan)),
    ("commands.connect since_seq -1", "since_seq", lambda: commands.connect("e-1", since_seq=-1)),
    ("session.run timeout str", "timeout", lambda: session.run("true", timeout="1")),
    ("context.run_code timeout -2", "timeout", lambda: context.run_code("1", timeout=-2)),
    ("Sandbox.create timeout str", "timeout", lambda: create(connection=conn, timeout="60")),
    ("Sandbox.create idle_timeout nan", "idle_timeout", lambda: create(connection=conn, idle_timeout=math.nan)),
    ("Sandbox.create max_lifetime -1", "max_lifetime", lambda: create(connection=conn, max_lifetime=-1)),
    ("Sandbox.create memory_bytes -1", "memory_bytes", lambda: create(connection=conn, memory_bytes=-1)),
    ("Sandbox.create cpu_millis 1.5", "cpu_millis", lambda: create(connection=conn, cpu_millis=1.5)),
    ("Sandbox.create disk_bytes 2**64", "disk_bytes", lambda: create(connection=conn, disk_bytes=2 ** 64)),
    ("Sandbox.create user (1000, -1)", "user", lambda: create(connection=conn, user=(1000, -1))),
    ("files.list depth -1", "depth", lambda: files.list("/", depth=-1)),
    ("files.list depth str", "depth", lambda: files.list("/", depth="2")),
    ("files.read offset -1", "offset", lambda: files.read("/f", offset=-1)),
    ("files.read limit nan", "limit", lambda: files.read("/f", limit=math.nan)),
    ("files.write mode '0755'", "mode", lambda: files.write("/f", b"x", mode="0755")),
    ("files.write mode 0o10000", "mode", lambda: files.write("/f", b"x", mode=0o10000)),
    ("files.make_dir mode -1", "mode", lambda: files.make_dir("/d", mode=-1)),
    ("files.watch since_seq -1", "since_seq", lambda: files.watch("/d", since_seq=-1)),
    ("files.watch buffer_events 2**32", "buffer_events", lambda: files.watch("/d", buffer_events=2 ** 32)),
    ("volumes.create quota_bytes -1", "quota_bytes", lambda: volumes.create("v", quota_bytes=-1)),
    ("ports.forward port 0", "port", lambda: ports.forward(0)),
    ("ports.forward local_port 70000", "local_port", lambda: ports.forward(80, local_port=70000)),
]


class ArgsTest(unittest.TestCase):
    def test_bad_numbers_raise_invalid_argument_naming_the_parameter(self):
        for name, field, call in CASES:
            with self.subTest(name):
                with self.assertRaises(berth.InvalidArgument) as cm:
                    call()
                e = cm.exception
                self.assertEqual([f for f, _ in e.field_violations], [field])
                self.assertRegex(str(e), rf"\b{field}\b")
                self.assertEqual(e.code.name, "INVALID_ARGUMENT")

    def test_good_numbers_pass(self):
        from berth._errors import duration
        self.assertEqual(duration(1.5).ToNanoseconds(), 1_500_000_000)
        self.assertEqual(duration(2).seconds, 2)
        self.assertEqual(duration(Fraction(1, 4)).ToNanoseconds(), 250_000_000)


if __name__ == "__main__":
    unittest.main()
