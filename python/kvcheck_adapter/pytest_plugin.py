"""kvcheck as pytest items: each property of an engine adapter is a test.

Installed with the SDK (`pip install ./python`), pytest loads it through
the `pytest11` entry point. Two forms:

    pytest --kvcheck-adapter my_adapter.py [--kvcheck-cases 200] [--kvcheck-seed 7] [-k single-copy]

collects one item per property the adapter can be judged on
(`my_adapter.py::single-copy`, and `engine-error` and `shared-state`, the
engine-level rows), as `kvcheck list --adapter` names them: those of the
other cache family, or judging a capacity it does not declare, are left
out, and a line after collection says how many and why. A pass is PASSED,
a violation is FAILED with kvcheck's shrunk trace, the check's message and
the command that replays it, a property the adapter cannot be judged on
for another reason is SKIPPED.
`--kvcheck-adapter` takes what `kvcheck run --adapter` takes (a script with
its arguments: 'my_adapter.py --bug x'); repeat it for several adapters.
With no test paths given, only the adapters are collected.

A test file can name its adapter itself (the path relative to the file):

    @pytest.mark.kvcheck("my_adapter.py", cases=100)
    def test_my_store(kvcheck_property):
        kvcheck_property.check()

which is parametrized over the properties (`test_my_store[single-copy]`).

kvcheck runs once per adapter and options in a session (`kvcheck run
--report json`), with the properties selected (`-k`, deselection) only,
when the first of its items runs. Failing traces go to --kvcheck-trace-dir
(default kvcheck-traces, as kvcheck run's), where the replay command finds
them. The adapter's Python is this interpreter unless $KVCHECK_PYTHON says
otherwise. JUnit XML comes from pytest's own --junitxml.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import pytest

from .locate import Kvcheck, KvcheckMismatch, KvcheckNotFound, locate_kvcheck

ENGINE_ERROR = "engine-error"
SHARED_STATE = "shared-state"  # engines share state across instances (docs/semantics.md#reproduction)
ENGINE_ROWS = (ENGINE_ERROR, SHARED_STATE)  # engine-level rows: no --property selects them


@dataclass(frozen=True)
class RunKey:
    """One `kvcheck run`: an adapter and the options it is run with."""
    adapter: str      # as kvcheck run --adapter takes it, paths absolute
    cases: Optional[int]
    seed: Optional[int]
    extra: Tuple[str, ...]


def _absolute_adapter(adapter: str, base: str) -> str:
    """`adapter` with its script path made absolute against `base`."""
    if adapter.startswith("exec:"):
        return adapter
    words = shlex.split(adapter)
    if not words:
        raise pytest.UsageError("--kvcheck-adapter is empty: give an adapter script (my_adapter.py [ARGS])")
    if words[0].endswith(".py") or os.sep in words[0]:
        words[0] = os.path.abspath(os.path.join(base, words[0]))
    return " ".join(shlex.quote(word) for word in words)


def _script_of(adapter: str) -> Optional[str]:
    words = [] if adapter.startswith("exec:") else shlex.split(adapter)
    return words[0] if words and os.path.isfile(words[0]) else None


def failure_text(adapter: str, result: Dict, seed: Optional[int] = None) -> str:
    """A failing property's report: each distinct failure's message, what
    else it breaks, its shrunk trace and the command that replays it."""
    lines = [f"kvcheck: {result['id']} fails on {adapter}" + (f" (seed {seed})" if seed is not None else "")]
    for failure in result.get("failures") or [result]:
        count = failure.get("count", 1)
        lines.append(f"ERROR: {result['id']}: {failure.get('message') or result.get('message') or ''}"
                     + (f" ({count} traces)" if count > 1 else ""))
        lines += [f"also: {other}" for other in failure.get("also") or []]
        if failure.get("fault"):
            lines.append(f"fault: {failure['fault']}")
        if failure.get("trace"):
            lines.append("shrunk trace:")
            lines.append(failure["trace"].rstrip("\n"))
        if failure.get("reproduce"):
            lines.append(f"reproduce: {failure['reproduce']}")
        if failure.get("trace_file_error"):
            lines.append(f"the trace was not written: {failure['trace_file_error']}")
        lines.append("")
    if result.get("output"):
        lines.append("the engine's output ended with:")
        lines.append(result["output"].rstrip("\n"))
    return "\n".join(lines).rstrip("\n")


class PropertyOutcome:
    """One property's verdict in a kvcheck run (the JSON report's entry)."""

    def __init__(self, adapter: str, result: Dict, seed: Optional[int] = None):
        self.adapter = adapter
        self.result = result
        self.seed = seed
        self.id = result["id"]
        self.verdict = result["verdict"]

    def check(self) -> None:
        """Passes on a pass; fails with kvcheck's report on a violation or a
        blocked search; skips a property the adapter cannot be judged on."""
        if self.verdict == "pass":
            return
        if self.verdict in ("skipped", "not-run"):
            pytest.skip(f"{self.id}: {self.result.get('message') or self.verdict}")
        if self.verdict == "blocked":
            pytest.fail(f"BLOCKED: {self.id}: {self.result.get('message') or ''}", pytrace=False)
        pytest.fail(failure_text(self.adapter, self.result, self.seed), pytrace=False)


class Runs:
    """The session's kvcheck runs: one per RunKey, run when first needed,
    with the properties its selected items ask for."""

    def __init__(self, config):
        self.config = config
        self.explicit_binary = config.getoption("kvcheck_bin")
        self.trace_dir = os.path.abspath(config.getoption("kvcheck_trace_dir"))
        self.selected: Dict[RunKey, List[str]] = {}
        self.results: Dict[RunKey, Dict] = {}
        self.errors: Dict[RunKey, str] = {}
        self._kvcheck: Optional[Kvcheck] = None
        self._properties: Dict[str, List[Tuple[str, str]]] = {}  # by adapter
        self.left_out: Dict[str, str] = {}  # by adapter: "N properties left out, n/a for this adapter: why"

    def kvcheck(self) -> Kvcheck:
        if self._kvcheck is None:
            try:
                self._kvcheck = locate_kvcheck(self.explicit_binary)
            except (KvcheckNotFound, KvcheckMismatch) as error:
                raise pytest.UsageError(str(error)) from None
        return self._kvcheck

    def select(self, key: RunKey, property_id: str) -> None:
        self.selected.setdefault(key, []).append(property_id)

    def outcome(self, key: RunKey, property_id: str) -> PropertyOutcome:
        if key not in self.results and key not in self.errors:
            self._run(key)
        if key in self.errors:
            pytest.fail(self.errors[key], pytrace=False)
        for result in self.results[key]["properties"]:
            if result["id"] == property_id:
                return PropertyOutcome(key.adapter, result, self.results[key].get("seed"))
        pytest.fail(f"kvcheck's report on {key.adapter} has no property {property_id!r}", pytrace=False)

    def command(self, key: RunKey, report_path: str) -> List[str]:
        command = [self.kvcheck().path, "run", "--adapter", key.adapter, "--report", "json", "--out", report_path,
                   "--quiet", "--trace-dir", self.trace_dir]
        chosen = sorted({p for p in self.selected.get(key, []) if p not in ENGINE_ROWS})
        if chosen and len(chosen) < len(self.properties(key)) - len(ENGINE_ROWS):  # all but the engine-level rows
            for property_id in chosen:
                command += ["--property", property_id]
        if key.cases is not None:
            command += ["--cases", str(key.cases)]
        if key.seed is not None:
            command += ["--seed", str(key.seed)]
        return command + list(key.extra)

    def _environment(self) -> Dict[str, str]:
        environment = dict(os.environ)
        # The adapter runs under this interpreter, which has the SDK.
        environment.setdefault("KVCHECK_PYTHON", sys.executable)
        return environment

    def _run(self, key: RunKey) -> None:
        scratch = tempfile.mkdtemp(prefix="kvcheck-pytest-")
        try:
            command = self.command(key, os.path.join(scratch, "report.json"))
            finished = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=self._environment(), cwd=str(self.config.invocation_params.dir))
            report_path = os.path.join(scratch, "report.json")
            if finished.returncode not in (0, 1) or not os.path.isfile(report_path):
                self.errors[key] = (f"kvcheck could not check {key.adapter} (exit status {finished.returncode}):\n"
                                    f"{finished.stderr.strip()}\ncommand: {shlex.join(command)}")
                return
            with open(report_path) as file:
                self.results[key] = json.load(file)["adapters"][0]
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def properties(self, key: RunKey) -> List[Tuple[str, str]]:
        """(id, summary) of every property the adapter of `key` can be
        judged on, as `kvcheck list --adapter` prints them (its handshake
        says its cache families and capacity), and the engine-level rows
        (engine-error, shared-state). The others are left out: their count
        and why is in left_out."""
        if key.adapter not in self._properties:
            command = [self.kvcheck().path, "list", "--adapter", key.adapter, *_python_option(key.extra)]
            listed = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env=self._environment(), cwd=str(self.config.invocation_params.dir))
            found, in_section = [], False
            for line in listed.stdout.splitlines():
                if line == "properties:":
                    in_section = True
                elif in_section and line.startswith("  "):
                    identifier, _, summary = line.strip().partition(" ")
                    found.append((identifier, summary.strip()))
                elif in_section:
                    in_section = False
                elif " left out, n/a " in line:
                    self.left_out[key.adapter] = line
            if listed.returncode != 0 or not found:
                raise pytest.UsageError(f"`{shlex.join(command)}` named no properties (exit status "
                                        f"{listed.returncode}): {listed.stderr.strip()[:2000]}")
            self._properties[key.adapter] = found + [(ENGINE_ERROR, "engine errors, grouped by message"),
                                                     (SHARED_STATE, "state shared across engine instances")]
        return self._properties[key.adapter]


def _python_option(words) -> List[str]:
    """The --python option among kvcheck run's `words`, for kvcheck list."""
    found = []
    for n, word in enumerate(words):
        if word == "--python" and n + 1 < len(words):
            found = [word, words[n + 1]]
        elif word.startswith("--python="):
            found = [word]
    return found


def _runs(config) -> Runs:
    return config.stash[_RUNS]


_RUNS = pytest.StashKey[Runs]()


# kvcheck run's options the plugin sets itself (Runs.command), with the
# plugin's own option for each where it has one: another value would make
# kvcheck write no JSON report where the plugin reads it.
_OWN_OPTIONS = {"--report": None, "--out": None, "--adapter": "--kvcheck-adapter or the kvcheck marker",
                "--trace-dir": "--kvcheck-trace-dir"}


def _checked_args(words, where: str):
    """`words` for kvcheck run, refused with a usage error when one is an
    option the plugin sets itself."""
    for word in words:
        option = word.split("=", 1)[0]
        if option in _OWN_OPTIONS:
            instead = _OWN_OPTIONS[option]
            raise pytest.UsageError(f"{where} may not hold {option}: the kvcheck plugin sets it itself (it reads "
                                    f"kvcheck's JSON report)" + (f"; use {instead}" if instead else ""))
    return tuple(words)


def _key_from(config, adapter: str, base: str, cases=None, seed=None, extra=()) -> RunKey:
    option_cases = config.getoption("kvcheck_cases")
    option_seed = config.getoption("kvcheck_seed")
    return RunKey(_absolute_adapter(adapter, base),
                  option_cases if option_cases is not None else cases,
                  option_seed if option_seed is not None else seed,
                  _checked_args(extra, "the kvcheck marker's args")
                  + _checked_args(shlex.split(config.getoption("kvcheck_args") or ""), "--kvcheck-args"))


# ---- the command-line form ----------------------------------------------------------------


class AdapterFile(pytest.File):
    """An adapter named by --kvcheck-adapter: one item per property."""

    def __init__(self, *, key: RunKey, **kwargs):
        super().__init__(**kwargs)
        self.key = key

    def collect(self):
        for property_id, summary in _runs(self.config).properties(self.key):
            yield PropertyItem.from_parent(self, name=property_id, summary=summary)


class PropertyItem(pytest.Item):
    def __init__(self, *, summary: str = "", **kwargs):
        super().__init__(**kwargs)
        self.summary = summary

    def runtest(self):
        _runs(self.config).outcome(self.parent.key, self.name).check()

    def reportinfo(self):
        return self.path, None, f"{self.parent.key.adapter}: {self.name}"


# ---- the hooks ----------------------------------------------------------------------------------


def pytest_addoption(parser):
    group = parser.getgroup("kvcheck", "kvcheck: each property of an engine adapter as a test")
    group.addoption("--kvcheck-adapter", action="append", default=[], metavar="ADAPTER",
                    help="check this adapter (a script with its arguments, as kvcheck run --adapter takes it): "
                         "one item per property; repeatable")
    group.addoption("--kvcheck-cases", type=int, default=None, metavar="N", help="traces per property (kvcheck run --cases)")
    group.addoption("--kvcheck-seed", type=int, default=None, metavar="S", help="the run's seed (kvcheck run --seed)")
    group.addoption("--kvcheck-args", default=None, metavar="ARGS",
                    help="more options for kvcheck run, one string ('--seconds 30 --jobs 2')")
    group.addoption("--kvcheck-bin", default=None, metavar="PATH",
                    help="the kvcheck binary (default: $KVCHECK, else kvcheck on PATH)")
    group.addoption("--kvcheck-trace-dir", default="kvcheck-traces", metavar="DIR",
                    help="where failing traces are kept for kvcheck replay (default kvcheck-traces)")


def pytest_configure(config):
    config.addinivalue_line("markers", "kvcheck(adapter, cases=None, seed=None, args=()): check ADAPTER (a path "
                                       "relative to the test file) with kvcheck; the test takes the kvcheck_property "
                                       "fixture, once per property")
    _checked_args(shlex.split(config.getoption("kvcheck_args") or ""), "--kvcheck-args")
    config.stash[_RUNS] = Runs(config)
    adapters = config.getoption("kvcheck_adapter")
    if not adapters:
        return
    base = str(config.invocation_params.dir)
    config._kvcheck_adapter_files = {}
    for adapter in adapters:
        key = _key_from(config, adapter, base)
        script = _script_of(key.adapter)
        if script is None:
            raise pytest.UsageError(f"--kvcheck-adapter {adapter!r}: no adapter script at {shlex.split(adapter)[0]!r}")
        if script in config._kvcheck_adapter_files:
            raise pytest.UsageError(f"--kvcheck-adapter names {script} twice: one run per script (give its "
                                    "variants to separate pytest runs, or use the kvcheck marker)")
        config._kvcheck_adapter_files[script] = key
    # With no test paths given, the adapters alone are collected (not every
    # test under the current directory).
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args[:] = list(config._kvcheck_adapter_files)
    else:
        config.args.extend(script for script in config._kvcheck_adapter_files if script not in config.args)


def pytest_report_collectionfinish(config, items):
    # One line per adapter whose properties of the other cache family (or
    # judging a capacity it does not declare) were not collected, as the
    # text and HTML reports say it.
    runs = _runs(config)
    return [f"kvcheck: {adapter}: {note}" for adapter, note in sorted(runs.left_out.items())]


def pytest_report_header(config):
    runs = _runs(config)
    if config.getoption("kvcheck_adapter") or config.getoption("kvcheck_bin"):
        return f"kvcheck: {runs.kvcheck().describe()}"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path, parent):
    # An adapter script given on the command line is an initial path, which
    # pytest would import as a test module: it is an adapter file instead.
    key = getattr(parent.config, "_kvcheck_adapter_files", {}).get(str(module_path))
    if key is None:
        return None
    # An adapter outside the rootdir is named by its file name (pytest would
    # name it by nothing), and one run with arguments shows them.
    try:
        nodeid = module_path.relative_to(parent.config.rootpath).as_posix()
    except ValueError:
        nodeid = module_path.name
    arguments = shlex.split(key.adapter)[1:]
    if arguments:
        nodeid += "[" + " ".join(arguments) + "]"
    return AdapterFile.from_parent(parent, path=module_path, key=key, nodeid=nodeid)


def pytest_generate_tests(metafunc):
    if "kvcheck_property" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("kvcheck")
    if marker is None:
        raise pytest.UsageError(f"{metafunc.definition.nodeid} takes kvcheck_property but has no "
                                "@pytest.mark.kvcheck(ADAPTER) naming its adapter")
    ids = [property_id for property_id, _ in _runs(metafunc.config).properties(_marker_key(metafunc.definition))]
    metafunc.parametrize("kvcheck_property", ids, ids=ids, indirect=True)


def _marker_key(item_or_request) -> RunKey:
    node = getattr(item_or_request, "node", item_or_request)
    marker = node.get_closest_marker("kvcheck")
    adapter = marker.args[0] if marker.args else marker.kwargs.get("adapter")
    if not adapter:
        raise pytest.UsageError(f"{node.nodeid}: @pytest.mark.kvcheck needs the adapter (a script path)")
    return _key_from(node.config, adapter, os.path.dirname(str(node.path)), marker.kwargs.get("cases"),
                     marker.kwargs.get("seed"), marker.kwargs.get("args", ()))


@pytest.fixture
def kvcheck_property(request) -> PropertyOutcome:
    """The verdict of one property (request.param) on the adapter the
    test's kvcheck marker names; `.check()` passes, fails or skips as it."""
    return _runs(request.config).outcome(_marker_key(request), request.param)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    # After -k and deselection: each run checks the properties still selected.
    runs = _runs(config)
    for item in items:
        if isinstance(item, PropertyItem):
            runs.select(item.parent.key, item.name)
        elif hasattr(item, "callspec") and "kvcheck_property" in item.callspec.params:
            runs.select(_marker_key(item), item.callspec.params["kvcheck_property"])
