"""kvcheck from a Python project's own tests: one call that checks an engine
adapter with the kvcheck binary and fails with its report.

    from kvcheck_adapter.testing import check_engine
    from my_store.kvcheck_adapter import MyAdapter

    def test_my_store_keeps_its_caches():
        check_engine(MyAdapter, cases=200)                  # AssertionError with the report on a failure

    def test_the_copy_path():
        check_engine(MyAdapter, args=["--fast"], properties=["single-copy"])

`adapter` is an Adapter subclass or a factory function defined at the top
level of an importable module file (kvcheck runs it in a process of its own:
this module's `--serve` loads the file and serves `adapter(*args,
**kwargs)`), or the path of an adapter script ("my_adapter.py --flag").
The kvcheck binary is `kvcheck`, else $KVCHECK, else `kvcheck` on PATH, else
the build tree's (build/default/bin/kvcheck next to this SDK): see
kvcheck_adapter.locate.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Dict, Iterable, Optional, Sequence, Union

from .locate import locate_kvcheck

_SDK_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class KvcheckError(RuntimeError):
    """kvcheck could not check the adapter at all (it exited with status 2:
    an adapter that fails its handshake, a bad option)."""


def find_kvcheck(kvcheck: Optional[str] = None) -> str:
    """The kvcheck binary to run (kvcheck_adapter.locate: the path given,
    else $KVCHECK, else `kvcheck` on PATH, else the source tree's build);
    KvcheckNotFound (a FileNotFoundError) naming the places looked at, and
    KvcheckMismatch when it speaks another protocol than this SDK."""
    return locate_kvcheck(kvcheck).path


def _adapter_command(adapter: Any, args: Sequence[Any], kwargs: Dict[str, Any]) -> str:
    if isinstance(adapter, str):
        if args or kwargs:
            raise ValueError("args and kwargs go with an adapter class or factory, not with a script path")
        return adapter
    qualname = getattr(adapter, "__qualname__", "")
    module = sys.modules.get(getattr(adapter, "__module__", ""))
    path = getattr(module, "__file__", None)
    if not callable(adapter) or not path or "<locals>" in qualname or "." in qualname:
        raise ValueError(
            f"{adapter!r} cannot be served from another process: give a class or function defined at the top "
            "level of a module file, or the path of an adapter script"
        )
    return " ".join(
        shlex.quote(word)
        for word in [sys.executable, "-m", "kvcheck_adapter.testing", "--serve", os.path.abspath(path), qualname,
                     json.dumps({"args": list(args), "kwargs": kwargs})]
    )


def _failure_text(report: Dict[str, Any]) -> str:
    lines = [f"kvcheck: adapter {report['adapter']} fails (seed {report['seed']})"]
    for result in report["properties"]:
        lines.append(f"  {result['id']:24} {'FAULT' if result.get('fault') else result['verdict']}")
    for result in report["properties"]:
        if result["verdict"] == "blocked":
            lines.append("")
            lines.append(f"== {result['id']}")
            lines.append(f"BLOCKED: {result['id']}: {result.get('message') or ''}")
        if result["verdict"] != "fail":
            continue
        lines.append("")
        lines.append(f"== {result['id']}")
        # Every distinct failure (an engine-error row: every group), each
        # with its trace and the command that replays it.
        for failure in result.get("failures") or [result]:
            count = failure.get("count", 1)
            lines.append(f"ERROR: {result['id']}: {failure.get('message') or ''}" + (f" ({count} traces)" if count > 1 else ""))
            if failure.get("trace"):
                lines.append(failure["trace"].rstrip("\n"))
            if failure.get("reproduce"):
                lines.append(f"reproduce: {failure['reproduce']}")
        if result.get("output"):
            lines.append("the engine's output ended with:")
            lines.append(result["output"])
    return "\n".join(lines)


def check_engine(
    adapter: Union[type, Any, str],
    *,
    args: Sequence[Any] = (),
    kwargs: Optional[Dict[str, Any]] = None,
    properties: Iterable[str] = (),
    cases: int = 100,
    seed: Optional[int] = None,
    jobs: Optional[int] = None,
    timeout_seconds: Optional[float] = None,
    memory_mb: Optional[int] = None,
    kvcheck: Optional[str] = None,
    trace_dir: Optional[str] = None,
) -> Dict[str, Any]:
    """Runs `kvcheck run` on the adapter (every property, or those named)
    and returns the adapter's part of the JSON report (`adapters[0]`: its
    verdicts, one per property and the engine-level rows) when every property
    holds (or is skipped).
    Raises AssertionError with the report (each failure's message, shrunk
    trace, reproducing command and the engine's last output) when one
    fails, and KvcheckError when kvcheck cannot check the adapter.
    Failing traces are written to `trace_dir` (default: a temporary
    directory, removed after; give one to keep them for `kvcheck replay`)."""
    command = [find_kvcheck(kvcheck), "run", "--adapter", "exec:" + _adapter_command(adapter, args, kwargs or {}),
               "--cases", str(cases), "--report", "json", "--quiet"]
    for property_id in properties:
        command += ["--property", property_id]
    if seed is not None:
        command += ["--seed", str(seed)]
    if jobs is not None:
        command += ["--jobs", str(jobs)]
    if timeout_seconds is not None:
        command += ["--timeout", str(timeout_seconds)]
    if memory_mb is not None:
        command += ["--memory-mb", str(memory_mb)]
    scratch = tempfile.mkdtemp(prefix="kvcheck-check-engine-")
    try:
        command += ["--trace-dir", trace_dir or os.path.join(scratch, "traces"), "--out", os.path.join(scratch, "report.json")]
        environment = dict(os.environ)
        # The adapter's process imports what this one can.
        environment["PYTHONPATH"] = os.pathsep.join([_SDK_ROOT] + [p for p in sys.path if p and os.path.isdir(p)])
        finished = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment)
        if finished.returncode not in (0, 1):
            raise KvcheckError(f"kvcheck could not check the adapter (exit status {finished.returncode}):\n{finished.stderr}")
        with open(os.path.join(scratch, "report.json")) as file:
            # One report for the run; check_engine runs one adapter.
            report = json.load(file)["adapters"][0]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if finished.returncode == 1 or any(result["verdict"] == "fail" for result in report["properties"]):
        text = _failure_text(report)
        if trace_dir is None:
            text += "\n(the trace files are removed with the run: pass trace_dir= to keep them for kvcheck replay)"
        raise AssertionError(text)
    return report


def _serve(path: str, qualname: str, arguments: str) -> None:
    """The adapter process of check_engine: loads the module file and
    serves `qualname(*args, **kwargs)` for each engine."""
    from .adapter import serve

    directory = os.path.dirname(path)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    name = os.path.splitext(os.path.basename(path))[0]
    module = sys.modules.get(name)
    if module is None or os.path.abspath(getattr(module, "__file__", "")) != path:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    factory = getattr(module, qualname)
    call = json.loads(arguments)
    serve(lambda: factory(*call["args"], **call["kwargs"]))


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--serve":
        _serve(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit("usage: python -m kvcheck_adapter.testing --serve MODULE_FILE NAME JSON_ARGUMENTS (run by check_engine)")


__all__ = ["KvcheckError", "check_engine", "find_kvcheck"]
