"""Unit tests of files.list without berthd: a ListDir stream made of
berthd's own messages. A subdirectory that could not be listed, or a
stream that fails midway, raises an error that carries the entries
received (e.entries), as the Go client's Files.List returns its entries
with the error."""

import os
import sys
import unittest

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import berth  # noqa: E402
from berth._files import Files  # noqa: E402
from berth.v1 import file_pb2  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_errors import FakeRpcError  # noqa: E402


def entry(path):
    return file_pb2.FileInfo(display_name=os.path.basename(path), display_path=path, type=file_pb2.FILE_TYPE_REGULAR)


class Streams:
    """A connection whose ListDir yields the messages given, then raises
    the error given (if any)."""

    metadata = ()

    def __init__(self, msgs, err=None):
        self.files = self
        self._msgs, self._err = msgs, err

    def ListDir(self, req, metadata=None):
        def gen():
            yield from self._msgs
            if self._err is not None:
                raise self._err
        return gen()


class ListTest(unittest.TestCase):
    def test_complete(self):
        files = Files(Streams([file_pb2.ListDirResponse(entries=[entry("/d/a"), entry("/d/b")])]), "sb-1")
        self.assertEqual([i.path for i in files.list("/d", depth=2)], ["/d/a", "/d/b"])

    def test_unreadable_subdirectory_keeps_all_entries(self):
        msgs = [
            file_pb2.ListDirResponse(entries=[entry("/d/a"), entry("/d/locked")],
                                     errors=[file_pb2.ListDirError(display_path="/d/locked", reason="PERMISSION_DENIED",
                                                                   message="open: permission denied")]),
            file_pb2.ListDirResponse(entries=[entry("/d/z")]),
        ]
        files = Files(Streams(msgs), "sb-1")
        with self.assertRaises(berth.BerthError) as cm:
            files.list("/d", depth=2)
        e = cm.exception
        self.assertEqual((e.reason, e.metadata["path"]), ("PERMISSION_DENIED", "/d/locked"))
        # The listing went on past the unreadable directory: nothing is lost.
        self.assertEqual([i.path for i in e.entries], ["/d/a", "/d/locked", "/d/z"])

    def test_stream_failing_midway_keeps_entries_received(self):
        err = FakeRpcError(grpc.StatusCode.PERMISSION_DENIED, "denied", reason="PERMISSION_DENIED", metadata={"path": "/d/x"})
        files = Files(Streams([file_pb2.ListDirResponse(entries=[entry("/d/a")])], err), "sb-1")
        with self.assertRaises(berth.FilePermissionDenied) as cm:
            files.list("/d", depth=2)
        self.assertEqual([i.path for i in cm.exception.entries], ["/d/a"])


if __name__ == "__main__":
    unittest.main()
