"""A served judge's score as the expected value of the numbers it could have written, from the log-probabilities an
OpenAI-style server returns with a reply (``logprobs = true``, ``top_logprobs = k``).

The reply's tokens (``choices[0].logprobs.content``, each with its ``top_logprobs`` alternatives) are laid end to
end over the reply's text, and the score's number is found among them by its place in the text. At the token where
the number starts, every alternative that spells digits is a score the judge could have written there; their
probabilities, renormalised over those alternatives, weigh the values they stand for. The written number is one of
them, so a judge sure of its answer gives that number, and one torn between 7 and 8 gives about 7.5.

Two tokenizers write numbers differently, and both are handled:

- one token per number (GPT's vocabularies hold ``10`` and ``25`` whole): each alternative is its own value;
- one token per digit (Qwen's): ``10`` is ``1`` then ``0``. On the written path the next token's alternatives say
  how the number goes on (a digit extends it, anything else ends it), recursively; an alternative off the written
  path that can begin several scores of the scale (``1`` can begin 1 or 10) stands for the one nearest the written
  number, the only reading the reply gives any evidence for.

Where the number cannot be placed (the tokens do not spell the reply's text, the number shares its first token
with other characters, it has a decimal point, no alternative is a digit), :func:`expected_score` returns None and
the caller reads the number as written.
"""

from __future__ import annotations

import math
from typing import Any


def _alternatives(entry: dict[str, Any]) -> list[tuple[str, float]]:
    """The ``(token, probability)`` alternatives of one reply token, the written token among them."""
    found = [(str(t["token"]), math.exp(float(t["logprob"]))) for t in entry.get("top_logprobs") or []]
    if all(token != entry["token"] for token, _ in found):
        found.append((str(entry["token"]), math.exp(float(entry["logprob"]))))
    return found


def _nearest(prefix: str, written: int, low: int, high: int) -> int | None:
    """The score of ``low..high`` spelt beginning with ``prefix`` nearest ``written`` (ties: the smaller)."""
    options = [v for v in range(low, high + 1) if str(v).startswith(prefix)]
    return min(options, key=lambda v: (abs(v - written), v)) if options else None


def _value(entries: list[dict[str, Any]], i: int, prefix: str, rest: str, written: int, low: int,
           high: int) -> float | None:
    """The expected score from token ``i`` on, ``prefix`` already written; ``rest`` is what the reply wrote from
    token ``i`` to the number's end (the written path)."""
    if i >= len(entries):
        return None
    first = not prefix
    chosen = entries[i]["token"].lstrip() if first else entries[i]["token"]
    weighted, total = 0.0, 0.0
    for token, p in _alternatives(entries[i]):
        text = token.lstrip() if first else token
        if text.isdigit():
            if text == chosen and rest != chosen and rest.startswith(chosen):  # the written path goes on
                value = _value(entries, i + 1, prefix + text, rest[len(text):], written, low, high)
            elif text == chosen and rest == chosen:  # the written number ends here
                value = float(written)
            else:
                nearest = _nearest(prefix + text, written, low, high)
                value = None if nearest is None else float(nearest)
        elif not first and low <= int(prefix) <= high:  # not a digit: the number ends before this token
            value = float(int(prefix))
        else:
            value = None
        if value is not None:
            weighted, total = weighted + p * value, total + p
    return weighted / total if total > 0 else None


def expected_score(answer: Any, text: str, span: tuple[int, int], low: int, high: int) -> float | None:
    """The expected value of the integer score written at ``text[span[0]:span[1]]``, over the scores ``low..high``
    the judge's alternatives spell there (module docstring); None where the answer's log-probabilities cannot
    place it (read the number as written then)."""
    number = text[span[0] : span[1]]
    if not number.isdigit():
        return None
    try:
        entries = answer["choices"][0]["logprobs"]["content"]
        tokens = [str(e["token"]) for e in entries]
    except (KeyError, IndexError, TypeError):
        return None
    if "".join(tokens) != text:
        return None
    start = 0
    for i, token in enumerate(tokens):
        end = start + len(token)
        if start <= span[0] < end:
            if token[: span[0] - start].strip() or not token[span[0] - start :].isdigit():
                return None  # the number shares its first token with other characters
            try:
                return _value(entries, i, "", number, int(number), low, high)
            except (KeyError, TypeError, ValueError):
                return None
        start = end
    return None
