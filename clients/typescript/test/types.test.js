// Unit tests of the TypeScript SDK's own types (no berthd): sessions,
// volumes and file watches resolve to plain, JSON-serialisable data with
// numbers and ISO 8601 times, as sandboxes and commands do, never the
// generated messages with their bigint fields.
"use strict";

const { test } = require("node:test");
const assert = require("node:assert/strict");
const berth = require("..");
const { Sessions } = require("../dist/sdk/sessions");
const { FileWatch, watchRequest } = require("../dist/sdk/watch");

const created = new Date("2026-01-02T03:04:05Z");

// plain asserts v has no bigint anywhere and survives JSON unchanged.
function plain(v) {
  assert.deepEqual(JSON.parse(JSON.stringify(v)), v, "the value is plain JSON");
}

test("sessions.create and sessions.list give SessionInfo with numbers", async () => {
  const pb = berth.session.SessionInfo.fromPartial({
    sessionId: "s-1", name: "n", owner: "o", shell: berth.exec.Shell.SHELL_BASH, state: berth.session.SessionState.SESSION_STATE_IDLE,
    pid: 42n, createdAt: created, commands: 3n, user: "1000",
  });
  const conn = { sandboxes: {}, call: async (_c, method) => (method === "createSession" ? { session: pb } : { sessions: [pb] }) };
  const sessions = new Sessions(conn, "sb-1", {});
  const s = await sessions.create();
  const want = {
    sessionId: "s-1", name: "n", owner: "o", shell: "bash", state: "idle", pid: 42, createdAt: created.toISOString(), currentExecId: "",
    commands: 3, exitCode: null, user: "1000",
  };
  assert.deepEqual(s.info, want);
  plain(s.info);
  const list = await sessions.list();
  assert.deepEqual(list, [want]);
  plain(list);
});

test("volumes give VolumeInfo with numbers", async () => {
  const pb = berth.volume.Volume.fromPartial({ name: "data", owner: "o", created, quotaBytes: 4n << 20n, usedBytes: 4096n, sandboxIds: ["a"] });
  const conn = {
    sandboxes: {}, call: async () => ({ volume: pb }),
    unary: async (_c, method) => (method === "listVolumes" ? { volumes: [pb] } : { volume: pb }),
  };
  const vols = new berth.Volumes({ connection: conn });
  const want = { name: "data", owner: "o", created: created.toISOString(), quotaBytes: 4 << 20, usedBytes: 4096, sandboxIds: ["a"] };
  for (const got of [await vols.create("data", { quotaBytes: 4 << 20 }), await vols.get("data"), ...(await vols.list())]) {
    assert.deepEqual(got, want);
    plain(got);
  }
});

test("files.watch yields FileEvent and overflow notes with numbers", async () => {
  const msgs = [
    { event: { $case: "started", value: { watchId: "w-1", path: "/d", lastSeq: 5n } } },
    { event: { $case: "file", value: berth.watch.FileEvent.fromPartial({ seq: 6n, kind: berth.watch.FileEventKind.FILE_EVENT_KIND_RENAME, path: "/d/b", oldPath: "/d/a" }) } },
    { event: { $case: "overflow", value: berth.watch.FileWatchOverflow.fromPartial({ reason: berth.watch.FileWatchOverflowReason.FILE_WATCH_OVERFLOW_REASON_RING, firstSeq: 7n, lastSeq: 9n }) } },
  ];
  const call = {
    cancel() {},
    async *[Symbol.asyncIterator]() {
      yield* msgs;
    },
  };
  const conn = { sandboxes: { watchFiles: () => call }, metadata: () => undefined };
  const w = await FileWatch.open(conn, watchRequest("sb-1", "/d", {}));
  assert.equal(w.lastSeq, 5);
  const evs = await w.next(2);
  assert.deepEqual(evs, [
    { kind: "file", event: { seq: 6, kind: "rename", path: "/d/b", oldPath: "/d/a", isDir: false } },
    { kind: "overflow", overflow: { reason: "ring", seq: 0, firstSeq: 7, lastSeq: 9, path: "" } },
  ]);
  plain(evs);
  assert.equal(w.lastSeq, 6);
});
