"""Where jobs run: one :class:`~tune_magic.schedulers.base.Scheduler` per engine, found by name.

Built in: ``local`` (a supervisor process per job on this machine) and ``slurm`` (one batch job,
any number of nodes). Any installed package adds its own through a Python entry point in the group
``tune_magic.schedulers`` (as ipyparallel registers its launchers and torchx its schedulers)::

    [project.entry-points."tune_magic.schedulers"]
    mine = "my_package.scheduler:MyScheduler"

Its name then works in ``%%tune_run --scheduler mine``, ``tune-magic run``, the panel and
``tune_magic.launch(scheduler="mine", **its_options)``, with the options it declares. Everything
above this package (``Job``, listings, magics, views, the CLI) goes through the interface and never
asks which scheduler a job has. Implementations are imported on first use.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from typing import Any, Mapping

from tune_magic.errors import PlanError
from tune_magic.schedulers.base import Scheduler, SchedulerOptions

#: The entry-point group other packages register schedulers in.
ENTRY_POINT_GROUP = "tune_magic.schedulers"
#: Environment variable naming the default scheduler.
SCHEDULER_ENV = "TUNE_MAGIC_SCHEDULER"

# name -> "module:class"; these are also declared as entry points in pyproject.toml, and listed here
# so a source checkout that was never installed still has them
_BUILTIN = {
    "local": "tune_magic.schedulers.local:LocalScheduler",
    "slurm": "tune_magic.schedulers.slurm:SlurmScheduler",
}
_cache: dict[str, Scheduler] = {}


@functools.lru_cache(maxsize=1)
def _implementations() -> dict[str, Any]:
    """name -> "module:class" or an entry point, built-in ones first (an entry point may not
    replace a built-in scheduler: that is warned about and ignored)."""
    from importlib.metadata import entry_points

    found: dict[str, Any] = dict(_BUILTIN)
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        if ep.name in _BUILTIN:
            if ep.value != _BUILTIN[ep.name]:
                warnings.warn(f"entry point {ep.name} = {ep.value} in group {ENTRY_POINT_GROUP} is ignored: "
                              f"{ep.name} is a built-in scheduler", RuntimeWarning, stacklevel=2)
            continue
        if not ep.name.isidentifier():
            warnings.warn(f"scheduler entry point {ep.name!r} ({ep.value}) is ignored: a scheduler name is one "
                          "word (letters, digits, _)", RuntimeWarning, stacklevel=2)
            continue
        found[ep.name] = ep
    return found


def refresh() -> None:
    """Forget the schedulers found so far (e.g. after installing a package that adds one)."""
    _implementations.cache_clear()
    _cache.clear()
    options.cache_clear()


def names() -> tuple[str, ...]:
    """The scheduler names, ``local`` first, then the built-in ones, then the installed ones."""
    return tuple(_implementations())


def get(name: str) -> Scheduler:
    """Return the scheduler called ``name`` (one instance per process).

    Raises:
        KeyError: no such scheduler (callers validate user input first: :func:`check_name`).
        TypeError: the entry point does not name a :class:`Scheduler` subclass.
    """
    sched = _cache.get(name)
    if sched is None:
        target = _implementations()[name]
        if isinstance(target, str):
            module, _, cls = target.partition(":")
            loaded = getattr(importlib.import_module(module), cls)
        else:
            loaded = target.load()
        if not (isinstance(loaded, type) and issubclass(loaded, Scheduler)):
            raise TypeError(f"scheduler {name!r} ({target}) is not a tune_magic.schedulers.base.Scheduler subclass")
        sched = loaded()
        if sched.name != name:
            raise TypeError(f"scheduler {name!r} ({target}) calls itself {sched.name!r}; the entry point's name and "
                            "the class's name attribute must agree")
        _cache[name] = sched
    return sched


class MissingScheduler(Scheduler):
    """Stands in for a scheduler a record names but this installation lacks (a package that
    added it was uninstalled): its jobs stay listed as they were recorded, and acting on them
    says what to install."""

    def __init__(self, name: str) -> None:
        self.name = name

    def _refuse(self, *_: Any) -> Any:
        from tune_magic.errors import UserError

        raise UserError(f"this job runs on scheduler {self.name!r}, which is not installed here (no entry point "
                        f"{self.name} in group {ENTRY_POINT_GROUP}); install the package that provides it to act on "
                        "the job")

    prepare = submit = cancel = _refuse

    def describe(self, job_dir, record) -> dict[str, Any]:
        return {}

    def has_live_parts(self, job_dir, record) -> bool:
        return bool(record is not None and record.state.is_live)


def get_or_missing(name: str) -> Scheduler:
    """:func:`get`, or a :class:`MissingScheduler` for a name this installation does not have."""
    try:
        return get(name)
    except (KeyError, ImportError, TypeError, AttributeError):
        return MissingScheduler(name)


def default_name(env: Mapping[str, str]) -> str:
    """The scheduler used when none is given: ``$TUNE_MAGIC_SCHEDULER`` or ``local``."""
    return (env.get(SCHEDULER_ENV) or "local").strip() or "local"


def check_name(name: Any, source: str = "--scheduler") -> str:
    """Return ``name`` if it names a scheduler.

    Raises:
        PlanError: anything else; ``nccl``/``gloo`` get a word on the difference.
    """
    known = names()
    if isinstance(name, str) and name in known:
        return name
    listed = ", ".join(known[:-1]) + f" or {known[-1]}" if len(known) > 1 else known[0]
    if isinstance(name, str) and name.lower() in ("nccl", "gloo", "mpi", "ucc", "xccl", "c10d", "static", "etcd"):
        raise PlanError(f"{source} {name!r}: a scheduler is where the job runs ({listed}); "
                        f"{name} is a communication or rendezvous backend, which the recipe's config and torchrun's "
                        "--rdzv-backend choose")
    raise PlanError(f"{source} {name!r} is not a scheduler; use {listed}")


@functools.lru_cache(maxsize=1)
def options() -> tuple[tuple[str, tuple], ...]:
    """Every scheduler's own options: ``((scheduler name, (Option, ...)), ...)``.

    A flag two schedulers declare must mean the same there (same name and kind); a scheduler option
    that would shadow a generic own option (``--name``, ``--gpus``, ...) or disagree with another
    scheduler's is warned about and left out.
    """
    from tune_magic.plan.options import GENERIC

    seen = {o.flag: ("tune_magic", o) for o in GENERIC}
    out = []
    for name in names():
        kept = []
        try:
            declared = get(name).options
        except (ImportError, TypeError, AttributeError) as exc:  # a broken package never breaks the others
            warnings.warn(f"scheduler {name} cannot be loaded ({exc}); it is left out", RuntimeWarning, stacklevel=2)
            continue
        for opt in declared:
            owner, other = seen.get(opt.flag, (None, None))
            if other is not None and (owner == "tune_magic" or (other.name, other.kind) != (opt.name, opt.kind)):
                warnings.warn(f"scheduler {name}'s option {opt.flag} is left out: {owner} has an option "
                              f"{opt.flag} of another meaning", RuntimeWarning, stacklevel=2)
                continue
            seen.setdefault(opt.flag, (name, opt))
            kept.append(opt)
        out.append((name, tuple(kept)))
    return tuple(out)


def all_options() -> tuple:
    """Every scheduler option once (by flag), in scheduler order: what a command's parser accepts."""
    return tuple({o.flag: o for _, opts in options() for o in opts}.values())


def owners(option_name: str) -> list[str]:
    """The schedulers that have an option called ``option_name``."""
    return [name for name, opts in options() if any(o.name == option_name for o in opts)]


def read_options(scheduler: str | None = None, env: Mapping[str, str] | None = None,
                 **values: Any) -> SchedulerOptions:
    """Check a launch's scheduler and that scheduler's own options; return them read.

    Args:
        scheduler: the scheduler's name; default ``$TUNE_MAGIC_SCHEDULER`` or ``local``.
        env: the caller's environment (for the default and the scheduler's checks).
        values: option name -> value as given (``None``: not given).

    Raises:
        PlanError: an unknown scheduler; an option of another scheduler (saying which); an option
            no scheduler has; a value of the wrong form (the option's row says the fix).
    """
    import os

    env = os.environ if env is None else env
    name = check_name(scheduler if scheduler is not None else default_name(env),
                      "--scheduler" if scheduler is not None else SCHEDULER_ENV)
    sched = get(name)
    mine = {o.name: o for o in dict(options()).get(name, ())}
    given = {k: v for k, v in values.items() if v is not None}
    foreign = [k for k in given if k not in mine]
    if foreign:
        raise PlanError(_foreign_message(sched, foreign))
    read = {k: mine[k].read(v) for k, v in given.items()}
    return SchedulerOptions(name, sched.check_options(read, env))


def _foreign_message(sched: Scheduler, foreign: list[str]) -> str:
    by_name = {o.name: (s, o) for s, opts in options() for o in opts}
    known = [k for k in foreign if k in by_name]
    if not known:
        mine = ", ".join(o.name for o in sched.options) or "none"
        return (f"{', '.join(foreign)}: no scheduler has such an option (the options of {sched.name}: {mine}); "
                "check the spelling")
    flags = ", ".join(by_name[k][1].flag for k in known)
    where = sorted({by_name[k][0] for k in known})
    hint = f"; {sched.foreign_option_hint}" if sched.foreign_option_hint else ""
    return (f"{flags}: {'options' if len(known) > 1 else 'an option'} of --scheduler {' / '.join(where)}, not of "
            f"{sched.name}: add --scheduler {where[0]}{hint}")


__all__ = ["MissingScheduler", "Scheduler", "SchedulerOptions", "all_options", "check_name", "default_name", "get",
           "get_or_missing", "names", "options", "owners", "read_options", "refresh"]
