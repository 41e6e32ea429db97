// The TypeScript SDK's tests, run with `node --test` against a real berthd
// (integration/typescript_sdk_test.go starts one and sets BERTH_ADDR and
// BERTH_IMAGE): the bot loop, typed errors, a timeout that stops the
// command, 64 MiB of output to a slow consumer, uploadDir/downloadDir with
// symlinks and modes, port forwarding, background commands, and the packed
// tarball installed into a fresh project. Without BERTH_ADDR they fail: they
// are not unit tests.
"use strict";

const { test, before, after } = require("node:test");
const assert = require("node:assert/strict");
const crypto = require("node:crypto");
const fs = require("node:fs");
const http = require("node:http");
const net = require("node:net");
const os = require("node:os");
const path = require("node:path");
const { execFile } = require("node:child_process");

// run runs a program without blocking the event loop (a blocked loop
// cannot answer berthd's keepalive pings, which then drops the connection).
function run(file, args, options = {}) {
  return new Promise((resolve, reject) => {
    execFile(file, args, { encoding: "utf8", ...options }, (err, stdout, stderr) => (err ? reject(new Error(`${file} ${args.join(" ")}: ${err.message}\n${stdout}${stderr}`)) : resolve(stdout)));
  });
}
const berth = require("..");

const REPO = path.resolve(__dirname, "../../..");

// poll calls fn until it returns something other than undefined/false, for
// up to 20 s.
async function poll(fn, what) {
  const deadline = Date.now() + 20000;
  for (;;) {
    const v = await fn();
    if (v !== undefined && v !== false && v !== null) return v;
    if (Date.now() > deadline) throw new Error(`no ${what} within 20 s`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

let conn;
let sb;

before(async () => {
  assert.ok(process.env.BERTH_ADDR, "BERTH_ADDR must name the berthd under test");
  conn = new berth.Connection();
  sb = await berth.Sandbox.create({ user: "1000:1000", env: { PROJECT: "demo" }, connection: conn });
});

after(async () => {
  await sb?.kill();
  conn?.close();
});

test("bot loop", async () => {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), "berth-ts-"));
  fs.writeFileSync(path.join(d, "calc.sh"), "echo $((2 + 3))\n");
  fs.writeFileSync(path.join(d, "test.sh"), 'out=$(sh calc.sh); echo "calc says $out"; [ "$out" = 4 ] || { echo "FAIL: want 4" >&2; exit 1; }; echo PASS\n', { mode: 0o755 });
  const up = await sb.files.uploadDir(d, "/workspace/project");
  fs.rmSync(d, { recursive: true });
  assert.equal(up.files, 2);
  assert.equal((await sb.files.stat("/workspace/project/calc.sh")).uid, 1000);

  const out = [];
  const err = [];
  let r = await sb.commands.run("./test.sh", { cwd: "/workspace/project", onStdout: (b) => out.push(b), onStderr: (b) => err.push(b), timeout: 60 });
  assert.deepEqual([r.exitCode, r.stdout, r.stderr], [1, "calc says 5\n", "FAIL: want 4\n"]);
  assert.equal(Buffer.concat(out).toString(), r.stdout);
  assert.equal(Buffer.concat(err).toString(), r.stderr);
  assert.deepEqual(JSON.parse(JSON.stringify(r)), r, "the result is plain JSON");
  assert.equal(await sb.files.readText("/workspace/project/calc.sh"), "echo $((2 + 3))\n");
  await sb.files.write("/workspace/project/calc.sh", "echo $((2 + 2))\n");
  r = await sb.commands.run(["sh", "-c", "./test.sh && id -u && echo $PROJECT"], { cwd: "/workspace/project" });
  assert.deepEqual([r.exitCode, r.stdout], [0, "calc says 4\nPASS\n1000\ndemo\n"]);

  await assert.rejects(sb.files.read("/workspace/project/missing.txt"), (e) => {
    assert.ok(e instanceof berth.FileNotFound, String(e));
    assert.equal(e.reason, "FILE_NOT_FOUND");
    assert.equal(e.metadata.path, "/workspace/project/missing.txt");
    assert.equal(JSON.parse(JSON.stringify(e)).reason, "FILE_NOT_FOUND");
    return true;
  });
  await assert.rejects(berth.Sandbox.connect("no-such-sandbox", { connection: conn }), berth.SandboxNotFound);
  await assert.rejects(sb.commands.run("true", { timeout: 0.5 }), (e) => {
    assert.ok(e instanceof berth.InvalidArgument, String(e));
    assert.equal(e.fieldViolations[0].field, "start.process.timeout");
    return true;
  });

  const start = Date.now();
  r = await sb.commands.run("echo started; sleep 30; echo late", { timeout: 1 });
  assert.ok(r.timedOut, JSON.stringify(r));
  assert.equal(r.stdout, "started\n");
  assert.notEqual(r.exitCode, 0);
  assert.ok(Date.now() - start < 20000);
  // The command really stopped: no sleep is left in the sandbox.
  const ps = await sb.commands.run("ps -o args | grep -c '^sleep 30' || true");
  assert.equal(ps.stdout, "0\n");
  const info = (await sb.commands.list()).filter((e) => e.execId === r.execId);
  assert.equal(info.length, 1);
  assert.equal(info[0].state, "exited");
});

test("64 MiB streamed to a slow consumer", async () => {
  const total = 64 << 20;
  const line = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ\n";
  const want = crypto.createHash("sha256").update(Buffer.from(line.repeat(Math.ceil(total / line.length))).subarray(0, total)).digest("hex");
  const h = crypto.createHash("sha256");
  let n = 0;
  let calls = 0;
  const r = await sb.commands.run(`yes ${line.slice(0, -1)} | head -c ${total}`, {
    capture: false,
    timeout: 600,
    onStdout: (chunk) => {
      h.update(chunk);
      n += chunk.length;
      if (++calls % 8 === 0) return new Promise((res) => setTimeout(res, 10)); // the slow consumer this test is about
    },
  });
  assert.equal(r.exitCode, 0);
  assert.deepEqual([n, r.stdoutBytes, r.droppedBytes], [total, total, 0]);
  assert.equal(h.digest("hex"), want);
});

test("uploadDir and downloadDir keep symlinks and modes", async () => {
  const src = fs.mkdtempSync(path.join(os.tmpdir(), "berth-ts-src-"));
  const dst = fs.mkdtempSync(path.join(os.tmpdir(), "berth-ts-dst-"));
  try {
    fs.mkdirSync(path.join(src, "a", "deep"), { recursive: true });
    fs.mkdirSync(path.join(src, "empty"));
    const files = { "a/data.txt": ["data\n", 0o640], "a/run.sh": ["#!/bin/sh\necho run\n", 0o755], "a/deep/x": ["x".repeat(100000), 0o600] };
    for (const [name, [content, mode]] of Object.entries(files)) {
      fs.writeFileSync(path.join(src, name), content);
      fs.chmodSync(path.join(src, name), mode);
    }
    fs.chmodSync(path.join(src, "a", "deep"), 0o750);
    fs.symlinkSync("a/data.txt", path.join(src, "rel"));
    fs.symlinkSync("/etc/hostname", path.join(src, "abs"));
    fs.symlinkSync("missing", path.join(src, "a", "dangling"));

    await sb.files.uploadDir(src, "/workspace/tree");
    assert.equal((await sb.files.stat("/workspace/tree/rel")).symlinkTarget, "a/data.txt");
    assert.equal((await sb.files.stat("/workspace/tree/rel")).type, "symlink");
    assert.equal((await sb.files.stat("/workspace/tree/abs")).symlinkTarget, "/etc/hostname");
    assert.equal((await sb.files.stat("/workspace/tree/a/run.sh")).mode, 0o755);
    assert.equal((await sb.files.stat("/workspace/tree/a/data.txt")).mode, 0o640);
    assert.equal((await sb.files.stat("/workspace/tree/a/deep")).mode, 0o750);
    assert.equal((await sb.commands.run("./a/run.sh", { cwd: "/workspace/tree" })).stdout, "run\n");
    const names = (await sb.files.list("/workspace/tree", { depth: 3 })).map((i) => i.path).sort();
    assert.deepEqual(names, ["a", "a/dangling", "a/data.txt", "a/deep", "a/deep/x", "a/run.sh", "abs", "empty", "rel"].map((n) => "/workspace/tree/" + n));

    await sb.files.downloadDir("/workspace/tree", dst);
    for (const [name, [content, mode]] of Object.entries(files)) {
      assert.equal(fs.readFileSync(path.join(dst, name), "utf8"), content, name);
      assert.equal(fs.statSync(path.join(dst, name)).mode & 0o7777, mode, name);
    }
    assert.equal(fs.statSync(path.join(dst, "a", "deep")).mode & 0o7777, 0o750);
    assert.equal(fs.readlinkSync(path.join(dst, "rel")), "a/data.txt");
    assert.equal(fs.readlinkSync(path.join(dst, "abs")), "/etc/hostname");
    assert.equal(fs.readlinkSync(path.join(dst, "a", "dangling")), "missing");
    assert.ok(fs.statSync(path.join(dst, "empty")).isDirectory());
  } finally {
    fs.rmSync(src, { recursive: true, force: true });
    fs.rmSync(dst, { recursive: true, force: true });
  }
});

test("files: write, stream, stat, list, rename, remove, makeDir", async () => {
  const big = crypto.randomBytes(5 << 20);
  async function* chunks() {
    for (let i = 0; i < big.length; i += 300000) yield big.subarray(i, i + 300000);
  }
  const w = await sb.files.write("/workspace/f/big.bin", chunks(), { mode: 0o600 });
  assert.deepEqual([w.size, w.mode, w.type], [big.length, 0o600, "file"]);
  const h = crypto.createHash("sha256");
  for await (const c of sb.files.readStream("/workspace/f/big.bin")) h.update(c);
  assert.equal(h.digest("hex"), crypto.createHash("sha256").update(big).digest("hex"));
  assert.equal((await sb.files.read("/workspace/f/big.bin", { offset: 10, limit: 5 })).toString("hex"), big.subarray(10, 15).toString("hex"));
  await sb.files.makeDir("/workspace/f/d/e", { mode: 0o700 });
  assert.equal((await sb.files.stat("/workspace/f/d/e")).type, "dir");
  await sb.files.rename("/workspace/f/big.bin", "/workspace/f/d/moved.bin");
  assert.equal(await sb.files.exists("/workspace/f/big.bin"), false);
  await assert.rejects(sb.files.rename("/workspace/f/d/moved.bin", "/workspace/f/d/e"), berth.BerthError);
  await sb.files.remove("/workspace/f", { recursive: true });
  assert.equal(await sb.files.exists("/workspace/f"), false);
});

test("background commands: stdin, reattach with replay from a seq, kill", async () => {
  const h = await sb.commands.start("cat; echo done", { stdin: true });
  await h.sendStdin("one\n");
  await poll(() => h.stdout === "one\n", "the first line echoed");
  const seq = h.lastSeq;
  await h.disconnect();
  const again = await sb.commands.connect(h.execId, { sinceSeq: seq });
  const replay = await sb.commands.connect(h.execId);
  await again.sendStdin("two\n");
  again.closeStdin();
  const r = await again.wait();
  assert.deepEqual([r.exitCode, r.stdout], [0, "two\ndone\n"]);
  assert.equal((await replay.wait()).stdout, "one\ntwo\ndone\n");

  const sleeper = await sb.commands.start(["sleep", "600"]);
  assert.equal(await sleeper.kill("KILL"), true);
  const sr = await sleeper.wait();
  assert.equal(sr.signal, "SIGKILL");
  assert.equal(await sb.commands.kill(sleeper.execId), false);
  await assert.rejects(sb.commands.connect("no-such-exec"), berth.ExecNotFound);
});

test("code context: the base image has no python3", async () => {
  const err = await sb.contexts.create().then(() => undefined, (e) => e);
  assert.ok(err instanceof berth.BerthError, String(err));
  assert.deepEqual([err.reason, err.metadata.language], ["INTERPRETER_MISSING", "python"]);
  assert.deepEqual(await sb.contexts.list(), []);
});

test("port forward", async () => {
  await sb.files.write("/workspace/www/index.html", "hello through the forward\n");
  const httpd = await sb.commands.start(["httpd", "-f", "-p", "8080", "-h", "/workspace/www"]);
  try {
    const fwd = await sb.ports.forward(8080);
    try {
      const get = () =>
        new Promise((resolve) => {
          http.get(`http://${fwd.address}/index.html`, (res) => {
            const parts = [];
            res.on("data", (c) => parts.push(c));
            res.on("end", () => resolve(Buffer.concat(parts).toString()));
            res.on("error", () => resolve(undefined));
          }).on("error", () => resolve(undefined));
        });
      assert.equal(await poll(get, "httpd answering through the forward"), "hello through the forward\n");
    } finally {
      await fwd.close();
    }
    const closed = await sb.ports.forward(9);
    try {
      const got = await new Promise((resolve, reject) => {
        const s = net.connect(closed.port, closed.host);
        const parts = [];
        s.on("data", (c) => parts.push(c));
        s.on("close", () => resolve(Buffer.concat(parts)));
        s.on("error", reject);
      });
      assert.equal(got.length, 0); // closed by the relay
      await poll(() => closed.lastError !== undefined, "the forward's error");
      assert.ok(closed.lastError instanceof berth.PortClosed, String(closed.lastError));
    } finally {
      await closed.close();
    }
  } finally {
    await httpd.kill();
  }
});

test("shell session keeps state between commands", async () => {
  const s = await sb.sessions.create({ shell: "bash", name: "ts" });
  try {
    assert.equal((await s.run("cd /tmp; export A=1; f() { echo $A; }")).exitCode, 0);
    const r = await s.run("pwd; f");
    assert.deepEqual([r.stdout, r.exitCode], ["/tmp\n1\n", 0]);
    assert.equal((await s.run("false")).exitCode, 1);
    const slow = await s.run("sleep 100", { timeout: 1 });
    assert.equal(slow.timedOut, true);
    assert.equal(slow.exitCode, 130);
    assert.equal((await s.run("echo $A")).stdout, "1\n");
    assert.ok((await sb.sessions.list()).some((i) => i.sessionId === s.id));
  } finally {
    await s.delete();
  }
  assert.ok(!(await sb.sessions.list()).some((i) => i.sessionId === s.id));
});

test("files.watch resumes without missing or repeating", async () => {
  await sb.files.makeDir("/workspace/watched-ts");
  const w = await sb.files.watch("/workspace/watched-ts", { include: ["f-*"] });
  const seen = [];
  try {
    assert.equal((await sb.commands.run("cd /workspace/watched-ts && for i in $(seq 1 20); do : > f-$i; done")).exitCode, 0);
    for (const ev of await w.next(10)) {
      assert.equal(ev.kind, "file");
      seen.push(ev.event.path);
    }
  } finally {
    w.close();
  }
  const again = await sb.files.watch("/workspace/watched-ts", { watchId: w.watchId, sinceSeq: w.lastSeq });
  try {
    assert.equal(again.watchId, w.watchId);
    for (const ev of await again.next(10)) seen.push(ev.event.path);
  } finally {
    again.close();
  }
  const want = Array.from({ length: 20 }, (_, i) => `/workspace/watched-ts/f-${i + 1}`);
  assert.deepEqual([...seen].sort(), want.sort());
});

test("volume shared between sandboxes, refused deletion in use", async () => {
  const vols = new berth.Volumes({ connection: conn });
  const name = "ts-" + crypto.randomBytes(4).toString("hex");
  const v = await vols.create(name, { quotaBytes: 4 << 20 });
  try {
    assert.equal(v.name, name);
    const a = await berth.Sandbox.create({ user: "1000:1000", volumes: [`${name}:/data`], connection: conn });
    try {
      assert.equal((await a.commands.run("echo hi > /data/f")).exitCode, 0);
      const b = await berth.Sandbox.create({ volumes: [{ name, path: "/ro", readOnly: true }], connection: conn });
      try {
        assert.equal((await b.commands.run("cat /ro/f")).stdout, "hi\n");
        assert.notEqual((await b.commands.run("echo x > /ro/g")).exitCode, 0);
        assert.deepEqual([...(await vols.get(name)).sandboxIds].sort(), [a.id, b.id].sort());
        await assert.rejects(vols.delete(name), (e) => e instanceof berth.BerthError && e.reason === "VOLUME_IN_USE");
      } finally {
        await b.kill();
      }
    } finally {
      await a.kill();
    }
    assert.ok((await vols.list()).some((x) => x.name === name));
  } finally {
    await vols.delete(name);
  }
  await assert.rejects(vols.get(name), (e) => e instanceof berth.BerthError && e.reason === "VOLUME_NOT_FOUND");
});

test("pause, resume, snapshot, fork, commit and hibernate", async () => {
  const snaps = new berth.Snapshots({ connection: conn });
  const reason = (r) => (e) => e instanceof berth.BerthError && e.reason === r;
  const sb = await berth.Sandbox.create({ idleAction: "pause", labels: { who: "ts" }, connection: conn });
  try {
    assert.equal(sb.info.idleAction, "pause");
    await sb.files.write("/workspace/f", "one");
    await sb.pause();
    assert.deepEqual([sb.info.state, (await sb.refresh()).state], ["paused", "paused"]);
    await sb.resume();
    assert.equal(sb.info.state, "running");
    await sb.pause();
    // Through a noResume connection a call that needs the agent is
    // refused and the sandbox stays paused.
    const peekConn = new berth.Connection({ noResume: true });
    try {
      const p = await berth.Sandbox.connect(sb.id, { connection: peekConn });
      await assert.rejects(p.commands.run("true"), reason("SANDBOX_PAUSED"));
      await assert.rejects(p.files.read("/workspace/f"), reason("SANDBOX_PAUSED"));
      assert.equal((await p.refresh()).state, "paused");
    } finally {
      peekConn.close();
    }
    // A command on a paused sandbox resumes it first.
    assert.equal((await sb.commands.run("cat /workspace/f")).stdout, "one");
    assert.equal((await sb.refresh()).state, "running");

    const snap = await sb.snapshot({ labels: { step: "one" } });
    assert.match(snap.id, /^snap-/);
    assert.deepEqual([snap.sandboxId, snap.labels], [sb.id, { step: "one" }]);
    assert.ok((await snaps.list()).some((x) => x.id === snap.id));
    await sb.files.write("/workspace/f", "two");

    await assert.rejects(sb.fork({ count: 17 }), (e) => e instanceof berth.InvalidArgument && e.fieldViolations[0].field === "count");
    const kids = await sb.fork({ count: 2, labels: { kid: "yes" } });
    try {
      assert.equal(new Set([sb.id, ...kids.map((k) => k.id)]).size, 3);
      for (const k of kids) {
        assert.deepEqual(k.info.labels, { who: "ts", kid: "yes" });
        assert.equal(await k.files.readText("/workspace/f"), "two");
      }
      await kids[0].files.write("/workspace/f", "three");
      assert.deepEqual([await kids[0].files.readText("/workspace/f"), await kids[1].files.readText("/workspace/f")], ["three", "two"]);
      assert.equal(await sb.files.readText("/workspace/f"), "two");
    } finally {
      for (const k of kids) await k.kill();
    }
    const requestId = "ts-" + crypto.randomBytes(4).toString("hex");
    const [first] = await sb.fork({ requestId });
    try {
      assert.deepEqual((await sb.fork({ requestId })).map((k) => k.id), [first.id]);
      await assert.rejects(sb.fork({ requestId, count: 2 }), reason("SANDBOX_EXISTS"));
    } finally {
      await first.kill();
    }

    const again = await berth.Sandbox.create({ fromSnapshot: snap.id, connection: conn });
    try {
      assert.equal(await again.files.readText("/workspace/f"), "one");
      await assert.rejects(snaps.delete(snap.id), reason("SNAPSHOT_IN_USE"));
    } finally {
      await again.kill();
    }
    const ref = "ts-sdk/commit:" + crypto.randomBytes(4).toString("hex");
    assert.equal(await snaps.commit(snap.id, ref, { env: ["STEP=one"] }), ref);
    try {
      const c = await berth.Sandbox.create({ image: ref, connection: conn });
      try {
        assert.equal((await c.commands.run("echo $STEP; cat /workspace/f")).stdout, "one\none");
      } finally {
        await c.kill();
      }
    } finally {
      await conn.unary(conn.images, "deleteImage", berth.image.DeleteImageRequest.fromPartial({ name: ref }));
    }
    await snaps.delete(snap.id);
    assert.ok(!(await snaps.list()).some((x) => x.id === snap.id));
    await assert.rejects(snaps.delete(snap.id), reason("SNAPSHOT_NOT_FOUND"));

    // runc: the processes end, the files stay; the next call wakes it.
    assert.equal(await sb.hibernate(), "processes_ended");
    assert.equal(sb.info.state, "hibernated");
    assert.equal((await sb.commands.run("cat /workspace/f")).stdout, "two");
    assert.equal((await sb.refresh()).state, "running");
  } finally {
    await sb.kill();
  }
  await assert.rejects(berth.Sandbox.create({ idleAction: "sleep", connection: conn }), (e) => e instanceof berth.InvalidArgument && e.fieldViolations[0].field === "idleAction");
});

test("await using deletes a created sandbox", async () => {
  let id;
  {
    const s = await berth.Sandbox.create({ connection: conn });
    id = s.id;
    assert.equal((await s.commands.run("echo in")).stdout, "in\n");
    await s[Symbol.asyncDispose]();
  }
  await assert.rejects(berth.Sandbox.connect(id, { connection: conn }), berth.SandboxNotFound);
});

test("the packed tarball installs into a fresh project", async () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "berth-ts-pack-"));
  try {
    const out = process.env.BERTH_TS_SDK_PACK_DIR || path.join(tmp, "dist");
    await run(path.join(REPO, "scripts", "ts-sdk.sh"), [out]);
    const tgz = fs.readdirSync(out).filter((f) => f.endsWith(".tgz"));
    assert.equal(tgz.length, 1, String(tgz));
    const proj = path.join(tmp, "proj");
    fs.mkdirSync(proj);
    fs.writeFileSync(path.join(proj, "package.json"), JSON.stringify({ name: "fresh", version: "1.0.0", private: true }));
    await run("npm", ["install", "--no-audit", "--no-fund", "--prefer-offline", path.join(out, tgz[0])], { cwd: proj });
    const pkg = JSON.parse(fs.readFileSync(path.join(proj, "node_modules/@berth-sandbox/client/package.json"), "utf8"));
    assert.notEqual(pkg.version, "0.0.0-dev");
    assert.equal(pkg.private, undefined);
    assert.ok(fs.existsSync(path.join(proj, "node_modules/@berth-sandbox/client/dist/index.d.ts")));
    const code = "const { Sandbox } = require('@berth-sandbox/client'); (async () => { const sb = await Sandbox.create(); " +
      "const r = await sb.commands.run('echo from the tarball'); await sb.kill(); sb.close(); " +
      "console.log([require.resolve('@berth-sandbox/client'), r.stdout.trim()].join('|')); })().catch((e) => { console.error(e); process.exit(1); });";
    const [where, said] = (await run("node", ["-e", code], { cwd: proj })).trim().split("|");
    assert.ok(where.startsWith(proj), where);
    assert.equal(said, "from the tarball");

    // TypeScript against the package's types, with `await using`: the
    // sandbox is gone after the block.
    fs.writeFileSync(path.join(proj, "main.ts"), [
      'import { Sandbox, CommandResult, SandboxNotFound } from "@berth-sandbox/client";',
      "async function main(): Promise<string> {",
      "  let id: string;",
      "  {",
      "    await using sb = await Sandbox.create();",
      "    id = sb.id;",
      '    const r: CommandResult = await sb.commands.run(["echo", "typed"]);',
      "    if (r.exitCode !== 0 || r.stdout !== 'typed\\n') throw new Error(JSON.stringify(r));",
      "  }",
      "  try { await Sandbox.connect(id); } catch (e) { if (e instanceof SandboxNotFound) return 'disposed ' + id; throw e; }",
      "  return 'still there ' + id;",
      "}",
      "main().then((s) => console.log(s), (e) => { console.error(e); process.exit(1); });",
      "",
    ].join("\n"));
    const tsc = path.join(__dirname, "..", "node_modules", ".bin", "tsc");
    await run(tsc, ["--strict", "--target", "ES2022", "--module", "commonjs", "--moduleResolution", "node", "--lib", "ES2022,ESNext.Disposable",
      "--typeRoots", path.join(__dirname, "..", "node_modules", "@types"), "--types", "node", "main.ts"], { cwd: proj });
    assert.match(await run("node", ["main.js"], { cwd: proj }), /^disposed sb-/);
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
});

test("examples/node/bot.js: the bot loop in under 40 lines", async () => {
  const bot = path.join(REPO, "examples", "node", "bot.js");
  assert.ok(fs.readFileSync(bot, "utf8").split("\n").length - 1 <= 40, "bot.js is longer than 40 lines");
  const out = await new Promise((resolve) => {
    require("node:child_process").execFile("node", [bot, path.join(REPO, "examples", "python", "project")],
      { env: { ...process.env, BERTH_SDK: path.resolve(__dirname, "..") } }, (err, stdout, stderr) => resolve({ code: err ? err.code : 0, text: stdout + stderr }));
  });
  assert.equal(out.code, 0, out.text);
  for (const want of ["  | calc says 5", "tests: exit 1", "PASS", "after the fix: exit 0", "typed error: FILE_NOT_FOUND /workspace/project/notes.txt",
    "timeout: timedOut=true signal=SIGTERM"]) {
    assert.ok(out.text.includes(want), `bot.js output lacks ${JSON.stringify(want)}:\n${out.text}`);
  }
});
