// The loop of an AI coding bot on berth's TypeScript SDK: upload a project with
// a failing test, run the tests streaming their output, read the code, write a
// fix, run again; a typed error and a timeout that stops the command.
// From the checkout: make clients, then BERTH_SDK=$PWD/clients/typescript (else the installed npm package)
// BERTH_ADDR=unix:///run/berth/berthd.sock node examples/node/bot.js PROJECT_DIR
"use strict";
const berth = require(process.env.BERTH_SDK || "@berth-sandbox/client");

(async () => {
  const sb = await berth.Sandbox.create({ user: "1000:1000" });
  try {
    await sb.files.uploadDir(process.argv[2], "/workspace/project");
    const test = () => sb.commands.run("./test.sh", {
      cwd: "/workspace/project", timeout: 120,
      onStdout: (b) => process.stdout.write("  | " + b), onStderr: (b) => process.stdout.write("  ! " + b),
    });
    let r = await test();
    console.log(`tests: exit ${r.exitCode}`);
    const code = await sb.files.readText("/workspace/project/calc.sh");
    if (r.exitCode !== 0) {
      await sb.files.write("/workspace/project/calc.sh", code.replace("2 + 3", "2 + 2"));
      r = await test();
      console.log(`after the fix: exit ${r.exitCode}`);
    }
    try {
      await sb.files.read("/workspace/project/notes.txt");
    } catch (e) {
      if (!(e instanceof berth.FileNotFound)) throw e;
      console.log(`typed error: ${e.reason} ${e.metadata.path}`);
    }
    const slow = await sb.commands.run("sleep 60", { timeout: 1 });
    console.log(`timeout: timedOut=${slow.timedOut} signal=${slow.signal}`);
    process.exitCode = r.exitCode;
  } finally {
    await sb.kill();
    sb.close();
  }
})();
