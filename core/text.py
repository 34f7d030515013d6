"""Text matching: the one definition of "the same observation", exact match and token F1.

    from simplan.core.text import exact, normalize, similarity, token_f1
    exact("You see a  Door.", "you see a door.")          # True: case and white space do not count
    token_f1("Simon says, 'slice olive'.", "Simon says, 'touch banana'.")   # 0.5: words only

Every place that compares texts uses these: the expectation-mismatch pivot and the judge's repeat memory
(inference/planning), the simulator accuracy of traces and reports, and offline model evaluation
(evaluation/offline.py), so an "exact" or a token F1 means the same number online and offline.

- `normalize`: lower-cased, white space collapsed. Observations differ in case and spacing without differing
  in content (a model's reply, an env's formatting), so neither counts.
- `words`: the word tokens (`\\w+`) of the normalised text. Punctuation is not a word: on a short observation
  the commas, quotes and period two texts share would make different contents look alike.
- `token_f1`: F1 of the two multisets of words; two texts without words are identical (1.0), one without words
  against one with words is 0.0.
- `leading_words`: the start of a text with as many words as another: a prediction cut by its token limit is
  compared with the part of the real observation it could have said.
- `collapse`: white space collapsed, case kept: how an action text is compared with another (a tool call's
  arguments are case-sensitive).
"""

from __future__ import annotations

import difflib
import re
from collections import Counter

SIMILARITIES = ("token_f1", "ratio")
_WORD = re.compile(r"\w+")


def collapse(text: str | None) -> str:
    """`text` with every run of white space made one space and the ends stripped; case kept."""
    return " ".join((text or "").split())


def normalize(text: str | None) -> str:
    """The form in which observations are compared: lower-cased, white space collapsed."""
    return collapse(text).lower()


def exact(predicted: str | None, real: str | None) -> bool:
    """Whether a predicted observation is the real one (equal after `normalize`)."""
    return normalize(predicted) == normalize(real)


def words(text: str | None) -> list[str]:
    return _WORD.findall(normalize(text))


def leading_words(text: str | None, like: str | None) -> str:
    """The start of `text` (white space collapsed) up to the end of its n-th word, n = the words of `like`; all of
    it when it has no more: what a prediction cut by its token limit is compared with, as it could say no more."""
    n = len(words(like))
    spans = list(_WORD.finditer(collapse(text)))
    return collapse(text) if n == 0 or n >= len(spans) else collapse(text)[: spans[n - 1].end()]


def token_f1(predicted: str | None, real: str | None) -> float:
    """F1 of the multisets of words of two texts, in [0, 1]."""
    a, b = words(predicted), words(real)
    if not a and not b:
        return 1.0
    common = sum((Counter(a) & Counter(b)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(a), common / len(b)
    return 2 * precision * recall / (precision + recall)


def similarity(expected: str | None, observed: str | None, method: str = "token_f1") -> float:
    """Similarity of two observations in [0, 1] (1.0 = the same after `normalize`).

    token_f1: `token_f1`, robust to small rewordings and order changes; ratio: difflib's character-level ratio
    of the normalised texts. Two different texts of which one is empty (or, with token_f1, has no words) are 0.0:
    an expectation of "..." is not met by "!!"."""
    a, b = normalize(expected), normalize(observed)
    if a == b:
        return 1.0
    if not a or not b:
        return 0.0
    if method == "ratio":
        return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()
    if method != "token_f1":
        raise ValueError(f"similarity method {method!r} is not one of {', '.join(SIMILARITIES)}")
    if not words(a) or not words(b):
        return 0.0
    return token_f1(a, b)
