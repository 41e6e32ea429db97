// Unit tests of the TypeScript SDK's errors and retry policy (no berthd):
// a status's typed details choose the class, RetryInfo sets the wait, and
// only what ran nothing is retried, as in the Go client.
"use strict";

const { test } = require("node:test");
const assert = require("node:assert/strict");
const { Metadata, status } = require("@grpc/grpc-js");
const berth = require("..");
const { Status } = require("../dist/gen/google/rpc/status");

function serviceError(code, message, details) {
  const md = new Metadata();
  const any = details.map(([typeUrl, msg, value]) => ({ typeUrl: "type.googleapis.com/" + typeUrl, value: msg.encode(msg.fromPartial(value)).finish() }));
  md.set("grpc-status-details-bin", Buffer.from(Status.encode(Status.fromPartial({ code, message, details: any })).finish()));
  return Object.assign(new Error(message), { code, details: message, metadata: md });
}

const busy = (delaySec, resource = berth.errors.CapacityResource.CAPACITY_RESOURCE_SANDBOX_EXECS) => serviceError(status.RESOURCE_EXHAUSTED, "sandbox sb-1 runs 1 of 1 execs", [
  ["google.rpc.ErrorInfo", berth.ErrorInfo, { reason: "FLEET_BUSY", domain: "berth.dev", metadata: { sandbox_id: "sb-1" } }],
  ["google.rpc.RetryInfo", berth.RetryInfo, { retryDelay: { seconds: BigInt(Math.floor(delaySec)), nanos: Math.round((delaySec % 1) * 1e9) } }],
  ["berth.v1.FleetBusy", berth.errors.FleetBusy, { sandboxId: "sb-1", limit: 1n, inUse: 1n, resource }],
]);

test("a status's ErrorInfo reason chooses the class; details are decoded, JSON-serialisable", () => {
  const e = berth.fromServiceError(busy(0.25));
  assert.ok(e instanceof berth.FleetBusy && e instanceof berth.BerthError && e instanceof Error);
  assert.deepEqual([e.code, e.codeName, e.reason, e.metadata.sandbox_id, e.retryDelay, e.retryAfter], [8, "RESOURCE_EXHAUSTED", "FLEET_BUSY", "sb-1", 0.25, 0.25]);
  assert.deepEqual([e.detail.inUse, e.detail.limit, e.detail.resource], ["1", "1", "CAPACITY_RESOURCE_SANDBOX_EXECS"]);
  assert.equal(JSON.parse(JSON.stringify(e)).detail.resource, "CAPACITY_RESOURCE_SANDBOX_EXECS");
  assert.equal("entries" in JSON.parse(JSON.stringify(e)), false);
  // files.list's error carries the entries received before it; so does its JSON.
  const entry = { name: "a", path: "/w/a", type: "file", mode: 0o644, size: 3, uid: 0, gid: 0, modified: null, symlinkTarget: "" };
  e.entries = [entry];
  assert.deepEqual(JSON.parse(JSON.stringify(e)).entries, [entry]);
  assert.ok(berth.isRetryable(e));
  // Only a deletion frees disk, whatever delay an older berthd sent.
  for (const r of [berth.errors.CapacityResource.CAPACITY_RESOURCE_DISK, berth.errors.CapacityResource.CAPACITY_RESOURCE_PRINCIPAL_DISK]) {
    assert.equal(berth.isRetryable(berth.fromServiceError(busy(1, r))), false);
  }

  const bad = berth.fromServiceError(serviceError(status.INVALID_ARGUMENT, "timeout too short", [
    ["google.rpc.ErrorInfo", berth.ErrorInfo, { reason: "INVALID_ARGUMENT", domain: "berth.dev" }],
    ["google.rpc.BadRequest", berth.BadRequest, { fieldViolations: [{ field: "start.process.timeout", description: "below 1s" }] }],
  ]));
  assert.ok(bad instanceof berth.InvalidArgument);
  assert.deepEqual(bad.fieldViolations, [{ field: "start.process.timeout", description: "below 1s" }]);
  assert.equal(berth.isRetryable(bad), false);

  const unreachable = (admitted) => berth.fromServiceError(serviceError(status.UNAVAILABLE, "agent did not answer", [
    ["google.rpc.ErrorInfo", berth.ErrorInfo, { reason: "SANDBOX_UNREACHABLE", domain: "berth.dev" }],
    ["berth.v1.Unreachable", berth.errors.Unreachable, { admitted }],
  ]));
  assert.ok(unreachable(berth.errors.Admitted.ADMITTED_NOT_STARTED) instanceof berth.Unreachable);
  assert.equal(berth.isRetryable(unreachable(berth.errors.Admitted.ADMITTED_NOT_STARTED)), true);
  assert.equal(berth.isRetryable(unreachable(berth.errors.Admitted.ADMITTED_UNKNOWN)), false);

  const other = berth.fromServiceError(serviceError(status.UNAVAILABLE, "not berth's", [["google.rpc.ErrorInfo", berth.ErrorInfo, { reason: "X", domain: "example.com" }]]));
  assert.equal(other.constructor, berth.BerthError);
  assert.equal(other.reason, "");
  const plain = berth.fromServiceError(Object.assign(new Error("14 UNAVAILABLE: no connection"), { code: 14, details: "no connection" }));
  assert.deepEqual([plain.codeName, plain.reason, berth.isRetryable(plain)], ["UNAVAILABLE", "", false]);
});

test("the retry policy waits the RetryInfo delay for FleetBusy and gives up on what may have run", async () => {
  const conn = new berth.Connection({ addr: "unix:///nonexistent.sock", retry: { maxAttempts: 3, onRetry: (a, e, w) => waits.push(w) } });
  const waits = [];
  let calls = 0;
  const start = Date.now();
  const got = await conn.retry(async () => {
    if (++calls < 3) throw busy(0.2);
    return "ran";
  });
  assert.equal(got, "ran");
  assert.equal(calls, 3);
  assert.equal(waits.length, 2);
  for (const w of waits) assert.ok(w >= 0.2 && w <= 0.24, `wait ${w}`);
  assert.ok(Date.now() - start >= 400);

  calls = 0;
  await assert.rejects(conn.retry(async () => {
    calls++;
    throw berth.fromServiceError(serviceError(status.ABORTED, "replaced", [["google.rpc.ErrorInfo", berth.ErrorInfo, { reason: "RUNTIME_REPLACED", domain: "berth.dev" }]]));
  }), berth.RuntimeReplaced);
  assert.equal(calls, 1);

  calls = 0;
  await assert.rejects(conn.retry(async () => {
    calls++;
    throw busy(0.01);
  }), berth.FleetBusy);
  assert.equal(calls, 3, "maxAttempts");
  const none = new berth.Connection({ addr: "unix:///nonexistent.sock", retry: null });
  calls = 0;
  await assert.rejects(none.retry(async () => {
    calls++;
    throw busy(0.01);
  }), berth.FleetBusy);
  assert.equal(calls, 1);
  conn.close();
  none.close();
});

test("numbers: sizes beyond 2^53 refuse to round", () => {
  assert.equal(berth.num(123n), 123);
  assert.equal(berth.num(BigInt(Number.MAX_SAFE_INTEGER)), Number.MAX_SAFE_INTEGER);
  assert.throws(() => berth.num(1n << 60n), RangeError);
});
