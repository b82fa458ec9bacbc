"""Split a line into words as a POSIX shell would, remembering which characters were quoted. Pure.

:func:`split_words` gives exactly the words of ``shlex.split(line, posix=True)`` (what
:func:`tune_magic.config.launchwords.split_args` and the ``%%tune_run`` line use), and for each word the
positions of the characters that were typed inside quotes or after a backslash. ``shlex`` throws
that away, but a sweep needs it: ``tag="a,b"`` is one value, ``tag=a,b`` two (see
:mod:`tune_magic.config.overrides` (its comma lists and ranges)).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tune_magic.errors import PlanError

_WHITESPACE = " \t\r\n"  # shlex's whitespace


@dataclass(frozen=True)
class Word:
    """One word of a line, as the shell hands it to the program, and where it was quoted.

    Attributes:
        text: the word (quotes and escaping backslashes removed), as ``shlex.split`` gives it.
        quoted: positions in ``text`` (0-based) of the characters typed inside ``'...'`` or
            ``"..."`` or right after a backslash outside quotes. Empty for a word that was not
            typed on a shell line (a Python list of arguments).
    """

    text: str
    quoted: frozenset[int] = field(default_factory=frozenset)

    def __str__(self) -> str:
        return self.text

    def is_quoted(self, index: int) -> bool:
        """Whether ``text[index]`` was typed inside shell quotes (or escaped)."""
        return index in self.quoted


def as_word(word: "str | Word") -> Word:
    """Return ``word`` as a :class:`Word` (a plain string has nothing quoted)."""
    return word if isinstance(word, Word) else Word(str(word))


def split_words(line: str) -> list[Word]:
    """Split ``line`` like ``shlex.split(line, comments=False, posix=True)``, keeping quote positions.

    The rules (Python's ``shlex`` in POSIX mode with ``whitespace_split``): words are separated
    by spaces, tabs and line breaks; ``'...'`` keeps everything literally; inside ``"..."`` a
    backslash escapes only ``"`` and ``\\`` (otherwise it stays); outside quotes a backslash makes
    the next character literal; quotes may appear inside a word (``a"b c"d`` is one word);
    ``''`` is an empty word.

    Returns:
        The words, in order.

    Raises:
        PlanError: a quote that is never closed, or a backslash at the very end (``shlex``
            raises ``ValueError`` for both; :class:`PlanError` is a ``ValueError`` too).
    """
    words: list[Word] = []
    text: list[str] = []
    quoted: set[int] = set()
    in_word = False
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c in _WHITESPACE:
            if in_word:
                words.append(Word("".join(text), frozenset(quoted)))
                text, quoted, in_word = [], set(), False
            i += 1
            continue
        in_word = True
        if c == "\\":
            if i + 1 >= n:
                raise PlanError("cannot split the arguments (No escaped character); remove the trailing backslash")
            quoted.add(len(text))
            text.append(line[i + 1])
            i += 2
        elif c == "'":
            i = _single_quoted(line, i, text, quoted)
        elif c == '"':
            i = _double_quoted(line, i, text, quoted)
        else:
            text.append(c)
            i += 1
    if in_word:
        words.append(Word("".join(text), frozenset(quoted)))
    return words


_UNCLOSED = "cannot split the arguments (No closing quotation); close every quote"


def _single_quoted(line: str, i: int, text: list[str], quoted: set[int]) -> int:
    """Read the ``'...'`` at ``line[i]`` into ``text`` (every character literal, all quoted);
    return the index after its closing quote."""
    close = line.find("'", i + 1)
    if close < 0:
        raise PlanError(_UNCLOSED)
    for ch in line[i + 1:close]:
        quoted.add(len(text))
        text.append(ch)
    return close + 1


def _double_quoted(line: str, i: int, text: list[str], quoted: set[int]) -> int:
    """Read the ``"..."`` at ``line[i]`` into ``text`` (a backslash escapes only ``"`` and
    ``\\``); return the index after its closing quote."""
    i += 1
    n = len(line)
    while True:
        if i >= n:
            raise PlanError(_UNCLOSED)
        ch = line[i]
        if ch == '"':
            return i + 1
        if ch == "\\" and i + 1 < n and line[i + 1] in ('"', "\\"):
            ch = line[i + 1]
            i += 1
        quoted.add(len(text))
        text.append(ch)
        i += 1


def tail_words(words: "list[Word]", rest: "list[str]") -> list[Word]:
    """Return the :class:`Word` objects of ``rest``, the words an option parser left over.

    ``tune_magic.plan.options.split_own`` takes the launch's own options off the front and returns
    the remaining words as strings; they are the last ``len(rest)`` of ``words``.

    Raises:
        ValueError: ``rest`` is not the tail of ``words`` (a programming error).
    """
    tail = words[len(words) - len(rest):] if rest else []
    if [w.text for w in tail] != list(rest):
        raise ValueError("rest is not the tail of words")
    return tail
