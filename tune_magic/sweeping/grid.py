"""Sweeps: the grid of trials that a launch's axes make. Pure: nothing is started.

Axes are found by :mod:`tune_magic.config.overrides` (its comma lists and ranges) (override words: comma lists, ``range(...)``) and
:func:`tune_magic.config.cellbody.split_sweep_section` (a YAML cell body's ``sweep:`` mapping); :func:`plan_sweep`
checks them together and builds the trials.

Trials are the cartesian product of the axes, first axis slowest (``itertools.product``): axes
in the order their words appear in the launch (the line, then override lines of the cell body),
then the body's ``sweep:`` axes in their order. Refused before anything starts
(:class:`~tune_magic.errors.PlanError`, naming the fix): sweep mode with no axis; an axis on a
directory the recipe writes (:func:`~tune_magic.config.overrides.refused_axis_key`), or one
``output_dir`` shared by the trials (allowed when it names every axis,
``output_dir=/runs/lr_${optimizer.lr}``); an empty item (``1e-4,,3e-4``, a trailing comma); more
than :data:`MAX_TRIALS` trials (``max_trials`` raises the cap); a key given twice (two axes, or an
axis and a plain override or deletion); a malformed or empty ``range()``; an item the recipe
would not read as typed.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, NamedTuple, Sequence

from tune_magic.errors import PlanError
from tune_magic.config.overrides import parse_range, refused_axis_key, word_axis
from tune_magic.config.shellwords import Word, as_word


@dataclass(frozen=True)
class Axis:
    """One axis of a sweep.

    Attributes:
        key: the override key (``optimizer.lr``).
        texts: each item as an override value, as typed (``"1e-4"``, ``"[q_proj,v_proj]"``,
            ``"'a,b'"``); ``key=text`` passes :func:`~tune_magic.config.launchwords.check_override`.
        values: what a torchtune 0.6.1 recipe reads for each item (``1e-4`` -> ``0.0001``), as
            :func:`tune_magic.config.overrides.recipe_value` gives it; same length as ``texts``.
        source: where it was written, for messages: ``"override"`` or ``"sweep: mapping"``.
        position: index of its word in the launch words, ``None`` for a body ``sweep:`` axis.
    """

    key: str
    texts: tuple[str, ...]
    values: tuple[Any, ...]
    source: str = "override"
    position: int | None = None

    def __len__(self) -> int:
        return len(self.texts)


def axis_from_items(key: str, texts: Sequence[str], source: str, position: int | None, shown: str) -> Axis:
    """Check each item as an override and read its value as the recipe would.

    Args:
        key: the override key.
        texts: the item texts, as typed.
        source: where the axis was written (:attr:`Axis.source`).
        position: its word's index in the launch words, ``None`` for a body ``sweep:`` axis.
        shown: the axis as written, for messages.

    Raises:
        PlanError: an item that :func:`~tune_magic.config.launchwords.check_override` refuses (the
            message names the item).
    """
    from tune_magic.config.launchwords import check_override
    from tune_magic.config.overrides import recipe_value

    values = []
    for i, text in enumerate(texts, 1):
        try:
            check_override(f"{key}={text}")
        except PlanError as exc:
            raise PlanError(f"sweep axis {shown}, item {i} ({text}): {exc}") from None
        values.append(recipe_value(key, text))
    return Axis(key, tuple(texts), tuple(values), source, position)

__all__ = [
    "MAX_TRIALS",
    "Trial",
    "SweepPlan",
    "plan_sweep",
    "short_keys",
    "parse_max_trials",
    "check_sweep_rendezvous",
]

#: Most trials one sweep may have unless the caller raises it (``--max-trials N``).
MAX_TRIALS = 1000

_PLACEHOLDER = "tm_sweep_word_{}"


@dataclass(frozen=True)
class Trial:
    """One point of the grid.

    Attributes:
        index: 0-based, in :class:`SweepPlan` order (the array task index under a job array).
        values: ``{key: value}`` as the recipe reads each item, one per axis, in axis order.
        texts: ``{key: item text}`` as typed, in axis order.
        words: the trial's override words, ``key=text``, one per axis, in axis order.
        name: a label saying its values with short keys (``lr=3e-4,lora_rank=8``); not unique
            when two items read the same, and not an id.
    """

    index: int
    values: dict[str, Any]
    texts: dict[str, str]
    words: tuple[str, ...]
    name: str


@dataclass(frozen=True)
class SweepPlan:
    """The axes of a launch and its trials.

    Attributes:
        words: the launch words as given (``[TORCHRUN-OPTIONS] RECIPE --config CONFIG
            [overrides]``), texts only.
        axes: the axes, in trial order (first axis slowest).
        trials: every trial, ``len == prod(len(axis))``.
        short_keys: ``{key: short key}`` used in trial names.
    """

    words: tuple[str, ...]
    axes: tuple[Axis, ...]
    trials: tuple[Trial, ...] = field(repr=False)
    short_keys: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.trials)

    def args(self, trial: "Trial | int") -> list[str]:
        """Return the launch words of one trial: each axis word replaced in place by the
        trial's override word, and the body's ``sweep:`` axes appended at the end (so they
        override the config overlay, as every override does)."""
        t = self.trials[trial] if isinstance(trial, int) else trial
        out = list(self.words)
        extra = []
        for axis, word in zip(self.axes, t.words):
            if axis.position is None:
                extra.append(word)
            else:
                out[axis.position] = word
        return out + extra


def short_keys(keys: Sequence[str]) -> dict[str, str]:
    """Short names for keys: the last dotted segment, with parent segments added to the keys
    whose short names collide, until none do (``model.lora_rank`` -> ``lora_rank``;
    ``a.x.lr`` and ``b.x.lr`` -> ``a.x.lr`` and ``b.x.lr``).

    Args:
        keys: distinct override keys.
    """
    parts = {k: k.split(".") for k in keys}
    depth = {k: 1 for k in keys}
    while True:
        names = {k: ".".join(parts[k][-depth[k]:]) for k in keys}
        seen: dict[str, list[str]] = {}
        for k, name in names.items():
            seen.setdefault(name, []).append(k)
        grow = [k for group in seen.values() if len(group) > 1 for k in group if depth[k] < len(parts[k])]
        if not grow:
            return names
        for k in grow:
            depth[k] += 1


def _override_positions(texts: list[str]) -> list[int]:
    """Indexes of the words that the launch grammar reads as overrides (``key=value``/``~key``
    after the recipe), found with :func:`tune_magic.config.launchwords.tokenise` itself: every word
    that looks like ``key=value`` or ``~key`` is first replaced by a harmless placeholder, so an
    axis value (not yet a valid override) cannot fail it, and a torchrun option's value or the
    recipe stays what it was (a word, in its place). Its errors name the user's words."""
    from tune_magic.config.launchwords import tokenise as _tokenise

    stand_in: dict[str, int] = {}
    probe = []
    for i, t in enumerate(texts):
        if t.startswith("~") or ("=" in t and not t.startswith("-")):
            name = _PLACEHOLDER.format(i)
            placeholder = "~" + name if t.startswith("~") else name + "=0"
            stand_in[placeholder] = i
            probe.append(placeholder)
        else:
            probe.append(t)
    try:
        parsed = _tokenise(probe)
    except PlanError as exc:
        message = str(exc)
        for placeholder in sorted(stand_in, key=len, reverse=True):  # tm_..._12 before tm_..._1
            message = message.replace(placeholder, texts[stand_in[placeholder]])
        for placeholder in sorted(stand_in, key=len, reverse=True):  # a bare key in a message
            message = message.replace(placeholder.strip("~").removesuffix("=0"), texts[stand_in[placeholder]])
        raise PlanError(message) from None
    return sorted(stand_in[o] for o in parsed.overrides if o in stand_in)
def plan_sweep(words: Sequence["str | Word"], *, body_axes: Sequence[tuple[str, Sequence[str]]] = (),
               max_trials: int | None = None) -> SweepPlan:
    """Find the axes of a launch and build its trials.

    Args:
        words: the launch's ``tune run`` words after its own options
            (``[TORCHRUN-OPTIONS] RECIPE --config CONFIG [overrides]``), with override words
            from an override-line cell body appended; :class:`~tune_magic.config.shellwords.Word`
            objects where they came from a shell-split line (so quoted commas are known), plain
            strings otherwise.
        body_axes: ``[(key, [item texts])]`` from a YAML body's ``sweep:`` section
            (:func:`~tune_magic.config.cellbody.split_sweep_section`), applied after the words.
        max_trials: the cap on the number of trials (default :data:`MAX_TRIALS`).

    Returns:
        The :class:`SweepPlan`; ``plan.args(trial)`` are the words to build each trial's plan from.

    Raises:
        PlanError: no axis; an axis on a refused key
            (:func:`~tune_magic.config.overrides.refused_axis_key`); an ``output_dir`` override that does
            not name every axis (``${key}``), so trials would share it; a key given twice; an empty
            item; a malformed or empty ``range()``; more than ``max_trials`` trials (the message
            gives the count); an item that is not a valid override value; or whatever the launch
            grammar refuses (no recipe, no ``--config``, a misplaced torchrun option). Nothing has
            been started.
    """
    cap = MAX_TRIALS if max_trials is None else parse_max_trials(max_trials)
    ws = [as_word(w) for w in words]
    texts = [w.text for w in ws]
    _check_ranges(ws)
    found, plain = _find_axes(ws, texts, body_axes)
    _check_keys(found, plain)
    _check_count(found, cap)
    axes = tuple(axis_from_items(f.key, [str(x) for x in f.items], f.source, f.position, f.shown) for f in found)
    short = short_keys([a.key for a in axes])
    return SweepPlan(words=tuple(texts), axes=axes, trials=_trials(axes, short), short_keys=short)


class _Found(NamedTuple):
    """An axis as written, before its items are checked."""

    key: str
    items: Sequence[str] | range
    source: str  # Axis.source
    position: int | None  # Axis.position
    shown: str  # the axis as written, for messages


def _check_ranges(ws: list[Word]) -> None:
    """Read every ``range(...)`` value first: split at a space (``range(1, 4)`` on a line) it
    would fail the launch grammar less clearly."""
    for w in ws:
        key, eq, value = w.text.partition("=")
        start = len(key) + 1 + len(value) - len(value.lstrip())
        if eq and not key.startswith("-") and value.lstrip().startswith("range(") and not w.is_quoted(start):
            parse_range(value, key)


def _find_axes(ws: list[Word], texts: list[str], body_axes: Sequence[tuple[str, Sequence[str]]]
               ) -> tuple[list[_Found], dict[str, str]]:
    """The axes among the override words, then the body's ``sweep:`` axes; and the plain
    overrides and deletions by key (``{key: word}``)."""
    found: list[_Found] = []
    plain: dict[str, str] = {}
    for p in _override_positions(texts):
        hit = word_axis(ws[p])
        if hit is None:
            key = texts[p].lstrip("~").split("=", 1)[0]
            plain.setdefault(key, texts[p])
        else:
            found.append(_Found(hit[0], hit[1], "override", p, texts[p]))
    for key, items in body_axes:
        items = list(items)
        if not items:
            raise PlanError(f"sweep: {key} has no values; give a list of at least one value")
        found.append(_Found(key, items, "sweep: mapping", None, f"sweep: {key}: [{', '.join(items)}]"))
    if not found:
        raise PlanError("--sweep found no axis: give an override a comma list (optimizer.lr=1e-4,3e-4) or "
                        "range(start,stop) (epochs=range(1,4)), or a YAML cell body a sweep: mapping; or drop "
                        "--sweep to run one job")
    return found, plain


def _check_keys(found: list[_Found], plain: dict[str, str]) -> None:
    """Refuse an axis on a refused key, a key given twice, and an ``output_dir`` the trials would share."""
    seen: dict[str, str] = {}
    for f in found:
        why = refused_axis_key(f.key)
        if why:
            raise PlanError(why)
        if f.key in seen:
            raise PlanError(f"{f.key} is given as two axes ({seen[f.key]} and {f.shown}); merge them into one list")
        seen[f.key] = f.shown
        if f.key in plain:
            raise PlanError(f"{f.key} is an axis ({f.shown}) and is also given as {plain[f.key]}; keep one of them")
    if "output_dir" in plain:
        given = plain["output_dir"]
        missing = [f.key for f in found if "${" + f.key + "}" not in given]
        if missing:
            short = short_keys([f.key for f in found])
            example = "/".join(f"{short[f.key]}_${{{f.key}}}" for f in found)
            raise PlanError(f"--sweep with {given}: trials would share that directory, as it does not name "
                            f"{', '.join('${' + k + '}' for k in missing)}; drop it (each trial then writes to its "
                            f"own <the config's output_dir>/<job id>), or name every axis in it, e.g. "
                            f"output_dir=/runs/{example}")


def _check_count(found: list[_Found], cap: int) -> None:
    count = math.prod(len(f.items) for f in found)
    if count > cap:
        grid = " x ".join(f"{len(f.items)} {f.key}" for f in found)
        raise PlanError(f"--sweep makes {count:,} trials ({grid}), more than the cap of {cap:,}: narrow an axis, "
                        f"or raise the cap with --max-trials {count}")


def _trials(axes: tuple[Axis, ...], short: dict[str, str]) -> tuple[Trial, ...]:
    """Every trial, first axis slowest (``itertools.product``)."""
    trials = []
    for index, combo in enumerate(itertools.product(*(range(len(a)) for a in axes))):
        texts = {a.key: a.texts[j] for a, j in zip(axes, combo)}
        trials.append(Trial(
            index=index,
            values={a.key: a.values[j] for a, j in zip(axes, combo)},
            texts=texts,
            words=tuple(f"{k}={t}" for k, t in texts.items()),
            name=",".join(f"{short[k]}={t}" for k, t in texts.items()),
        ))
    return tuple(trials)


# ---------------------------------------------------------------------------------------------
# Options of a sweep that are plain numbers, and the rendezvous.


def parse_max_trials(value: "int | str") -> int:
    """Read ``--max-trials N`` (a whole number >= 1). Raises :class:`PlanError` otherwise."""
    from tune_magic.sweeping.slots import parse_count

    return parse_count(value, "--max-trials", "--max-trials 2000")


_USER_RDZV = (("rdzv_endpoint", "--rdzv-endpoint"), ("master_addr", "--master-addr"),
              ("master_port", "--master-port"))


def check_sweep_rendezvous(torchrun: Mapping[str, "str | bool"], env: Mapping[str, str]) -> None:
    """Refuse a rendezvous of the user's own under sweep mode.

    Trials run side by side, each its own torchrun; an endpoint (or master address/port) given
    once would be the same for all of them, so the second trial to start would bind the port
    the first holds, or join the first trial's rendezvous as if it were more nodes of it. Without
    one, every trial gets ``--standalone`` (a free port of its own) locally, and its own head
    node and port as an array task.

    Args:
        torchrun: the launch's torchrun options as the launch grammar parsed them (dest -> value,
            e.g. ``{"nproc_per_node": "2", "rdzv_endpoint": "h:29400"}``).
        env: the job's environment; ``PET_RDZV_ENDPOINT``, ``PET_MASTER_ADDR`` and
            ``PET_MASTER_PORT`` count like the flags.

    Raises:
        PlanError: naming what was given and to drop it.
    """
    given = [flag for dest, flag in _USER_RDZV if torchrun.get(dest) not in (None, "", False)]
    given += [f"PET_{dest.upper()}" for dest, _ in _USER_RDZV if env.get(f"PET_{dest.upper()}")]
    if given:
        what = " and ".join(given)
        raise PlanError(f"--sweep runs its trials side by side, each its own torchrun, and {what} would give every "
                        "trial the same rendezvous port: the second trial would fail to bind it or join the first "
                        f"trial's rendezvous. Drop {what}: each trial then gets a free port of its own")
