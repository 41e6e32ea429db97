// berth's TypeScript SDK meeting each runtime condition: a command with
// stdin, a file written by a command and read back, then FleetBusy (with
// its retry delay), StaleHandle, Unreachable and RuntimeReplaced as typed
// errors. It prints one line per step and exits 0 when every step saw what
// it should.
//
//   make clients   (or npm install @berth-sandbox/client and BERTH_SDK=@berth-sandbox/client)
//   BERTH_ADDR=unix:///run/berth/berthd.sock node examples/node/example.js
//
// berthd must run with --max-execs-per-sandbox 1 --task-restart-limit 1
// (for FleetBusy and Unreachable) and have berth.dev/base:latest (or
// $BERTH_IMAGE). The connection does not retry (retry: null), so that each
// condition reaches this code; by default FleetBusy and
// Unreachable-before-start are retried.
"use strict";

const path = require("node:path");
const assert = require("node:assert/strict");
const berth = require(process.env.BERTH_SDK || path.join(__dirname, "../../clients/typescript"));

const conn = new berth.Connection({ retry: null });

// restarted polls until berthd runs the sandbox's new runtime; its boot id.
async function restarted(sb, bootId) {
  for (const deadline = Date.now() + 10000; Date.now() < deadline; await new Promise((r) => setTimeout(r, 50))) {
    const info = await sb.refresh();
    if (info.state === "running" && info.agentBootId && info.agentBootId !== bootId) return info.agentBootId;
  }
  throw new Error(`sandbox ${sb.id} was not restarted within 10 s`);
}

// stopAgent: the workload stops the agent (PID 1); this command dies with it.
const stopAgent = (sb) => sb.commands.run(["kill", "-TERM", "1"]).catch((e) => assert.ok(e instanceof berth.BerthError, String(e)));

// expect runs p, which must reject with an instance of cls; the error.
async function expect(p, cls) {
  try {
    await p;
  } catch (e) {
    assert.ok(e instanceof cls, `want ${cls.name}, got ${e}`);
    return e;
  }
  throw new Error(`succeeded, want ${cls.name}`);
}

async function main() {
  const sb = await berth.Sandbox.create({ connection: conn });
  try {
    console.log(`created sandbox ${sb.id}`);
    // A command fed on stdin.
    const r = await sb.commands.run(["sh", "-c", "cat; echo bye >&2; exit 3"], { stdin: "hello from node\n" });
    assert.deepEqual([r.stdout, r.stderr, r.exitCode], ["hello from node\n", "bye\n", 3]);
    console.log(`exec ${r.execId}: stdout ${JSON.stringify(r.stdout)}, exit ${r.exitCode}`);
    // A file written by a command, read through the FileService.
    await sb.commands.run("printf 'written in the sandbox' > /workspace/note.txt");
    const content = await sb.files.readText("/workspace/note.txt");
    assert.equal(content, "written in the sandbox");
    console.log(`read /workspace/note.txt: ${JSON.stringify(content)}`);

    // FleetBusy: one command at a time per sandbox, and one runs.
    const long = await sb.commands.start(["sleep", "60"], { execId: "long" });
    const busy = await expect(sb.commands.run(["true"]), berth.FleetBusy);
    assert.ok(busy.codeName === "RESOURCE_EXHAUSTED" && berth.isRetryable(busy));
    console.log(`FLEET_BUSY: ${busy.detail.inUse} of ${busy.detail.limit} execs in use, retry after ${busy.retryAfter}s`);
    await long.kill();
    await long.wait();

    // StaleHandle: the agent restarts, and the first command's id belongs
    // to the old runtime.
    const bootId = sb.info.agentBootId;
    await stopAgent(sb);
    const newBoot = await restarted(sb, bootId);
    const stale = await expect(sb.commands.connect(r.execId), berth.StaleHandle);
    assert.equal(stale.detail.handleRuntime.agentBootId, bootId);
    console.log(`STALE_HANDLE: exec ${stale.detail.execId} ran in runtime ${bootId.slice(0, 8)}, now ${newBoot.slice(0, 8)}`);

    // Unreachable: a second stop exceeds --task-restart-limit 1.
    await stopAgent(sb);
    let unreachable;
    for (const deadline = Date.now() + 10000; !unreachable && Date.now() < deadline;) {
      try {
        await sb.commands.run(["true"]);
        await new Promise((res) => setTimeout(res, 50)); // the task has not exited yet
      } catch (e) {
        if (e instanceof berth.RuntimeReplaced) continue; // this `true` started as the task went down
        assert.ok(e instanceof berth.Unreachable, String(e));
        unreachable = e;
      }
    }
    assert.ok(unreachable, "no SANDBOX_UNREACHABLE");
    console.log(`SANDBOX_UNREACHABLE: cause ${unreachable.detail.cause}, ${unreachable.detail.admitted}`);
  } finally {
    await sb.kill();
  }

  // RuntimeReplaced: the sandbox is deleted under a running command.
  const sb2 = await berth.Sandbox.create({ connection: conn });
  try {
    const e = await expect(sb2.commands.run("echo go; sleep 60", { onStdout: () => sb2.kill() }), berth.RuntimeReplaced);
    console.log(`RUNTIME_REPLACED: cause ${e.detail.cause}, exec ${e.detail.execId}`);
  } finally {
    await sb2.kill();
  }
}

main()
  .then(() => {
    conn.close();
    console.log("node example: ok");
  })
  .catch((err) => {
    console.error("node example failed:", err);
    process.exit(1);
  });
