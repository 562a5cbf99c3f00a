#!/usr/bin/env python3
"""Counts a test suite's kvcheck commands and splits their CPU: put this
script where the tests look for kvcheck ($KVCHECK), the real binary in
$KVCHECK_REAL, a log path in $KVCHECK_COMMANDS_LOG. Each command appends
one JSON line: the pytest test that ran it, its arguments, kvcheck's own
CPU seconds (user + sys), those of the children it waited for (adapter
interpreters, sandbox children) and its wall seconds. Both CPU figures are
read from the exited process's /proc stat before it is reaped (waitid with
WNOWAIT), so nothing is sampled.

    KVCHECK=bench/kvcheck_commands.py KVCHECK_REAL=build/fuzz/bin/kvcheck \\
        KVCHECK_COMMANDS_LOG=/tmp/commands.jsonl python3 -m pytest python/adapter_tests/test_example.py
"""

import json
import os
import sys
import time


def main():
    real = os.environ["KVCHECK_REAL"]
    log = os.environ["KVCHECK_COMMANDS_LOG"]
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.execv(real, [real] + sys.argv[1:])
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    user, system, children_user, children_system = (int(fields[i]) / ticks for i in (11, 12, 13, 14))
    _, status = os.waitpid(pid, 0)
    with open(log, "a") as out:
        out.write(json.dumps({"test": os.environ.get("PYTEST_CURRENT_TEST", ""), "args": sys.argv[1:],
                              "kvcheck_cpu_s": round(user + system, 2),
                              "children_cpu_s": round(children_user + children_system, 2),
                              "wall_s": round(time.monotonic() - started, 2)}) + "\n")
    sys.exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main()
