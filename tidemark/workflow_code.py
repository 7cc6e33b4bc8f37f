"""The workflow modules' code, compiled once per worker process, not once per workflow run.

Temporal's workflow sandbox gives every workflow run a module namespace of its own: for each run
it starts (a new run, or one evicted from the cache and replayed) it imports the workflow's
module anew. The modules a workflow imports under ``imports_passed_through`` are shared; the
workflow's own module is not, by design, so that no run sees another's module globals.

Importing a module means compiling its source unless a valid bytecode cache lies beside it. The
worker's image sets PYTHONDONTWRITEBYTECODE and holds no ``__pycache__`` for the source it runs
(/app shadows the installed copy), and a checkout run with that variable has none either: every
workflow run compiled workflows/run_plan.py (600 lines) again. On a worker holding hundreds of
steps in flight that compile was 40% of the process's CPU, under the GIL, and what capped the
steps it could start (docs/scaling.md, *What one worker holds*).

:func:`compile_once` puts a finder in front of the import system for the named modules only. It
finds each as the path finder would and gives it a loader that compiles the source the first
time and keeps the code object. The module is still executed afresh for every run (its classes
and globals are the run's own, as the sandbox requires); only the compiling is shared, as a
``.pyc`` would share it. A code object is immutable, so runs in several threads may execute the
same one. The worker's workflow classes are loaded from the same source when it starts: a file
changed under a running worker is not picked up, as it would not be by the classes either.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
from collections.abc import Iterable, Sequence
from types import CodeType, ModuleType

_codes: dict[str, CodeType] = {}  # by source path
_lock = threading.Lock()


class _KeptCodeLoader(importlib.machinery.SourceFileLoader):
    """A source loader that compiles its file once per process."""

    def get_code(self, fullname: str) -> CodeType:
        path = self.get_filename(fullname)
        with _lock:
            code = _codes.get(path)
        if code is None:
            compiled = super().get_code(fullname)
            if compiled is None:  # a source loader always has code; the base type says Optional
                raise ImportError(f"no code for {fullname}", name=fullname)
            with _lock:
                code = _codes.setdefault(path, compiled)
        return code


class CompiledOnce(importlib.abc.MetaPathFinder):
    """Finds the named modules' source and loads it with :class:`_KeptCodeLoader`."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.origin is None or not isinstance(
                spec.loader, importlib.machinery.SourceFileLoader):
            return None  # not a plain source file (a package, a .pyc-only module): as before
        return importlib.util.spec_from_file_location(
            fullname, spec.origin, loader=_KeptCodeLoader(fullname, spec.origin))


def compile_once(modules: Iterable[str]) -> CompiledOnce:
    """From now on, ``modules`` are compiled at most once in this process however often they
    are imported anew. Idempotent: one finder per process, the names added to it."""
    with _lock:
        finder = next((f for f in sys.meta_path if isinstance(f, CompiledOnce)), None)
        if finder is None:
            finder = CompiledOnce()
            sys.meta_path.insert(0, finder)
        finder.names.update(modules)
    return finder
