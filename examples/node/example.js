// A berth client in Node: creates a sandbox, streams an exec with stdin,
// writes and reads a file, and meets each typed error (FleetBusy with
// RetryInfo, StaleHandle, RuntimeReplaced, Unreachable, each with its
// ErrorInfo), decoding their details. It prints one line per step and exits
// 0 when every step saw what it should.
//
//   cd clients/typescript && npm ci && npm run build
//   BERTH_ADDR=unix:///run/berth/berthd.sock node examples/node/example.js
//
// berthd must run with --max-execs-per-sandbox 1 --task-restart-limit 1
// (for FleetBusy and Unreachable) and have berth.dev/base:latest (or
// $BERTH_IMAGE). On the unix socket the caller is the principal of its uid;
// set BERTH_TOKEN to call with a bearer token instead (docs/security.md "Tokens").
"use strict";

const path = require("node:path");
const assert = require("node:assert/strict");
const berth = require(path.join(__dirname, "../../clients/typescript/dist"));
const { sandbox: sb, exec: ex, file: fl } = berth;

const addr = process.env.BERTH_ADDR || "unix:///run/berth/berthd.sock";
const image = process.env.BERTH_IMAGE || "berth.dev/base:latest";
const b = berth.connect(addr, { token: process.env.BERTH_TOKEN });

// unary calls a unary method with the token's metadata and a deadline.
function unary(client, method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, b.metadata(), { deadline: Date.now() + 60000 }, (err, resp) => (err ? reject(err) : resolve(resp)));
  });
}

// execStream opens an Exec stream, sends first, and collects its events
// until it ends. onEvent sees each event as it comes, with the stream (to
// send stdin).
function execStream(first, onEvent = () => {}) {
  return new Promise((resolve, reject) => {
    const call = b.sandboxes.exec(b.metadata());
    const got = { started: undefined, stdout: "", stderr: "", exited: undefined };
    call.on("data", (msg) => {
      const ev = msg.event;
      switch (ev && ev.$case) {
        case "started":
          got.started = ev.value;
          break;
        case "output":
          got[ev.value.stream === ex.Stream.STREAM_STDERR ? "stderr" : "stdout"] += Buffer.from(ev.value.data).toString();
          break;
        case "exited":
          got.exited = ev.value.result;
          break;
      }
      onEvent(ev, call);
    });
    call.on("error", reject);
    call.on("end", () => resolve(got));
    call.write(ex.ExecRequest.fromPartial({ event: first }));
  });
}

const start = (sandboxId, process, extra = {}) => ({ $case: "start", value: { sandboxId, process, ...extra } });

// expectError runs p, which must fail with code and ErrorInfo reason, and
// returns the decoded details.
async function expectError(what, p, code, reason) {
  try {
    await p;
  } catch (err) {
    const d = berth.details(err);
    assert.equal(err.code, code, `${what}: code ${err.code} (${err.details}), want ${code}`);
    assert.equal(d.errorInfo?.reason, reason, `${what}: reason ${d.errorInfo?.reason}, want ${reason}`);
    assert.equal(d.errorInfo?.domain, "berth.dev");
    return d;
  }
  throw new Error(`${what}: succeeded, want ${reason}`);
}

// waitRestarted polls until the sandbox runs an agent other than bootId.
async function waitRestarted(id, bootId) {
  for (let i = 0; i < 200; i++) {
    const got = await unary(b.sandboxes, "getSandbox", sb.GetSandboxRequest.fromPartial({ sandboxId: id }));
    const s = got.sandbox;
    if (s.state === sb.SandboxState.SANDBOX_STATE_RUNNING && s.runtime && s.runtime.agentBootId && s.runtime.agentBootId !== bootId) {
      return s.runtime.agentBootId;
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`sandbox ${id} was not restarted within 10 s`);
}

const codes = { FAILED_PRECONDITION: 9, RESOURCE_EXHAUSTED: 8, ABORTED: 10, UNAVAILABLE: 14 };

async function main() {
  // 1. A sandbox.
  const created = await unary(b.sandboxes, "createSandbox", sb.CreateSandboxRequest.fromPartial({ image }));
  const id = created.sandbox.id;
  console.log(`created sandbox ${id}`);
  try {
    await steps(id, created.sandbox.runtime.agentBootId);
  } finally {
    await unary(b.sandboxes, "deleteSandbox", sb.DeleteSandboxRequest.fromPartial({ sandboxId: id })).catch(() => {});
  }
}

async function steps(id, bootId) {
  // 2. An exec streamed with stdin: cat echoes it, then the exit status.
  const catRun = await execStream(start(id, { argv: ["sh", "-c", "cat; echo bye >&2; exit 3"], stdin: true }), (ev, call) => {
    if (ev.$case === "started") {
      call.write(ex.ExecRequest.fromPartial({ event: { $case: "stdin", value: { data: Buffer.from("hello from node\n") } } }));
      call.write(ex.ExecRequest.fromPartial({ event: { $case: "closeStdin", value: {} } }));
    }
  });
  assert.equal(catRun.stdout, "hello from node\n");
  assert.equal(catRun.stderr, "bye\n");
  assert.equal(catRun.exited.exitCode, 3);
  console.log(`exec ${catRun.started.execId}: stdout ${JSON.stringify(catRun.stdout)}, exit ${catRun.exited.exitCode}`);

  // 3. A file written by a command, read back through FileService.
  await execStream(start(id, { shellCommand: "printf 'written in the sandbox' > /workspace/note.txt" }));
  const content = await new Promise((resolve, reject) => {
    const chunks = [];
    const call = b.files.readFile(fl.ReadFileRequest.fromPartial({ sandboxId: id, location: { $case: "path", value: "/workspace/note.txt" } }), b.metadata());
    call.on("data", (msg) => msg.part && msg.part.$case === "chunk" && chunks.push(Buffer.from(msg.part.value)));
    call.on("error", reject);
    call.on("end", () => resolve(Buffer.concat(chunks).toString()));
  });
  assert.equal(content, "written in the sandbox");
  console.log(`read /workspace/note.txt: ${JSON.stringify(content)}`);

  // 4. FleetBusy and RetryInfo: one exec at a time per sandbox, one runs.
  await execStream(start(id, { argv: ["sleep", "60"] }, { execId: "long", background: true }));
  const busy = await expectError("second exec", execStream(start(id, { argv: ["true"] })), codes.RESOURCE_EXHAUSTED, "FLEET_BUSY");
  assert.ok(busy.fleetBusy && busy.retryInfo, "FLEET_BUSY without FleetBusy and RetryInfo");
  const delay = Number(busy.retryInfo.retryDelay.seconds) + busy.retryInfo.retryDelay.nanos / 1e9;
  console.log(`FLEET_BUSY: ${busy.fleetBusy.inUse} of ${busy.fleetBusy.limit} execs in use, retry after ${delay}s`);
  await unary(b.sandboxes, "signalExec", ex.SignalExecRequest.fromPartial({ sandboxId: id, execId: "long", signal: "KILL" }));
  await execStream({ $case: "attach", value: { sandboxId: id, execId: "long" } }); // until it exited

  // 5. StaleHandle: the workload stops the agent (kill -TERM 1), berthd
  // starts a new runtime, and the earlier exec id belongs to the old one.
  await execStream(start(id, { argv: ["kill", "-TERM", "1"] })).catch(() => {});
  const newBoot = await waitRestarted(id, bootId);
  const stale = await expectError("attach to an exec of the old runtime",
    execStream({ $case: "attach", value: { sandboxId: id, execId: catRun.started.execId } }), codes.FAILED_PRECONDITION, "STALE_HANDLE");
  assert.equal(stale.staleHandle.handleRuntime.agentBootId, bootId);
  console.log(`STALE_HANDLE: exec ${stale.staleHandle.execId} ran in runtime ${bootId.slice(0, 8)}, now ${newBoot.slice(0, 8)}`);

  // 6. Unreachable: the second stop exceeds --task-restart-limit 1, so the
  // sandbox stays stopped and nothing runs.
  await execStream(start(id, { argv: ["kill", "-TERM", "1"] })).catch(() => {});
  let unreachable;
  for (let i = 0; i < 200 && !unreachable; i++) {
    try {
      await execStream(start(id, { argv: ["true"] }));
      await new Promise((r) => setTimeout(r, 50)); // the task has not exited yet
    } catch (err) {
      // A `true` that started as the task went down is ABORTED
      // (RUNTIME_REPLACED): harmless to run again.
      if (berth.details(err).runtimeReplaced) continue;
      unreachable = await expectError("exec in a stopped sandbox", Promise.reject(err), codes.UNAVAILABLE, "SANDBOX_UNREACHABLE");
    }
  }
  assert.ok(unreachable && unreachable.unreachable, "no SANDBOX_UNREACHABLE");
  const u = unreachable.unreachable;
  console.log(`SANDBOX_UNREACHABLE: cause ${berth.errors.unreachableCauseToJSON(u.cause)}, ${berth.errors.admittedToJSON(u.admitted)}`);
}

// 7. RuntimeReplaced: a sandbox deleted under a running exec.
async function replaced() {
  const created = await unary(b.sandboxes, "createSandbox", sb.CreateSandboxRequest.fromPartial({ image }));
  const id = created.sandbox.id;
  const run = execStream(start(id, { argv: ["sleep", "60"] }), (ev) => {
    if (ev.$case === "started") {
      unary(b.sandboxes, "deleteSandbox", sb.DeleteSandboxRequest.fromPartial({ sandboxId: id })).catch(() => {});
    }
  });
  const d = await expectError("exec in a deleted sandbox", run, codes.ABORTED, "RUNTIME_REPLACED");
  assert.ok(d.runtimeReplaced, "RUNTIME_REPLACED without RuntimeReplaced");
  console.log(`RUNTIME_REPLACED: cause ${berth.errors.replacedCauseToJSON(d.runtimeReplaced.cause)}, exec ${d.runtimeReplaced.execId}`);
}

main()
  .then(replaced)
  .then(() => {
    console.log("node example: ok");
    b.close();
  })
  .catch((err) => {
    console.error("node example failed:", err);
    process.exit(1);
  });
