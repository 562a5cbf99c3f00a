"""Shared set-up of the adapter protocol's tests: import paths, the kvcheck
binary, a command runner, and scratch directories removed afterwards.

The kvcheck binary is $KVCHECK (ctest sets it), else the default build's."""

import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
REPO = os.path.dirname(PYTHON_DIR)
EXAMPLE = os.path.join(PYTHON_DIR, "examples", "activation_memory_adapter.py")
STRICT_EXAMPLE = os.path.join(PYTHON_DIR, "examples", "strict_memory_adapter.py")
FAULT_ADAPTER = os.path.join(HERE, "fault_adapter.py")
# The interpreter of the adapter processes these tests start: the one running
# the tests (ctest runs them under Debian's torch 1.13 and under .venv's
# torch 2.x), also kvcheck's default for .py adapters ($KVCHECK_PYTHON).
ADAPTER_PYTHON = sys.executable
os.environ["KVCHECK_PYTHON"] = ADAPTER_PYTHON

for path in (PYTHON_DIR, os.path.join(PYTHON_DIR, "examples"), HERE):
    if path not in sys.path:
        sys.path.insert(0, path)

from activation_memory import BUG_PROPERTIES  # noqa: E402,F401 - the tests' map of bug -> property


# ---- request-level tests: the example store behind the SDK's request loop ----

def new_server(bugs=()):
    """The example store's adapter (with `bugs` planted) behind the SDK's
    request loop, after its hello: (server, hello reply)."""
    import activation_memory_adapter
    from kvcheck_adapter import protocol
    from kvcheck_adapter.adapter import Server

    server = Server(lambda: activation_memory_adapter.ActivationMemoryAdapter(bugs))
    hello = server.handle({"op": "hello", "protocol": protocol.PROTOCOL_VERSION})
    assert hello["ok"]
    return server, hello


def cache_json(spec):
    """A cache spec of kvcheck's text format, as a request carries it."""
    from kvcheck_adapter import content, wire

    return wire.content_json(content.expand(content.parse_cache_spec(spec)))


def handle_facts(reply, handle):
    """The facts a reply observed of `handle`."""
    return next(f for f in reply["observed"]["handles"] if f["handle"] == handle)


def kvcheck_binary():
    found = os.environ.get("KVCHECK") or os.path.join(REPO, "build", "default", "bin", "kvcheck")
    if not os.path.isfile(found):
        pytest.skip(f"no kvcheck binary at {found} (build it, or set $KVCHECK)")
    return found


@pytest.fixture
def scratch_dir():
    """A temporary directory, removed with everything in it after the test."""
    directory = tempfile.mkdtemp(prefix="kvcheck-adapter-test-")
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


class Run:
    def __init__(self, completed, report):
        self.status = completed.returncode
        self.stdout = completed.stdout
        self.stderr = completed.stderr
        # `kvcheck run --report json` writes one report for all adapters;
        # these tests run one, so Run.report is that adapter's part.
        self.whole_report = report
        self.report = report["adapters"][0] if report and report.get("adapters") else report

    def result(self, property_id):
        return next(p for p in self.report["properties"] if p["id"] == property_id)

    def of(self, source):
        """The run as the adapter given as `source` saw it, of a run of
        several adapters (exactly one has that source): the same status and
        output, Run.report that adapter's part."""
        parts = [a for a in self.whole_report["adapters"] if a["source"] == source]
        assert len(parts) == 1, (source, [a["source"] for a in self.whole_report["adapters"]])
        seen = copy.copy(self)
        seen.report = parts[0]
        return seen

    def part(self, source):
        """The results (by property id) of the adapter given as `source`,
        of a run of several adapters."""
        return {p["id"]: p for p in self.of(source).report["properties"]}

    def applicable(self):
        """The properties that apply to the adapter: not those of the other
        cache family, whose verdict is n/a (skipped, "n/a: ...")."""
        return [p for p in self.report["properties"] if not is_other_family(p)]


def is_other_family(result):
    """A property of the other cache family: no job ran (docs/semantics.md)."""
    return result["verdict"] == "skipped" and (result["message"] or "").startswith("n/a")


def kvcheck_runner(directory):
    """Runs `kvcheck ARGS...` in `directory` (traces go to its traces/);
    for `run`, with a JSON report, parsed into Run.report."""
    binary = kvcheck_binary()

    def run(*args, timeout=900):
        args = list(args)
        report_path = None
        if args and args[0] == "run":
            report_path = os.path.join(directory, "report.json")
            args += ["--report", "json", "--out", report_path, "--quiet", "--trace-dir", os.path.join(directory, "traces")]
        completed = subprocess.run([binary] + args, cwd=directory, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, timeout=timeout)
        report = None
        if report_path and os.path.isfile(report_path):
            with open(report_path) as file:
                report = json.load(file)
        return Run(completed, report)

    run.directory = directory
    return run


@pytest.fixture
def kvcheck(scratch_dir):
    """kvcheck_runner in the test's scratch directory."""
    return kvcheck_runner(scratch_dir)


@pytest.fixture(scope="module")
def kvcheck_module():
    """kvcheck_runner in a directory of the module's, removed after its
    last test: for a run whose result several tests read (CI time: a
    search through an adapter process made once, not once a test). A test
    that writes files of its own uses its scratch_dir beside it."""
    directory = tempfile.mkdtemp(prefix="kvcheck-adapter-test-")
    try:
        yield kvcheck_runner(directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def adapter_arguments(adapters):
    """`--adapter A --adapter B ...`: the adapters of one kvcheck run."""
    return [argument for adapter in adapters for argument in ("--adapter", adapter)]


def bug_searches(kvcheck, script, bugs, *options):
    """Each bug's search of `script` (run with --bug BUG) on the property
    that names it in `bugs` (bug -> property), with `options`, run when a
    test first asks and then kept: the bugs caught by one property are
    searched in one kvcheck run, an adapter each (CI time: a kvcheck start
    per property, not per bug; an adapter's traces are the same whichever
    adapters run beside it). search(bug) is the run as that bug's adapter
    saw it."""
    runs = {}

    def search(bug):
        prop = bugs[bug]
        if prop not in runs:
            adapters = [f"{script} --bug {other}" for other in sorted(bugs) if bugs[other] == prop]
            runs[prop] = kvcheck("run", *adapter_arguments(adapters), "--property", prop, *options)
        return runs[prop].of(f"exec:{ADAPTER_PYTHON} {script} --bug {bug}")

    search.directory = kvcheck.directory
    return search
