// Unit tests of files.list without berthd: a ListDir stream made of
// berthd's own messages. A subdirectory that could not be listed, or a
// stream that fails midway, rejects with an error that carries the entries
// received (e.entries), as the Go client's Files.List returns its entries
// with the error.
"use strict";

const { test } = require("node:test");
const assert = require("node:assert/strict");
const { Metadata, status } = require("@grpc/grpc-js");
const berth = require("..");
const { Files } = require("../dist/sdk/files");
const { Status } = require("../dist/gen/google/rpc/status");

const entry = (p) => berth.file.FileInfo.fromPartial({ displayName: p.slice(p.lastIndexOf("/") + 1), displayPath: p, type: berth.file.FileType.FILE_TYPE_REGULAR });

function files(msgs, err) {
  const call = {
    cancel() {},
    async *[Symbol.asyncIterator]() {
      yield* msgs;
      if (err) throw err;
    },
  };
  return new Files({ files: { listDir: () => call }, metadata: () => undefined }, "sb-1");
}

test("a complete listing", async () => {
  const got = await files([{ entries: [entry("/d/a"), entry("/d/b")], errors: [] }]).list("/d", { depth: 2 });
  assert.deepEqual(got.map((i) => i.path), ["/d/a", "/d/b"]);
});

test("an unreadable subdirectory keeps every entry listed", async () => {
  const msgs = [
    { entries: [entry("/d/a"), entry("/d/locked")], errors: [{ displayPath: "/d/locked", reason: "PERMISSION_DENIED", message: "open: permission denied" }] },
    { entries: [entry("/d/z")], errors: [] },
  ];
  await assert.rejects(files(msgs).list("/d", { depth: 2 }), (e) => {
    assert.ok(e instanceof berth.BerthError, String(e));
    assert.deepEqual([e.reason, e.metadata.path], ["PERMISSION_DENIED", "/d/locked"]);
    assert.deepEqual(e.entries.map((i) => i.path), ["/d/a", "/d/locked", "/d/z"]);
    return true;
  });
});

test("a stream failing midway keeps the entries received", async () => {
  const md = new Metadata();
  const info = berth.ErrorInfo.encode(berth.ErrorInfo.fromPartial({ reason: "PERMISSION_DENIED", domain: "berth.dev" })).finish();
  md.set("grpc-status-details-bin", Buffer.from(Status.encode(Status.fromPartial({
    code: status.PERMISSION_DENIED, message: "denied", details: [{ typeUrl: "type.googleapis.com/google.rpc.ErrorInfo", value: info }],
  })).finish()));
  const err = Object.assign(new Error("denied"), { code: status.PERMISSION_DENIED, details: "denied", metadata: md });
  await assert.rejects(files([{ entries: [entry("/d/a")], errors: [] }], err).list("/d", { depth: 2 }), (e) => {
    assert.ok(e instanceof berth.FilePermissionDenied, String(e));
    assert.deepEqual(e.entries.map((i) => i.path), ["/d/a"]);
    return true;
  });
});
