"""A simulated power cut for an adapter's dump_interrupted: kvcheck's
dump-safe property asks an engine to dump and "lose power" after a number
of bytes, then checks that the previous dump is still readable.

`power_cut(module, bytes_budget)` runs a block with the file functions the
engine's module uses replaced: a file opened for writing keeps only the
bytes that fit in the budget and loses the rest, and from the moment the
budget is spent every flush, fsync, rename, replace, remove and new file
raises PowerCut, a BaseException, so that no `except Exception` and no
clean-up in the engine runs: the disk stays exactly as the cut left it,
temporary files included. The block ends quietly at the cut.

Writes past the budget are lost silently rather than raising, because a
serializer in C (torch.save's zip writer) cannot unwind through an error
in the middle of a write: it aborts the process when it later tries to
finish the file. The cut shows at the first operation after the write.

    def dump_interrupted(self, directory, bytes_budget):
        with power_cut(activation_memory, bytes_budget):
            self.store.dump(directory)

It patches the module's globals `open` and `os` only (the names a module
that does `import os` and calls `open` looks up), and puts them back after.
A module that writes through other functions (pathlib, shutil, a C
extension writing by path) needs its own simulation.
"""

from __future__ import annotations

import builtins
import contextlib
import os as _os
import types
from typing import Iterator


class PowerCut(BaseException):
    """The power is gone: nothing after it may run."""


class _Budget:
    def __init__(self, bytes_budget: int):
        self.left = max(0, int(bytes_budget))
        self.cut = False

    def spend(self, size: int) -> int:
        """How many of `size` bytes fit; the power is cut when some do not."""
        if size <= self.left:
            self.left -= size
            return size
        fits = self.left
        self.left = 0
        self.cut = True
        return fits


class _CuttingFile:
    """A file open for writing whose writes stop at the budget."""

    def __init__(self, file, budget: _Budget):
        self._file = file
        self._budget = budget

    def write(self, data):
        view = memoryview(data).cast("B")
        fits = self._budget.spend(len(view))
        if fits:
            self._file.write(view[:fits])
            if self._budget.cut:
                self._file.flush()
        return len(view)

    def flush(self):
        if self._budget.cut:
            raise PowerCut()
        self._file.flush()

    def fileno(self):
        return self._file.fileno()

    def close(self):
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._file.close()
        return False

    def __getattr__(self, name):
        return getattr(self._file, name)


def _os_proxy(budget: _Budget) -> types.ModuleType:
    proxy = types.ModuleType("os")
    proxy.__dict__.update(_os.__dict__)

    def guarded(function):
        def call(*args, **kwargs):
            if budget.cut:
                raise PowerCut()
            return function(*args, **kwargs)

        return call

    for name in ("rename", "replace", "remove", "unlink", "fsync", "write", "rmdir", "makedirs", "mkdir"):
        setattr(proxy, name, guarded(getattr(_os, name)))
    return proxy


@contextlib.contextmanager
def power_cut(module: types.ModuleType, bytes_budget: int) -> Iterator[None]:
    """Runs the block with `module`'s file writes cut after `bytes_budget`
    bytes (see the module doc); PowerCut ends the block quietly."""
    budget = _Budget(bytes_budget)
    real_open = builtins.open

    def cutting_open(file, mode="r", *args, **kwargs):
        opened = real_open(file, mode, *args, **kwargs)
        if any(flag in mode for flag in "wax+"):
            if budget.cut:
                opened.close()
                raise PowerCut()
            return _CuttingFile(opened, budget)
        return opened

    missing = object()
    saved = {name: module.__dict__.get(name, missing) for name in ("open", "os")}
    module.open = cutting_open
    if saved["os"] is not missing:
        module.os = _os_proxy(budget)
    try:
        yield
    except PowerCut:
        pass
    finally:
        for name, value in saved.items():
            if value is missing:
                module.__dict__.pop(name, None)
            else:
                setattr(module, name, value)
