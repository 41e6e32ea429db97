"""End-to-end tests of berth's Python SDK against a real berthd (and a real
containerd): integration/python_sdk_test.go starts one and runs

    BERTH_ADDR=unix:///... BERTH_IMAGE=berth.dev/base:latest \\
        /usr/bin/python3 -m unittest discover -v -s clients/python/tests

Without BERTH_ADDR the tests skip, unless BERTH_E2E=1 (CI), where they fail.
BERTH_PYTHON_SDK_WHEEL_DIR, when set, is where test_wheel_installs_in_a_venv
builds the wheel (else a temporary directory)."""

import hashlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import berth  # noqa: E402
from berth.v1 import context_pb2, exec_pb2, image_pb2, sandbox_pb2, watch_pb2  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
ADDR = os.environ.get("BERTH_ADDR")


def setUpModule():
    if not ADDR:
        if os.environ.get("BERTH_E2E") == "1":
            raise AssertionError("BERTH_E2E=1 but BERTH_ADDR is not set: the SDK tests need a berthd")
        raise unittest.SkipTest("BERTH_ADDR is not set: no berthd to test against")


def poll(cond, what, timeout=30.0):
    """Polls cond() until it returns a true value, failing after timeout s."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.05)


class SDKTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.conn = berth.Connection()
        cls.sb = berth.Sandbox.create(user="1000:1000", env={"PROJECT": "demo"}, connection=cls.conn)

    @classmethod
    def tearDownClass(cls):
        cls.sb.kill()
        cls.conn.close()

    def test_bot_loop(self):
        """The loop of an AI coding bot: upload a project with a failing
        test, run the tests streaming output, read a file, write a fix,
        re-run, meet a typed error, and a timeout that stops the command."""
        sb = self.sb
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "calc.sh"), "w") as f:
                f.write("echo $((2 + 3))\n")
            with open(os.path.join(d, "test.sh"), "w") as f:
                f.write('out=$(sh calc.sh); echo "calc says $out"; [ "$out" = 4 ] || { echo "FAIL: want 4" >&2; exit 1; }; echo PASS\n')
            os.chmod(os.path.join(d, "test.sh"), 0o755)
            up = sb.files.upload_dir(d, "/workspace/project")
        self.assertEqual(up.files, 2)
        self.assertEqual(sb.files.stat("/workspace/project/calc.sh").uid, 1000)

        out, err = [], []  # two pipes: their order relative to each other is not kept
        r = sb.commands.run("./test.sh", cwd="/workspace/project", on_stdout=out.append, on_stderr=err.append, timeout=60)
        self.assertEqual((r.exit_code, r.stdout, r.stderr), (1, b"calc says 5\n", b"FAIL: want 4\n"))
        self.assertEqual((b"".join(out), b"".join(err)), (r.stdout, r.stderr))
        self.assertEqual(sb.files.read_text("/workspace/project/calc.sh"), "echo $((2 + 3))\n")
        sb.files.write("/workspace/project/calc.sh", "echo $((2 + 2))\n")
        r = sb.commands.run(["sh", "-c", "./test.sh && id -u && echo $PROJECT"], cwd="/workspace/project")
        self.assertEqual((r.exit_code, r.stdout), (0, b"calc says 4\nPASS\n1000\ndemo\n"))

        with self.assertRaises(berth.FileNotFound) as cm:
            sb.files.read("/workspace/project/missing.txt")
        self.assertEqual(cm.exception.reason, "FILE_NOT_FOUND")
        self.assertEqual(cm.exception.metadata["path"], "/workspace/project/missing.txt")
        with self.assertRaises(berth.SandboxNotFound):
            berth.Sandbox.connect("no-such-sandbox", connection=self.conn)
        with self.assertRaises(berth.InvalidArgument) as cm:
            sb.commands.run("true", timeout=0.5)  # below the server's 1 s bound
        self.assertEqual(cm.exception.field_violations[0][0], "start.process.timeout")

        start = time.monotonic()
        r = sb.commands.run("echo started; sleep 30; echo late", timeout=1)
        self.assertTrue(r.timed_out, r)
        self.assertEqual(r.stdout, b"started\n")
        self.assertNotEqual(r.exit_code, 0)
        self.assertLess(time.monotonic() - start, 20)
        # The command really stopped: no sleep is left in the sandbox.
        ps = sb.commands.run("ps -o args | grep -c '^sleep 30' || true")
        self.assertEqual(ps.stdout, b"0\n")
        info = [e for e in sb.commands.list() if e.exec_id == r.exec_id]
        self.assertEqual(len(info), 1)
        self.assertEqual(info[0].state, exec_pb2.EXEC_STATE_EXITED)
        self.assertTrue(info[0].result.timed_out)

    def test_user_by_name(self):
        """commands.run(user=) takes a name from the sandbox's /etc/passwd,
        as ProcessSpec.user does."""
        r = self.sb.commands.run("id -u", user="root")
        self.assertEqual(r.stdout, b"0\n")

    def test_streamed_64mib_slow_consumer(self):
        """64 MiB of stdout to a consumer slower than the command: every byte
        arrives, in order, none dropped."""
        total = 64 << 20
        line = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ\n"
        want = hashlib.sha256((line * (total // len(line) + 1))[:total]).hexdigest()
        h, n, calls = hashlib.sha256(), [0], [0]

        def slow(chunk):
            h.update(chunk)
            n[0] += len(chunk)
            calls[0] += 1
            if calls[0] % 8 == 0:
                time.sleep(0.01)  # the slow consumer this test is about
        r = self.sb.commands.run(f"yes {line[:-1].decode()} | head -c {total}", on_stdout=slow, capture=False, timeout=600)
        self.assertEqual(r.exit_code, 0)
        self.assertEqual((n[0], r.stdout_bytes, r.dropped_bytes), (total, total, 0))
        self.assertEqual(h.hexdigest(), want)

    def test_upload_download_dir_keeps_symlinks_and_modes(self):
        sb = self.sb
        with tempfile.TemporaryDirectory() as src, tempfile.TemporaryDirectory() as dst:
            os.makedirs(os.path.join(src, "a", "deep"))
            os.makedirs(os.path.join(src, "empty"))
            files = {"a/data.txt": (b"data\n", 0o640), "a/run.sh": (b"#!/bin/sh\necho run\n", 0o755),
                     "a/deep/x": (b"x" * 100000, 0o600)}
            for name, (content, mode) in files.items():
                p = os.path.join(src, name)
                with open(p, "wb") as f:
                    f.write(content)
                os.chmod(p, mode)
            os.chmod(os.path.join(src, "a", "deep"), 0o750)
            os.symlink("a/data.txt", os.path.join(src, "rel"))
            os.symlink("/etc/hostname", os.path.join(src, "abs"))
            os.symlink("missing", os.path.join(src, "a", "dangling"))

            sb.files.upload_dir(src, "/workspace/tree")
            self.assertEqual(sb.files.stat("/workspace/tree/rel").symlink_target, "a/data.txt")
            self.assertEqual(sb.files.stat("/workspace/tree/abs").symlink_target, "/etc/hostname")
            self.assertEqual(sb.files.stat("/workspace/tree/a/run.sh").mode, 0o755)
            self.assertEqual(sb.files.stat("/workspace/tree/a/deep").mode, 0o750)
            self.assertEqual(sb.commands.run("./a/run.sh", cwd="/workspace/tree").stdout, b"run\n")
            names = sorted(i.path for i in sb.files.list("/workspace/tree", depth=3))
            self.assertEqual(names, ["/workspace/tree/" + n for n in
                                     ["a", "a/dangling", "a/data.txt", "a/deep", "a/deep/x", "a/run.sh", "abs", "empty", "rel"]])

            sb.files.download_dir("/workspace/tree", dst)
            for name, (content, mode) in files.items():
                p = os.path.join(dst, name)
                with open(p, "rb") as f:
                    self.assertEqual(f.read(), content, name)
                self.assertEqual(os.stat(p).st_mode & 0o7777, mode, name)
            self.assertEqual(os.stat(os.path.join(dst, "a", "deep")).st_mode & 0o7777, 0o750)
            self.assertEqual(os.readlink(os.path.join(dst, "rel")), "a/data.txt")
            self.assertEqual(os.readlink(os.path.join(dst, "abs")), "/etc/hostname")
            self.assertEqual(os.readlink(os.path.join(dst, "a", "dangling")), "missing")
            self.assertTrue(os.path.isdir(os.path.join(dst, "empty")))

    def test_files_calls(self):
        sb = self.sb
        big = os.urandom(5 << 20)
        info = sb.files.write("/workspace/f/big.bin", iter([big[:3 << 20], big[3 << 20:]]), mode=0o600)
        self.assertEqual((info.size, info.mode, info.type), (len(big), 0o600, "file"))
        self.assertEqual(b"".join(sb.files.read_stream("/workspace/f/big.bin")), big)
        self.assertEqual(sb.files.read("/workspace/f/big.bin", offset=10, limit=5), big[10:15])
        sb.files.make_dir("/workspace/f/sub/dir")
        self.assertTrue(sb.files.stat("/workspace/f/sub/dir").is_dir)
        sb.files.rename("/workspace/f/big.bin", "/workspace/f/sub/moved.bin")
        self.assertFalse(sb.files.exists("/workspace/f/big.bin"))
        with self.assertRaises(berth.FileExists):
            sb.files.make_dir("/workspace/f/sub", parents=False)
        sb.files.remove("/workspace/f", recursive=True)
        self.assertFalse(sb.files.exists("/workspace/f"))

    def test_session(self):
        s = self.sb.sessions.create(shell="bash", name="py")
        try:
            self.assertEqual(s.run("cd /tmp; export A=1; f() { echo $A; }").exit_code, 0)
            r = s.run("pwd; f")
            self.assertEqual((r.stdout, r.exit_code), (b"/tmp\n1\n", 0))
            self.assertEqual(s.run("false").exit_code, 1)
            slow = s.run("sleep 100", timeout=1)
            self.assertTrue(slow.timed_out)
            self.assertEqual(slow.exit_code, 130)
            self.assertEqual(s.run("echo $A").stdout, b"1\n")
            self.assertIn(s.id, [i.session_id for i in self.sb.sessions.list()])
        finally:
            s.delete()
        self.assertNotIn(s.id, [i.session_id for i in self.sb.sessions.list()])

    def test_watch(self):
        """files.watch sees 20 creations exactly once each across a
        reconnect that resumes from the last seq."""
        sb = self.sb
        sb.files.make_dir("/workspace/watched")
        w = sb.files.watch("/workspace/watched", include=["f-*"])
        seen = []
        try:
            self.assertEqual(sb.commands.run("cd /workspace/watched && for i in $(seq 1 20); do : > f-$i; done").exit_code, 0)
            for ev in w.next_events(10):
                self.assertIsInstance(ev, watch_pb2.FileEvent)
                seen.append(ev.path)
        finally:
            w.close()
        with sb.files.watch("/workspace/watched", watch_id=w.watch_id, since_seq=w.last_seq) as again:
            self.assertEqual(again.watch_id, w.watch_id)
            seen += [ev.path for ev in again.next_events(10)]
        self.assertEqual(sorted(seen), sorted(f"/workspace/watched/f-{i}" for i in range(1, 21)))

    def test_volume(self):
        """A volume written by one sandbox is read by another mounting it
        read-only, outlives both, refuses deletion while mounted and lists
        its usage."""
        vols = berth.Volumes(self.conn)
        name = "py-" + os.urandom(4).hex()
        v = vols.create(name, quota_bytes=4 << 20)
        try:
            self.assertEqual((v.name, v.quota_bytes), (name, 4 << 20))
            with berth.Sandbox.create(user="1000:1000", volumes=[(name, "/data")], connection=self.conn) as a:
                self.assertEqual(a.commands.run("echo hi > /data/f").exit_code, 0)
                with berth.Sandbox.create(volumes=[f"{name}:/ro:ro"], connection=self.conn) as b:
                    self.assertEqual(b.commands.run("cat /ro/f").stdout, b"hi\n")
                    self.assertNotEqual(b.commands.run("echo x > /ro/g").exit_code, 0)
                    self.assertEqual(sorted(vols.get(name).sandbox_ids), sorted([a.id, b.id]))
                    with self.assertRaises(berth.BerthError) as cm:
                        vols.delete(name)
                    self.assertEqual(cm.exception.reason, "VOLUME_IN_USE")
            self.assertIn(name, [x.name for x in vols.list()])
            self.assertGreater(vols.get(name).used_bytes, 0)
        finally:
            vols.delete(name)
        with self.assertRaises(berth.BerthError) as cm:
            vols.get(name)
        self.assertEqual(cm.exception.reason, "VOLUME_NOT_FOUND")
    def test_state(self):
        """Pause, resume, snapshot, create from the snapshot, fork (and
        again by request id), commit and hibernate through the SDK, each
        seen in the sandbox's record and its files (docs/state.md)."""
        S = sandbox_pb2
        snaps = berth.Snapshots(self.conn)
        with berth.Sandbox.create(idle_action="pause", labels={"who": "py"}, connection=self.conn) as sb:
            self.assertEqual(sb.info.idle_action, S.IDLE_ACTION_PAUSE)
            sb.files.write("/workspace/f", "one")
            sb.pause()
            self.assertEqual((sb.info.state, sb.refresh().state), (S.SANDBOX_STATE_PAUSED, S.SANDBOX_STATE_PAUSED))
            sb.resume()
            self.assertEqual(sb.info.state, S.SANDBOX_STATE_RUNNING)
            sb.pause()
            # Through a no_resume connection a call that needs the agent
            # is refused and the sandbox stays paused.
            with berth.Connection(no_resume=True) as peek:
                p = berth.Sandbox.connect(sb.id, connection=peek)
                with self.assertRaises(berth.BerthError) as cm:
                    p.commands.run("true")
                self.assertEqual((cm.exception.code.name, cm.exception.reason), ("FAILED_PRECONDITION", "SANDBOX_PAUSED"))
                with self.assertRaises(berth.BerthError) as cm:
                    p.files.read("/workspace/f")
                self.assertEqual(cm.exception.reason, "SANDBOX_PAUSED")
                self.assertEqual(p.refresh().state, S.SANDBOX_STATE_PAUSED)
            # Leaving the with block closed the connection, not the sandbox.
            with self.assertRaises(ValueError):
                peek.channel.unary_unary("/x")(b"")
            # A command on a paused sandbox resumes it first.
            self.assertEqual(sb.commands.run("cat /workspace/f").stdout, b"one")
            self.assertEqual(sb.refresh().state, S.SANDBOX_STATE_RUNNING)

            snap = sb.snapshot(labels={"step": "one"})
            self.assertTrue(snap.id.startswith("snap-"), snap.id)
            self.assertEqual((snap.sandbox_id, dict(snap.labels)), (sb.id, {"step": "one"}))
            self.assertIn(snap.id, [x.id for x in snaps.list()])
            sb.files.write("/workspace/f", "two")

            with self.assertRaises(berth.InvalidArgument) as cm:
                sb.fork(0)
            self.assertEqual(cm.exception.field_violations[0][0], "count")
            kids = sb.fork(2, labels={"kid": "yes"})
            try:
                self.assertEqual(len({k.id for k in kids} | {sb.id}), 3)
                for k in kids:
                    self.assertEqual(dict(k.info.labels), {"who": "py", "kid": "yes"})
                    self.assertEqual(k.files.read_text("/workspace/f"), "two")
                kids[0].files.write("/workspace/f", "three")
                self.assertEqual([k.files.read_text("/workspace/f") for k in kids], ["three", "two"])
                self.assertEqual(sb.files.read_text("/workspace/f"), "two")
            finally:
                for k in kids:
                    k.kill()
            rid = "py-" + os.urandom(4).hex()
            first = sb.fork(1, request_id=rid)
            try:
                self.assertEqual([k.id for k in sb.fork(1, request_id=rid)], [first[0].id])
                with self.assertRaises(berth.BerthError) as cm:
                    sb.fork(2, request_id=rid)
                self.assertEqual(cm.exception.reason, "SANDBOX_EXISTS")
            finally:
                first[0].kill()

            with berth.Sandbox.create(from_snapshot=snap.id, connection=self.conn) as again:
                self.assertEqual(again.files.read_text("/workspace/f"), "one")
                with self.assertRaises(berth.BerthError) as cm:
                    snaps.delete(snap.id)
                self.assertEqual(cm.exception.reason, "SNAPSHOT_IN_USE")
            ref = "py-sdk/commit:" + os.urandom(4).hex()
            img = snaps.commit(snap.id, ref, env=["STEP=one"])
            try:
                self.assertEqual(img.name, ref)
                with berth.Sandbox.create(image=ref, connection=self.conn) as c:
                    self.assertEqual(c.commands.run("echo $STEP; cat /workspace/f").stdout, b"one\none")
            finally:
                self.conn.unary(self.conn.images.DeleteImage, image_pb2.DeleteImageRequest(name=ref))
            snaps.delete(snap.id)
            self.assertNotIn(snap.id, [x.id for x in snaps.list()])
            with self.assertRaises(berth.BerthError) as cm:
                snaps.delete(snap.id)
            self.assertEqual(cm.exception.reason, "SNAPSHOT_NOT_FOUND")

            # runc: the processes end, the files stay; the next call wakes it.
            self.assertEqual(sb.hibernate(), "processes_ended")
            self.assertEqual(sb.info.state, S.SANDBOX_STATE_HIBERNATED)
            self.assertEqual(sb.commands.run("cat /workspace/f").stdout, b"two")
            self.assertEqual(sb.refresh().state, S.SANDBOX_STATE_RUNNING)
        with self.assertRaises(berth.InvalidArgument) as cm:
            berth.Sandbox.create(idle_action="sleep", connection=self.conn)
        self.assertEqual(cm.exception.field_violations[0][0], "idle_action")

    def test_code_context(self):
        # The base image has no python3: a typed error, and nothing listed.
        with self.assertRaises(berth.BerthError) as cm:
            self.sb.contexts.create()
        self.assertEqual((cm.exception.reason, cm.exception.metadata.get("language")), ("INTERPRETER_MISSING", "python"))
        self.assertEqual(self.sb.contexts.list(), [])
        with self.assertRaises(berth.BerthError) as cm:
            berth.CodeContext(self.sb._conn, self.sb.id, context_pb2.CodeContextInfo(context_id="none")).run_code("1")
        self.assertEqual(cm.exception.reason, "CONTEXT_NOT_FOUND")

    def test_background_commands(self):
        sb = self.sb
        h = sb.commands.run("echo one; read x; echo got $x; echo err >&2", background=True, stdin=True)
        poll(lambda: h.stdout == b"one\n", "first line")
        h.send_stdin("hello\n")
        h.close_stdin()
        r = h.wait(60)
        self.assertEqual((r.exit_code, r.stdout, r.stderr), (0, b"one\ngot hello\n", b"err\n"))
        # Reattached later, by id: the retained output is replayed.
        again = sb.commands.connect(h.exec_id).wait(60)
        self.assertEqual(again.stdout, b"one\ngot hello\n")
        tail = sb.commands.connect(h.exec_id, since_seq=1).wait(60)
        self.assertEqual(tail.stdout + tail.stderr, b"got hello\nerr\n")

        # A background command's timeout stops it too, with no stream attached.
        bounded = sb.commands.start("sleep 30", timeout=1)
        bounded.disconnect()
        r = sb.commands.connect(bounded.exec_id).wait(30)
        self.assertTrue(r.timed_out, r)

        long = sb.commands.start(["sleep", "300"])
        long.disconnect()  # it runs on without a stream
        self.assertTrue(sb.commands.kill(long.exec_id, "KILL"))
        r = sb.commands.connect(long.exec_id).wait(60)
        self.assertEqual(r.signal, "SIGKILL")

    def test_port_forward(self):
        sb = self.sb
        sb.files.write("/workspace/www/index.html", "hello through the forward\n")
        httpd = sb.commands.start(["httpd", "-f", "-p", "8080", "-h", "/workspace/www"])
        try:
            with sb.ports.forward(8080) as fwd:
                def get():
                    try:
                        with urllib.request.urlopen(f"http://{fwd.address}/index.html", timeout=10) as resp:
                            return resp.read()
                    except OSError:
                        return None
                self.assertEqual(poll(get, "httpd answering through the forward"), b"hello through the forward\n")
            with sb.ports.forward(9) as closed:
                s = socket.create_connection((closed.host, closed.port), timeout=10)
                self.assertEqual(s.recv(1), b"")  # closed by the relay
                s.close()
                poll(lambda: closed.last_error is not None, "the forward's error")
                self.assertIsInstance(closed.last_error, berth.PortClosed)
        finally:
            httpd.kill()

    def test_context_manager_deletes(self):
        with berth.Sandbox.create(connection=self.conn) as sb:
            sid = sb.id
            self.assertEqual(sb.commands.run("echo in").stdout, b"in\n")
        with self.assertRaises(berth.SandboxNotFound):
            berth.Sandbox.connect(sid, connection=self.conn)

    def test_wheel_installs_in_a_venv(self):
        """The wheel built by scripts/python-sdk.sh installs into a fresh venv
        (Debian's grpcio and protobuf through --system-site-packages) and is
        what `import berth` finds there."""
        with tempfile.TemporaryDirectory() as tmp:
            out = os.environ.get("BERTH_PYTHON_SDK_WHEEL_DIR") or os.path.join(tmp, "dist")
            subprocess.run([os.path.join(REPO, "scripts", "python-sdk.sh"), out], check=True, capture_output=True)
            wheels = [f for f in os.listdir(out) if f.endswith(".whl")]
            self.assertEqual(len(wheels), 1, wheels)
            self.assertTrue([f for f in os.listdir(out) if f.endswith(".tar.gz")])
            venv = os.path.join(tmp, "venv")
            subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv], check=True)
            subprocess.run([os.path.join(venv, "bin", "pip"), "install", "-q", "--no-index", os.path.join(out, wheels[0])], check=True)
            code = ("import berth, sys; sb = berth.Sandbox.create(); r = sb.commands.run('echo from the wheel'); sb.kill(); "
                    "print(berth.__file__, berth.__version__, r.stdout.decode().strip(), sep='|')")
            p = subprocess.run([os.path.join(venv, "bin", "python"), "-c", code], check=True, capture_output=True, text=True, cwd=tmp)
            path, version, said = p.stdout.strip().split("|")
            self.assertTrue(path.startswith(venv), path)
            self.assertNotEqual(version, "0.0.0+dev")
            self.assertEqual(said, "from the wheel")
            self.assertTrue(os.path.exists(os.path.join(os.path.dirname(path), "py.typed")))


if __name__ == "__main__":
    unittest.main()
