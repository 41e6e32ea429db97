#!/usr/bin/python3
"""The loop of an AI coding bot on berth's Python SDK: upload a project with
a failing test, run the tests streaming their output, read the code, write a
fix, run again; a typed error and a timeout that stops the command.
BERTH_ADDR=unix:///run/berth/berthd.sock python3 examples/python/bot.py PROJECT_DIR"""
import sys

if len(sys.argv) != 2:
    sys.exit(f"usage: {sys.argv[0]} PROJECT_DIR (a directory with test.sh and calc.sh)")

import berth  # noqa: E402 (after the usage check: it names what is missing first)

with berth.Sandbox.create(user="1000:1000") as sb:
    sb.files.upload_dir(sys.argv[1], "/workspace/project")

    def test():
        return sb.commands.run("./test.sh", cwd="/workspace/project", timeout=120,
                               on_stdout=lambda b: print("  | " + b.decode(), end=""),
                               on_stderr=lambda b: print("  ! " + b.decode(), end=""))

    r = test()
    print(f"tests: exit {r.exit_code}")
    code = sb.files.read_text("/workspace/project/calc.sh")
    if r.exit_code != 0:
        sb.files.write("/workspace/project/calc.sh", code.replace("2 + 3", "2 + 2"))
        r = test()
        print(f"after the fix: exit {r.exit_code}")
    try:
        sb.files.read("/workspace/project/notes.txt")
    except berth.FileNotFound as e:
        print(f"typed error: {e.reason} {e.metadata['path']}")
    slow = sb.commands.run("sleep 60", timeout=1)
    print(f"timeout: timed_out={slow.timed_out} signal={slow.signal}")
    sys.exit(r.exit_code)
