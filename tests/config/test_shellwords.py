"""config/shellwords.py: shlex's words, plus where the shell quotes were (pure)."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tune_magic.errors import PlanError
from tune_magic.config.shellwords import Word, as_word, split_words, tail_words


def quoted_chars(word: Word) -> str:
    return "".join(c for i, c in enumerate(word.text) if word.is_quoted(i))


@pytest.mark.parametrize("line, texts, quoted", [
    ('tag="a,b" lr=1,2', ["tag=a,b", "lr=1,2"], ["a,b", ""]),
    ("tag='a,b'", ["tag=a,b"], ["a,b"]),
    ("x=a\\,b", ["x=a,b"], [","]),                      # an escaped comma is quoted
    ('a"b c"d', ["ab cd"], ["b c"]),                     # quotes inside a word
    ("''  x", ["", "x"], ["", ""]),                      # an empty quoted word is a word
    ('"a\\"b" "\\x"', ['a"b', "\\x"], ['a"b', "\\x"]),   # in "..." a backslash escapes only " and \
    ("'a\\b'", ["a\\b"], ["a\\b"]),                      # in '...' nothing is escaped
    ("  a\tb\nc  ", ["a", "b", "c"], ["", "", ""]),
    ("", [], []),
])
def test_words_and_their_quoted_characters(line, texts, quoted):
    words = split_words(line)
    assert [w.text for w in words] == texts == shlex.split(line)
    assert [quoted_chars(w) for w in words] == quoted


@pytest.mark.parametrize("line", ['tag="a,b', "tag='a", "x=1 \\"])
def test_unclosed_quotes_and_a_trailing_backslash_are_plan_errors(line):
    with pytest.raises(ValueError):  # what shlex raises
        shlex.split(line)
    with pytest.raises(PlanError, match="cannot split the arguments"):
        split_words(line)


# characters that matter to the shell and to sweeps, and some that do not
_ALPHABET = st.sampled_from(list("ab,=[] {}'\"\\\t\n#~$") + ["x", "é", "1"])


@settings(max_examples=400, deadline=None)
@given(st.text(_ALPHABET, max_size=30))
def test_same_words_as_shlex_split(line):
    """The property that lets split_words stand in for shlex.split on a %%tune_run line."""
    try:
        expected = shlex.split(line, comments=False, posix=True)
    except ValueError:
        with pytest.raises(PlanError):
            split_words(line)
        return
    words = split_words(line)
    assert [w.text for w in words] == expected
    for w in words:
        assert all(0 <= i < len(w.text) for i in w.quoted)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(_ALPHABET, max_size=8), max_size=5))
def test_shlex_join_round_trips_and_everything_joined_is_quoted(parts):
    """shlex.join quotes what needs it: the words come back, and a word that shlex.quote wrapped
    in quotes is quoted throughout."""
    words = split_words(shlex.join(parts))
    assert [w.text for w in words] == parts
    for part, w in zip(parts, words):
        if shlex.quote(part) != part:
            assert w.quoted == frozenset(range(len(part)))


def test_as_word_and_tail_words():
    assert as_word("x=1") == Word("x=1")
    w = Word("y", frozenset({0}))
    assert as_word(w) is w
    words = split_words('--name run lora --config c tag="a,b"')
    tail = tail_words(words, ["lora", "--config", "c", "tag=a,b"])
    assert tail == words[2:] and quoted_chars(tail[-1]) == "a,b"
    assert tail_words(words, []) == []
    with pytest.raises(ValueError):
        tail_words(words, ["other"])
