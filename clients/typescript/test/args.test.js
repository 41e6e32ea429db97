// Unit tests of the TypeScript SDK's argument checks (no berthd): a numeric
// argument that is negative, NaN, infinite, fractional where a count is
// wanted, or too large, and a mode given as a string, reject with
// InvalidArgument naming the parameter before anything is sent.
"use strict";

const { test } = require("node:test");
const assert = require("node:assert/strict");
const berth = require("..");
const { Commands } = require("../dist/sdk/commands");
const { Files } = require("../dist/sdk/files");
const { Ports } = require("../dist/sdk/ports");
const { Session } = require("../dist/sdk/sessions");
const { CodeContext } = require("../dist/sdk/contexts");

// sent fails the test: nothing may reach berthd.
const sent = () => {
  throw new Error("the request was sent");
};
const conn = new Proxy({}, {
  get: (_t, k) => (k === "metadata" ? () => undefined : k === "sandboxes" || k === "files" ? new Proxy({}, { get: () => sent }) : sent),
});
const files = new Files(conn, "sb-1");
const commands = new Commands(conn, "sb-1");
const session = new Session(conn, "sb-1", commands, { sessionId: "s-1" });
const context = new CodeContext(conn, "sb-1", { contextId: "c-1" });
const ports = new Ports(conn, "sb-1");
const volumes = new berth.Volumes({ connection: conn });

const cases = [
  ["files.list depth -1", "depth", () => files.list("/", { depth: -1 })],
  ["files.list depth 1.5", "depth", () => files.list("/", { depth: 1.5 })],
  ["files.list depth NaN", "depth", () => files.list("/", { depth: NaN })],
  ["files.list depth 2^32", "depth", () => files.list("/", { depth: 2 ** 32 })],
  ["files.read offset -1", "offset", () => files.read("/f", { offset: -1 })],
  ["files.read limit NaN", "limit", () => files.read("/f", { limit: NaN })],
  ["files.write mode \"0755\"", "mode", () => files.write("/f", "x", { mode: "0755" })],
  ["files.write mode -1", "mode", () => files.write("/f", "x", { mode: -1 })],
  ["files.write mode 0o10000", "mode", () => files.write("/f", "x", { mode: 0o10000 })],
  ["files.makeDir mode \"755\"", "mode", () => files.makeDir("/d", { mode: "755" })],
  ["files.watch sinceSeq -1", "sinceSeq", () => files.watch("/d", { sinceSeq: -1 })],
  ["files.watch bufferEvents NaN", "bufferEvents", () => files.watch("/d", { bufferEvents: NaN })],
  ["commands.run timeout NaN", "timeout", () => commands.run("true", { timeout: NaN })],
  ["commands.run timeout -1", "timeout", () => commands.run("true", { timeout: -1 })],
  ["commands.run timeout Infinity", "timeout", () => commands.run("true", { timeout: Infinity })],
  ["commands.run timeout \"5\"", "timeout", () => commands.run("true", { timeout: "5" })],
  ["commands.run user -1", "user", () => commands.run("true", { user: -1 })],
  ["commands.start timeout NaN", "timeout", () => commands.start("true", { timeout: NaN })],
  ["commands.connect sinceSeq 0.5", "sinceSeq", () => commands.connect("e-1", { sinceSeq: 0.5 })],
  ["session.run timeout NaN", "timeout", () => session.run("true", { timeout: NaN })],
  ["context.runCode timeout -2", "timeout", () => context.runCode("1", { timeout: -2 })],
  ["Sandbox.create memoryBytes -1", "memoryBytes", () => berth.Sandbox.create({ connection: conn, memoryBytes: -1 })],
  ["Sandbox.create cpuMillis 1.5", "cpuMillis", () => berth.Sandbox.create({ connection: conn, cpuMillis: 1.5 })],
  ["Sandbox.create diskBytes 2^60", "diskBytes", () => berth.Sandbox.create({ connection: conn, diskBytes: 2 ** 60 })],
  ["Sandbox.create idleTimeout NaN", "idleTimeout", () => berth.Sandbox.create({ connection: conn, idleTimeout: NaN })],
  ["Sandbox.create maxLifetime -1", "maxLifetime", () => berth.Sandbox.create({ connection: conn, maxLifetime: -1 })],
  ["Sandbox.create timeout NaN", "timeout", () => berth.Sandbox.create({ connection: conn, timeout: NaN })],
  ["Sandbox.create user [1000, -1]", "user", () => berth.Sandbox.create({ connection: conn, user: [1000, -1] })],
  ["volumes.create quotaBytes -1", "quotaBytes", () => volumes.create("v", { quotaBytes: -1 })],
  ["ports.forward port 0", "port", () => ports.forward(0)],
  ["ports.forward localPort 70000", "localPort", () => ports.forward(80, { localPort: 70000 })],
];

for (const [name, field, call] of cases) {
  test(`${name} rejects with InvalidArgument naming ${field}`, async () => {
    await assert.rejects(async () => call(), (e) => {
      assert.ok(e instanceof berth.InvalidArgument, `${e?.name}: ${e?.message}`);
      assert.equal(e.codeName, "INVALID_ARGUMENT");
      assert.deepEqual(e.fieldViolations.map((v) => v.field), [field]);
      assert.match(e.message, new RegExp(`\\b${field}\\b`));
      return true;
    });
  });
}

test("a mode in octal as a number is sent as it is", async () => {
  let got;
  const c = { files: { makeDir: () => {} }, metadata: () => undefined, call: async (_c, _m, req) => ((got = req), { info: { displayName: "d", displayPath: "/d", mode: 0o755 } }) };
  await new Files(c, "sb-1").makeDir("/d", { mode: 0o755 });
  assert.equal(got.mode, 0o755);
});
