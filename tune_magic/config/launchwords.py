"""The words of a launch: ``[TORCHRUN-OPTIONS] RECIPE --config CONFIG [key=value | ~key ...]``
split, sorted into torchrun options, recipe, config and overrides, and each checked. Pure.
"""

from __future__ import annotations

import difflib
import re
import shlex
from dataclasses import dataclass, field
from typing import Sequence

from tune_magic.errors import PlanError
from tune_magic.registry.ids import check_job_id  # noqa: F401  (the words of a launch include its --job-id)
from tune_magic.config.torchrun_options import TorchrunOption, lookup

# Options that change what the training script *is*; tune_magic always launches a recipe file.
REFUSED_OPTIONS = {
    "module": "tune_magic launches the recipe file itself; drop -m/--module",
    "no_python": "tune_magic launches the recipe with the kernel's Python; drop --no-python",
}




_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*(\.[A-Za-z0-9_\-]+|\[[^\]]*\])*$")




@dataclass
class Parsed:
    torchrun_tokens: list[str] = field(default_factory=list)
    groups: list[tuple[str, list[str]]] = field(default_factory=list)  # (dest, its tokens) in order
    torchrun: dict[str, str | bool] = field(default_factory=dict)  # dest -> value (True for switches)
    recipe: str | None = None
    config: str | None = None
    overrides: list[str] = field(default_factory=list)


def split_args(args: str | Sequence[str]) -> list[str]:
    """Split a ``tune run``-style string with :func:`shlex.split`; a list is copied as is.

    Raises:
        PlanError: an unclosed quote, or a list holding non-strings.
    """
    if isinstance(args, str):
        try:
            return shlex.split(args, comments=False, posix=True)
        except ValueError as exc:  # "No closing quotation"
            raise PlanError(f"cannot split the arguments ({exc}); close every quote") from None
    if not all(isinstance(a, str) for a in args):
        raise PlanError("arguments must be strings")
    return list(args)


def _match_option(token: str) -> tuple[TorchrunOption | None, str | None]:
    """Return (option, attached value) for an option token, e.g. ``--nnodes=2`` or ``-r3``."""
    name, eq, value = token.partition("=")
    opt = lookup(name)
    if opt is not None:
        return opt, (value if eq else None)
    if not token.startswith("--") and len(token) > 2:  # -r3: short option with its value attached
        opt = lookup(token[:2])
        if opt is not None and opt.takes_value:
            return opt, token[2:]
    return None, None


def _unknown_option(token: str) -> PlanError:
    from tune_magic.config.torchrun_options import abbreviation_of, options

    name = token.split("=")[0]
    full = abbreviation_of(name)
    if full:
        return PlanError(f"{name!r} abbreviates {' or '.join(full)}; write the option in full "
                         "(torchrun's parser may reject abbreviations)")
    close = difflib.get_close_matches(name, list(options()), n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    return PlanError(f"{token!r} is not a torchrun option.{hint} See python -m torch.distributed.run --help.")


def tokenise(tokens: list[str]) -> Parsed:
    """Sort launch words into torchrun options, the recipe, its config and overrides, checking each.

    Args:
        tokens: ``[TORCHRUN-OPTIONS] RECIPE --config CONFIG [key=value | ~key ...]``, already split.

    Returns:
        The :class:`Parsed` words; a torchrun option given twice with the same value is kept once.

    Raises:
        PlanError: an unknown or refused torchrun option, one without its value, a bad value, one
            given twice with different values, or one after the recipe; no recipe; a missing,
            empty or repeated ``--config``; a word after the recipe that is not an override; a
            bad override (:func:`check_override`).
    """
    parsed = Parsed()
    i = _torchrun_words(tokens, parsed)
    if i >= len(tokens) or not tokens[i].strip():
        empty = f" (the recipe is the empty word {tokens[i]!r})" if i < len(tokens) else ""
        raise PlanError(f"no recipe given{empty}: [torchrun options] RECIPE --config CONFIG [key=value ...]; "
                        "see tune-magic ls")
    parsed.recipe = tokens[i]
    _recipe_words(tokens, i + 1, parsed)
    if parsed.config is None:
        raise PlanError(
            f"missing --config: write {parsed.recipe} --config NAME_OR_PATH (tune-magic ls lists the configs)"
        )
    return parsed


def _torchrun_words(tokens: list[str], parsed: Parsed) -> int:
    """Read the torchrun options before the recipe into ``parsed``; return the recipe's index."""
    i = 0
    while i < len(tokens) and tokens[i].startswith("-") and tokens[i] != "-":
        opt, value, group = _option_words(tokens, i)
        i += len(group)
        if opt.dest in parsed.torchrun:
            if parsed.torchrun[opt.dest] != value:
                raise PlanError(
                    f"{opt.display} is given twice with different values "
                    f"({parsed.torchrun[opt.dest]!r} and {value!r}); keep one"
                )
            continue  # the same flag again (maybe the other spelling): pass it through once
        parsed.torchrun[opt.dest] = value
        parsed.torchrun_tokens += group
        parsed.groups.append((opt.dest, group))
    return i


def _option_words(tokens: list[str], i: int) -> tuple[TorchrunOption, str | bool, list[str]]:
    """The torchrun option at ``tokens[i]``: the option, its checked value (``True`` for a switch)
    and its words (``--flag VALUE`` is two)."""
    token = tokens[i]
    if token == "--config" or token.startswith("--config="):
        raise PlanError("--config comes after the recipe: [torchrun options] RECIPE --config CONFIG [key=value ...]")
    opt, value = _match_option(token)
    if opt is None:
        raise _unknown_option(token)
    if opt.dest in REFUSED_OPTIONS:
        raise PlanError(REFUSED_OPTIONS[opt.dest])
    group = [token]
    if opt.takes_value and value is None:
        if i + 1 >= len(tokens):
            raise PlanError(f"{token} needs a value, e.g. {opt.display} VALUE")
        value = tokens[i + 1]
        group.append(value)
    elif not opt.takes_value:
        if value is not None:
            raise PlanError(f"{opt.display} takes no value; write it alone")
        value = True
    if isinstance(value, str):
        problem = opt.check(value)
        if problem:
            raise PlanError(f"{problem}; see python -m torch.distributed.run --help")
    return opt, value, group


def _recipe_words(tokens: list[str], i: int, parsed: Parsed) -> None:
    """Read ``--config`` and the overrides, from ``tokens[i]`` on (after the recipe), into ``parsed``."""
    while i < len(tokens):
        token = tokens[i]
        if token == "--config" or token.startswith("--config="):
            if parsed.config is not None:
                raise PlanError("--config is given twice; keep one")
            if token == "--config":
                if i + 1 >= len(tokens) or tokens[i + 1].startswith("-"):
                    raise PlanError("--config needs a value: --config NAME_OR_PATH (see tune-magic ls)")
                parsed.config = tokens[i + 1]
                i += 2
            else:
                parsed.config = token.split("=", 1)[1]
                i += 1
            if not parsed.config:
                raise PlanError("--config needs a value: --config NAME_OR_PATH (see tune-magic ls)")
            continue
        if token.startswith("-") and not token.startswith("~"):
            opt, _ = _match_option(token)
            if opt is not None:
                raise PlanError(
                    f"torchrun option {token} comes after the recipe {parsed.recipe!r}, where it would be handed to the "
                    f"recipe; move it before the recipe: {token} ... {parsed.recipe} --config ..."
                )
            raise PlanError(
                f"{token!r} after the recipe is neither --config nor key=value; recipes take only --config and overrides"
            )
        parsed.overrides.append(check_override(token))
        i += 1


def with_config(tokens: list[str], path: str) -> tuple[list[str], str | None]:
    """Return ``tokens`` with ``--config`` set to ``path`` (replaced, or appended after the recipe
    arguments), and the value it replaced (``None`` when there was none)."""
    out, old, i = [], None, 0
    while i < len(tokens):
        token = tokens[i]
        if token == "--config" and i + 1 < len(tokens):
            old = tokens[i + 1]
            i += 2
        elif token.startswith("--config="):
            old = token.split("=", 1)[1]
            i += 1
        else:
            out.append(token)
            i += 1
    return out + ["--config", path], old


# the last part of a key that names a file or directory: output_dir, log_dir, checkpoint_dir,
# path, vocab_path, merges_file, checkpoint_files (an index such as [0] after it is ignored)
_PATH_KEY_RE = re.compile(r"(?:^|[._])(?:dir|path|file|files)(?:\[[^\]]*\])*$")


def is_path_key(key: str) -> bool:
    """Whether an override or config key names a file or directory (``output_dir``, ``*_dir``,
    ``path``, ``*.path``, ``*_path``, ``*_file``, ``*_files``; a trailing index such as ``[0]``
    ignored): an empty value there is refused (see :func:`check_override`)."""
    return _PATH_KEY_RE.search(key) is not None


def check_override(token: str) -> str:
    """Return ``token`` if a torchtune 0.6.1 recipe reads it as typed, else raise :class:`PlanError`.

    The value is checked by :func:`tune_magic.config.overrides.check_value` (YAML as OmegaConf reads it).
    An empty value (``key=``, or only spaces) is null to the recipe: accepted, except for a key
    that names a file or directory (``output_dir``, ``*_dir``, ``*.path``, ``*_path``, ``*_file``,
    ``*_files``), where null becomes the path ``None`` (``./None/...``) or a crash; a quoted empty
    string there (``output_dir=""``) is refused too. An explicit ``null`` stays accepted.
    ``+key=value`` adds a key the config lacks on purpose (Hydra's spelling; the recipe is handed
    ``key=value``, see :mod:`tune_magic.config.checks`): checked as ``key=value``, returned as typed.
    """
    from tune_magic.config import overrides

    if token.startswith("+"):
        if token.startswith(("++", "+~")) or "=" not in token:
            raise PlanError(f"override {token!r}: +key=value adds a key on purpose, e.g. +profiler.enabled=True "
                            "(one +, a key, =, a value)")
        check_override(token[1:])
        return token

    bad = next((c for c in token if _unsafe_char(c)), None)
    if bad is not None:
        raise PlanError(f"override {token[:60]!r} contains {_char_name(bad)}; remove it")
    if token.startswith("~"):
        if "=" in token or not _KEY_RE.match(token[1:]):
            raise PlanError(f"override {token!r}: a deletion is ~key with no value, e.g. ~model.lora_rank")
        if "_component_" in token:  # torchtune 0.6.1 refuses it when the recipe starts
            raise PlanError(f"override {token!r}: torchtune cannot remove a component; override it instead, "
                            f"e.g. {token[1:]}=torchtune.models.OTHER")
        return token
    key, eq, value = token.partition("=")
    if not eq or not _KEY_RE.match(key):
        raise PlanError(
            f"override {token!r} is not key=value; write e.g. batch_size=4 or metric_logger.name=\"my run\" "
            "(quote values with spaces)"
        )
    path_key = is_path_key(key)
    if path_key and not value.strip():  # before check_value, whose advice (quote the spaces) does not fit a path
        raise PlanError(f"override {token!r} leaves {key} empty: " + empty_path_fix(key, None, "=", "override"))
    overrides.check_value(key, value)
    if path_key:
        read = overrides.recipe_value(key, value)
        if isinstance(read, str) and not read.strip():
            raise PlanError(f"override {token!r} leaves {key} empty: " + empty_path_fix(key, read, "=", "override"))
    return token


def empty_path_fix(key: str, read: object, sep: str, what: str) -> str:
    """The end of the message refusing an empty value for a path key: what the recipe reads and
    the fix (``sep``: ``=`` for an override, ``: `` for a config line; ``what`` names the thing
    to drop)."""
    reads = "null (a path of None, e.g. ./None/...)" if read is None else "an empty path"
    return f"the recipe reads {reads}; give a path ({key}{sep}PATH), or drop the {what} to keep the config's value"


def _unsafe_char(c: str) -> bool:
    # C0/C1 controls but tab, YAML's own line breaks (NEL U+0085, U+2028, U+2029), a byte-order mark,
    # and lone surrogates (bytes that are not UTF-8, as Python decodes them from argv)
    o = ord(c)
    return (o < 32 and c != "\t") or 0x7F <= o <= 0x9F or c in "\u2028\u2029\ufeff" or 0xD800 <= o <= 0xDFFF


def _char_name(c: str) -> str:
    if 0xD800 <= ord(c) <= 0xDFFF:
        return "bytes that are not UTF-8 text"
    return f"a control character or line break ({c!r}; NUL, newline, ...)"
