"""One timed `kvcheck` command with a JSON report, for the benchmark
scripts of this directory (strict_bench.py, paged_bench.py)."""

from __future__ import annotations

import json
import os
import subprocess
import time


def timed(binary: str, args, scratch: str):
    """Runs kvcheck with a JSON report; (wall seconds, exit status, report)."""
    report = os.path.join(scratch, "report.json")
    command = [binary] + list(args) + ["--quiet", "--report", "json", "--out", report,
                                       "--trace-dir", os.path.join(scratch, "traces")]
    start = time.monotonic()
    completed = subprocess.run(command, cwd=scratch, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.monotonic() - start
    parsed = None
    if os.path.isfile(report):
        with open(report) as file:
            parsed = json.load(file)
        os.remove(report)
    return seconds, completed.returncode, parsed
