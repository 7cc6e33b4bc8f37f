"""What an action is, and the registry of actions a worker can run.

An action turns one plan step into an effect on an outside system. It states its end state
(never a delta), and brings the read-only parts that make recovery possible:

* ``snapshot``: the before_state, recorded with the intent (and used to unwind);
* ``preconditions``: gates checked before executing, again on every resume;
* ``probe``: asks the target whether the intended end state holds *and was made by us*.

An action without a probe cannot be registered: a step whose completion cannot be established
after the fact can never be resumed safely.

This is the public action API: docs/writing-an-action.md builds one from nothing. An installed
package registers its Action subclass in the entry point group ``tidemark.actions`` and binds it
with a classmethod ``from_env(env) -> Action | None`` (see tidemark/plugins.py); the write
client lives only in the attributes ``write_attrs`` names, and tools.kit.testing checks
that the read-only parts never reach it.
"""

from __future__ import annotations

import enum
import importlib
import importlib.util
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

from tidemark.errors import ActionNotConfigured, ActionUnavailable, PlanError


class ProbeStatus(enum.StrEnum):
    DONE = "done"
    ABSENT = "absent"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class ProbeResult:
    """A probe's answer about one step's target.

    ``observed`` is what the target showed; it becomes the step's outcome when the status is
    ``done``. ``reason`` says in words why (shown to the operator)."""

    status: ProbeStatus
    observed: dict[str, Any] = field(default_factory=dict)
    reason: str = ""

    @classmethod
    def done(cls, observed: dict[str, Any], reason: str = "") -> ProbeResult:
        return cls(ProbeStatus.DONE, observed, reason)

    @classmethod
    def absent(cls, reason: str, observed: dict[str, Any] | None = None) -> ProbeResult:
        return cls(ProbeStatus.ABSENT, observed or {}, reason)

    @classmethod
    def unknown(cls, reason: str, observed: dict[str, Any] | None = None) -> ProbeResult:
        return cls(ProbeStatus.UNKNOWN, observed or {}, reason)

    def as_json(self) -> dict[str, Any]:
        return {"status": str(self.status), "observed": self.observed, "reason": self.reason}


@dataclass(frozen=True)
class StepContext:
    """Everything an action may know about the step it serves.

    ``started_at`` and ``before_state`` are set once the intent exists (for ``execute``,
    ``probe`` and ``compensate``); ``preconditions`` and ``snapshot`` run before it and see None.
    ``outcome`` is set only for ``compensate``. ``staged`` is the handle ``stage`` returned
    (e.g. a draft's id) once it is journaled; None before that, or for actions that do not stage.
    ``sent_at`` is the journal's mark that an earlier attempt's effect request may have left
    (tidemark.wire; None: none did), and ``answered`` whether that attempt reported back
    afterwards (its request can no longer leave later).
    """

    task_id: str
    step: int
    action: str
    args: dict[str, Any]
    key: str
    started_at: datetime | None = None
    before_state: dict[str, Any] | None = None
    outcome: dict[str, Any] | None = None
    staged: dict[str, Any] | None = None
    sent_at: datetime | None = None
    answered: bool = False


# -- arguments ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Arg:
    """One argument of an action.

    Its JSON type, whether it is required, and an optional ``check`` that returns the normalised
    value or raises ValueError with a clear message."""

    type: type | tuple[type, ...]
    required: bool = True
    check: Callable[[Any], Any] | None = None


def nonempty_str(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


def address_list(value: str | list[Any]) -> list[str]:
    """A single address or a list of them, normalised to a non-empty list of addresses."""
    items = [value] if isinstance(value, str) else value
    if not items:
        raise ValueError("must name at least one address")
    for item in items:
        if not isinstance(item, str) or not re.fullmatch(r"[^@\s<>,]+@[^@\s<>,]+", item):
            raise ValueError(f"{item!r} is not a mail address")
    return list(items)


_JSON_TYPE_NAMES = {str: "string", int: "integer", bool: "boolean", list: "list", dict: "object",
                    float: "number"}


def _type_name(t: type | tuple[type, ...]) -> str:
    types = t if isinstance(t, tuple) else (t,)
    return " or ".join(_JSON_TYPE_NAMES.get(x, x.__name__) for x in types)


class GateRefused(Exception):
    """Raised by ``Action.preconditions`` with the reason the gate refused the step."""


# -- actions --------------------------------------------------------------------------------

class Action:
    """Base class of every action.

    Subclasses set ``name``, ``irreversible``, ``args`` and implement ``execute`` and ``probe``;
    reversible actions also implement ``compensate``.

    Instances are handed their clients by whoever builds the worker; the class-level parts
    (name, args, ``describe``) are enough to validate a plan without any client.
    """

    name: ClassVar[str]
    irreversible: ClassVar[bool]
    args: ClassVar[dict[str, Arg]]

    # The longest one ``execute`` (or ``stage``) call can take, client timeouts included. The
    # attempt's lease is written to cover it before the call, so a twin never probes while the
    # call may still be in flight, whether or not the lease is renewed.
    deadline_s: float = 60.0
    # How long after a request left us the target may still apply it (a provider that keeps
    # working on a request after our client gave up). After an ambiguous failure, *absent* is
    # not trusted until this has passed. 0 for targets that fence (an idempotency key, a
    # draft that can be sent only once).
    horizon_s: float = 0.0
    # Whether the target's own fence may let a request of this action that leaves late (its
    # process frozen past its lease: a GC pause, swap, a paused VM) change the target after a
    # twin acted: Drive has no idempotency key, and Graph's second send of a draft it still
    # keeps in Drafts is undocumented. Then the attempt journals the moment just before its
    # effect request leaves (tidemark.wire), and while that mark stands unanswered a probe's
    # *absent* is no verdict (tidemark.attempt.resolve_in_doubt): a request that may have left
    # is never repeated without proof. It costs such a step one more round trip to Postgres.
    marks_sends: ClassVar[bool] = False
    # The attributes of a bound instance that hold a client able to write. Only ``stage``,
    # ``execute`` and ``compensate`` may use them; ``probe``, ``snapshot`` and
    # ``preconditions`` read through the read-only client, and tools.kit.testing enforces it by
    # replacing these attributes with a client that raises while those run. Keep the write
    # client in these attributes only (no helper object built around it).
    write_attrs: ClassVar[tuple[str, ...]] = ("writer",)

    @classmethod
    def validate_args(cls, args: Any, where: str) -> dict[str, Any]:
        """Returns the normalised arguments, or raises PlanError naming the bad field."""
        if not isinstance(args, dict):
            raise PlanError(where, f"must be an object, got {type(args).__name__}")
        unknown = sorted(set(args) - set(cls.args))
        if unknown:
            raise PlanError(f"{where}.{unknown[0]}",
                            f"{cls.name} takes no argument {unknown[0]!r} "
                            f"(it takes: {', '.join(sorted(cls.args))})")
        out: dict[str, Any] = {}
        for name, spec in cls.args.items():
            if name not in args:
                if spec.required:
                    raise PlanError(f"{where}.{name}", f"{cls.name} requires {name!r}")
                continue
            value = args[name]
            # bool is an int in Python; JSON keeps them apart and so do we.
            wrong_bool = isinstance(value, bool) and bool not in (
                spec.type if isinstance(spec.type, tuple) else (spec.type,))
            if wrong_bool or not isinstance(value, spec.type):
                raise PlanError(f"{where}.{name}",
                                f"must be {_type_name(spec.type)}, got {type(value).__name__}")
            if spec.check is not None:
                try:
                    value = spec.check(value)
                except ValueError as e:
                    raise PlanError(f"{where}.{name}", str(e)) from None
            out[name] = value
        return out

    @classmethod
    def describe(cls, args: dict[str, Any]) -> str:
        """A short human line for summaries, e.g. ``draft.txt -> final.txt``."""
        return ", ".join(f"{k}={v}" for k, v in sorted(args.items()))

    @classmethod
    def target(cls, args: dict[str, Any]) -> str | None:
        """The one outside thing a step sets to its end state, or None.

        The one thing outside that a step with ``args`` sets to its end state (a Drive
        file's id), or None when the action cannot say. Two steps of one plan with the same
        target set it in turn: the later one's state is what must show at the end, and the
        earlier one's probe no longer answers done (tidemark.boundary)."""
        return None

    @classmethod
    def names_targets(cls) -> bool:
        """Whether ``target`` may name anything: an action that keeps the default never does."""
        return cls.target.__func__ is not Action.target.__func__  # type: ignore[attr-defined]

    @classmethod
    def compensable(cls) -> bool:
        return cls.compensate is not Action.compensate

    # Read-only parts. Defaults: no gate, empty before_state.
    def preconditions(self, ctx: StepContext) -> None:
        """Raises GateRefused with a reason when the step must not run. Default: no gate."""

    def snapshot(self, ctx: StepContext) -> dict[str, Any]:
        return {}

    def plan_gate(self, task_id: str, steps: list[tuple[int, dict[str, Any]]]) -> None:
        """A gate over all of this action's steps in one plan, e.g. a budget per task.

        ``steps`` holds (step number, args) of every step of this action. Raises GateRefused.
        It runs before a task's first step and again whenever the task is started again.
        Default: no gate.
        """

    def probe(self, ctx: StepContext) -> ProbeResult:
        raise NotImplementedError

    def check_identity(self) -> dict[str, Any]:
        """Proves that the read-only credential reads the account the write one writes.

        Called when a worker binds the action. Checks the account (mailbox, Drive user, Stripe
        account and mode) and returns what it saw. Raises ConfigError on a mismatch: a probe
        reading a foreign account would answer *absent* for every step. Default: nothing to
        check."""
        return {}

    # Side-effecting parts.
    @property
    def stages(self) -> bool:
        """Whether the action has a ``stage`` of its own.

        Only such an action's call may begin with a statement of the journal (its staged
        handle)."""
        return type(self).stage is not Action.stage

    def stage(self, ctx: StepContext) -> dict[str, Any] | None:
        """Optional first half of ``execute``: creates a handle that can be consumed once.

        For targets that can fence at the provider: returns a handle such as a mail draft. run_step
        journals it before calling ``execute``, which then consumes exactly that handle (sends the
        draft by id). Called after the intent, only while the step has no journaled handle.
        Default: no staging (returns None)."""
        return None

    def execute(self, ctx: StepContext) -> dict[str, Any]:
        raise NotImplementedError

    # Whether ``execute_async`` waits on the target without a thread (an asynchronous client).
    # The step's activity then awaits it on the worker's event loop, so a step waiting on a
    # slow provider costs the worker neither a thread nor a connection; everything around the
    # call (the journal, gates, snapshot, probe, stage) still runs on the worker's step threads.
    # False: ``execute`` runs on a step thread, as every other part does.
    awaits: ClassVar[bool] = False

    async def execute_async(self, ctx: StepContext) -> dict[str, Any]:
        """``execute`` as a coroutine, for an action that ``awaits``.

        The same request, stamped with the same key, answering or raising as ``execute`` would
        (Refused, Unauthorized, TargetUnavailable). It must never block the event loop (a blocking
        part, such as reading a task's grant, runs in ``asyncio.to_thread``), and it is cancelled
        like any coroutine: a request cancelled after it left is in doubt, as a lost answer is."""
        raise NotImplementedError(f"{self.name} does not await its call")

    def compensate(self, ctx: StepContext) -> dict[str, Any]:
        raise NotImplementedError


DELTA_VERBS = frozenset({
    "append", "prepend", "add_suffix", "add_prefix", "increment", "decrement", "toggle",
    "shift", "bump", "move_by", "append_suffix", "prepend_prefix",
})


@dataclass(frozen=True)
class ClientLibrary:
    """A provider's client library that an action's module is built on.

    The extra of the ``tidemark`` distribution that installs it (``pip install
    'tidemark[stripe]'``): a base install carries none, so an action's module may be impossible to
    import."""

    what: str  # for people: "the Stripe client"
    extra: str
    # The top-level modules whose absence means the library is missing (top-level only: to
    # find ``a.b`` Python imports ``a``, and installed() imports nothing).
    modules: tuple[str, ...]

    def installed(self) -> bool:
        """Whether every module can be found, without importing any of them.

        Importing costs a second of start-up for Microsoft Graph's alone."""
        for module in self.modules:
            try:
                if importlib.util.find_spec(module) is None:
                    return False
            except ModuleNotFoundError:  # how a finder may say so, too
                return False
        return True

    def lacks(self, missing: str | None) -> bool:
        """Whether a ModuleNotFoundError for ``missing`` is this library's absence.

        A bug of ours must surface as it is."""
        return missing is not None and any(
            m == missing or m.startswith(missing + ".") or missing.startswith(m + ".")
            for m in self.modules)


@dataclass(frozen=True)
class ActionRef:
    """An action known by its name alone, imported on first use.

    ``load`` imports and returns its class when a registry first needs it (``Registry.spec``). A
    command that only reads the journal never imports an action's module, and with it the
    provider's client library it is built on (a second or more of start-up for Google's, Microsoft
    Graph's and Stripe's together). ``needs``: that library, so that its absence is told as the
    extra to install."""

    name: str
    load: Callable[[], type[Action]] = field(compare=False)
    needs: ClientLibrary | None = None

    @classmethod
    def at(cls, name: str, where: str, needs: ClientLibrary | None = None) -> ActionRef:
        """The action ``name`` whose class is ``where`` (``package.module:Class``)."""
        module, _, attr = where.partition(":")

        def load() -> type[Action]:
            loaded: type[Action] = getattr(importlib.import_module(module), attr)
            return loaded

        return cls(name, load, needs)


class Registry:
    """The actions a process knows, by name.

    Classes, bound instances, and references whose class is imported on first use."""

    def __init__(self, actions: Iterable[Action | type[Action] | ActionRef] = ()) -> None:
        self._classes: dict[str, type[Action]] = {}
        self._instances: dict[str, Action] = {}
        self._refs: dict[str, ActionRef] = {}
        for a in actions:
            self.register(a)

    def register(self, action: Action | type[Action] | ActionRef) -> None:
        """Registers an action class, a bound instance, or a reference.

        A class is enough to validate plans, a bound instance to run them; a reference's class is
        checked when it is loaded. Refuses an action without a probe, or a reversible one without
        compensate. The last registration of a name stands for its class."""
        if isinstance(action, ActionRef):
            self._classes.pop(action.name, None)
            self._refs[action.name] = action
            return
        cls = action if isinstance(action, type) else type(action)
        if cls.probe is Action.probe:
            raise TypeError(f"{cls.__name__}: an action without a probe cannot be registered; "
                            "a step that cannot be verified after a crash can never be resumed")
        if cls.execute is Action.execute:
            raise TypeError(f"{cls.__name__}: no execute")
        if not cls.irreversible and not cls.compensable():
            raise TypeError(f"{cls.__name__}: a reversible action must implement compensate")
        self._refs.pop(cls.name, None)
        self._classes[cls.name] = cls
        if not isinstance(action, type):
            self._instances[cls.name] = action

    def spec(self, name: str) -> type[Action] | None:
        cls = self._classes.get(name)
        if cls is not None:
            return cls
        ref = self._refs.get(name)
        return None if ref is None else self._load(ref)

    def _load(self, ref: ActionRef) -> type[Action]:
        """Imports a referenced class and registers it, with the checks of ``register``.

        Raises ActionUnavailable when the client library it needs is not installed."""
        try:
            cls = ref.load()
        except ModuleNotFoundError as e:
            if ref.needs is None or not ref.needs.lacks(e.name):
                raise
            raise ActionUnavailable(ref.name, ref.needs.what, ref.needs.extra) from None
        if not (isinstance(cls, type) and issubclass(cls, Action)):
            raise TypeError(f"action {ref.name!r}: {cls!r} is not an Action subclass")
        if getattr(cls, "name", None) != ref.name:
            raise TypeError(f"action {ref.name!r}: {cls.__name__} is named "
                            f"{getattr(cls, 'name', None)!r}")
        if self._refs.get(ref.name) is ref:  # not replaced meanwhile by a later registration
            self.register(cls)
        return cls

    def names(self) -> list[str]:
        return sorted({*self._classes, *self._refs})

    def bound(self, name: str) -> Action:
        """The runnable instance of an action. Raises ActionNotConfigured if none was bound."""
        try:
            return self._instances[name]
        except KeyError:
            raise ActionNotConfigured(name, sorted(self._instances)) from None
