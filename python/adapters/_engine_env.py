"""Import shims for checking a serving engine's cache manager without the
engine's server: the real manager modules load unchanged; what they import
only incidentally (HTTP clients, image and audio codecs, tokenizers, kernel
compilers) is replaced by a placeholder module *when it is not installed*,
and the re-exporting `__init__` of a few engine packages is skipped (their
submodules still load from the real files). Every name is listed by the
adapter that asks for it (python/README.md, "Real engines").

Nothing here changes a line of the engine's cache code: a placeholder
stands for a module the cache manager never calls. If the manager did call
one, the call would return a placeholder and the adapter's own checks of
the manager's answers (ints, block lists) would fail loudly.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

#: Names replaced by a placeholder in this process (for the adapter's report).
PLACEHOLDERS: list = []


class _AnyMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Placeholder

    def __getitem__(cls, key):
        return Placeholder

    def __or__(cls, other):
        return Placeholder

    def __ror__(cls, other):
        return Placeholder

    def __call__(cls, *args, **kwargs):
        return Placeholder

    def __iter__(cls):
        return iter(())

    def __bool__(cls):
        return False


class Placeholder(metaclass=_AnyMeta):
    """Stands for any name of a placeholder module: a class to subclass or
    annotate with, a callable returning itself, falsy, empty."""

    def __init_subclass__(cls, **kwargs):  # class X(Placeholder, total=False)
        pass

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):  # pydantic models annotated with it
        from pydantic_core import core_schema

        return core_schema.any_schema()


def _placeholder_module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = []
    module.__placeholder__ = True

    def __getattr__(attribute):
        if attribute.startswith("__") and attribute.endswith("__"):
            raise AttributeError(attribute)
        return Placeholder

    module.__getattr__ = __getattr__
    return module


def _importer() -> str:
    """The module name of the code running the import statement."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith("<frozen"):
        frame = frame.f_back
    return frame.f_globals.get("__name__", "") if frame is not None else ""


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names, importers):
        self.names = set(names)
        self.importers = tuple(importers)

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] not in self.names:
            return None
        importer = _importer()
        if not (importer.startswith(self.importers) or importer.split(".")[0] in self.names):
            return None  # torch's own optional imports (triton, ...) stay as they are
        for finder in sys.meta_path:
            if finder is self:
                continue
            try:
                spec = finder.find_spec(fullname, path, target)
            except Exception:
                spec = None
            if spec is not None:
                return None  # installed: the real module
        PLACEHOLDERS.append(fullname)
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return _placeholder_module(spec.name)

    def exec_module(self, module):
        pass


def placeholders_for_missing(names, importers) -> None:
    """Modules named (by their top-level package) load as placeholders when
    they are not installed and the engine's own code (a module whose name
    starts with one of `importers`) imports them; installed ones load as
    usual, and so does every import by anything else (torch's optional
    imports stay ImportErrors)."""
    sys.meta_path.append(_Finder(names, importers))


def skip_package_init(package: str) -> None:
    """`package` becomes importable without running its __init__.py: its
    submodules load from the real files; a name the __init__ would have
    re-exported is a Placeholder (recorded in PLACEHOLDERS)."""
    if package in sys.modules:
        return
    parent, _, leaf = package.rpartition(".")
    if parent:
        importlib.import_module(parent)
        directory = os.path.join(os.path.dirname(sys.modules[parent].__file__), leaf)
    else:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ImportError(f"{package} is not installed (set PYTHONPATH to its environment)")
        directory = list(spec.submodule_search_locations)[0]
    module = types.ModuleType(package)
    module.__path__ = [directory]
    module.__file__ = os.path.join(directory, "__init__.py")
    module.__skipped_init__ = True

    def __getattr__(attribute, package=package):
        if attribute.startswith("__") and attribute.endswith("__"):
            raise AttributeError(attribute)
        try:
            return importlib.import_module(f"{package}.{attribute}")
        except ImportError:
            PLACEHOLDERS.append(f"{package}.{attribute}")
            return Placeholder

    module.__getattr__ = __getattr__
    sys.modules[package] = module
    if parent:
        setattr(sys.modules[parent], leaf, module)


def placeholder_engine_modules(names) -> None:
    """Engine modules that hold only GPU kernels (triton, CUDA) and that
    the cache manager's modules import for other caches' sake: each loads
    as a placeholder (recorded in PLACEHOLDERS)."""
    for name in names:
        if name not in sys.modules:
            sys.modules[name] = _placeholder_module(name)
            PLACEHOLDERS.append(name)
