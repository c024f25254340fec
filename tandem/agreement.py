"""Answer normalisation for mutual verification: two answers agree when their normal forms match.

Recognises option letters ("B", "(b)", "Answer: B.", "option B"), numbers ("4", "four", "4.0",
"1,000"), yes/no ("Yes.", "no, it is not") and otherwise short phrases (case, punctuation, articles
and surrounding whitespace ignored).
"""

from __future__ import annotations

import math
import re

_WORD_NUMBERS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty".split())}
_PREFIX = re.compile(r"^\s*(?:the\s+)?(?:final\s+)?(?:answer|option|choice)\s*(?:is)?\s*[:\-]?\s*", re.I)
# A bare letter ("b", "(B)", "C.") or a marked one leading text ("A) a cat", "(b) dog", "B. red");
# a lowercase "a" before a word is the article, not option A.
_LETTER = re.compile(r"^(?:\(?([A-Ha-h])\)?[.:)]?$|\(([A-Ha-h])\)|([A-H])[.:)])")
_NUMBER = re.compile(r"^[-+]?\d[\d,]*(?:\.\d+)?")
_ARTICLES = re.compile(r"\b(?:a|an|the)\b")
_NON_WORD = re.compile(r"[^\w\s]")


def normalize_answer(text: str) -> str:
    """A canonical form: 'opt:B', 'num:4', 'yes', 'no', or a cleaned short phrase."""
    s = _PREFIX.sub("", text.strip())
    s = s.strip().strip("*\"'`")
    letter = _LETTER.match(s)
    if letter:
        return "opt:" + next(g for g in letter.groups() if g).upper()
    number = _NUMBER.match(s)
    if number:
        return "num:" + _canonical_number(number.group(0).replace(",", ""))
    first = _NON_WORD.sub(" ", s.lower()).split()
    if first and first[0] in ("yes", "no"):
        return first[0]
    if first and first[0] in _WORD_NUMBERS and len(first) <= 2:
        return f"num:{_WORD_NUMBERS[first[0]]}"
    phrase = _ARTICLES.sub(" ", _NON_WORD.sub(" ", s.lower()))
    return " ".join(phrase.split())


def _canonical_number(s: str) -> str:
    """'4.0' -> '4'; a number too long for a float (a model that repeats digits) stays as written,
    without leading zeros, rather than overflowing."""
    value = float(s)
    if not math.isfinite(value) or abs(value) >= 2**53:
        return s.lstrip("0") or "0"
    return str(int(value)) if value == int(value) else repr(value)


def answers_agree(a: str, b: str) -> bool:
    """True when both answers are non-empty and normalise to the same form."""
    na, nb = normalize_answer(a), normalize_answer(b)
    return bool(na) and na == nb
