"""A1111's prompt emphasis syntax: ``(word)``, ``(word:1.2)``, ``[word]``, ``\\(`` escapes and ``BREAK``.

:func:`parse_prompt` gives what A1111's ``parse_prompt_attention`` gives, for
every input: ``(x)`` multiplies the weight of ``x`` by 1.1, ``[x]`` divides it
by 1.1, ``(x:w)`` multiplies it by ``w``; brackets nest; a bracket left open
applies to the end of the prompt; an unmatched closing bracket is text;
``\\(``, ``\\)``, ``\\[``, ``\\]`` and ``\\\\`` are literal characters; ``BREAK``
(a whole word, in capitals) becomes the entry ``("BREAK", -1.0)``; runs of equal
weight are merged. Prompt syntax never raises; a weight that is not a finite number
within ``MAX_WEIGHT`` (``(red:1e40)``, or some 75 nested brackets) does, naming the
piece of the prompt: it would overflow the float32 hidden states into NaN.

The one difference: A1111 raises ``ValueError`` on a weight such as ``(x:1.2.3)``
or ``(x:.)``; here such a weight is text, so the ``)`` closes the bracket with 1.1.
"""

from __future__ import annotations

import math
import re

from ..errors import InputError

#: the ``("BREAK", -1.0)`` entry that starts a new 75-token chunk
BREAK = ("BREAK", -1.0)

#: the largest emphasis weight (in magnitude) accepted; A1111's useful range is about 0..2
MAX_WEIGHT = 1000.0
_ROUND = 1.1
_SQUARE = 1 / 1.1

_TOKEN = re.compile(
    r"""
    \\[()\[\]\\]?                               # an escape, or a lone backslash
    | [(\[]                                     # opening brackets
    | :(?P<weight>[+-]?(?:\d+(?:\.\d*)?|\.\d+))\)   # ':1.2)' closes a round bracket with a weight
    | [)\]]                                     # closing brackets
    | [^\\()\[\]:]+                             # text
    | :                                         # a colon that is not a weight
    """,
    re.VERBOSE,
)
_BREAK = re.compile(r"\s*\bBREAK\b\s*", re.S)


def parse_prompt(text: str) -> list[tuple[str, float]]:
    """Split a prompt into ``(text, weight)`` runs, A1111's way; ``BREAK`` gives ``("BREAK", -1.0)``.

    >>> parse_prompt("a (((house:1.3)) [on] a (hill:0.5), sun, (((sky))).")[:3]
    [('a ', 1.0), ('house', 1.5730000000000004), (' ', 1.1)]
    """
    runs: list[list] = []  # [text, weight], mutated as brackets close
    round_open: list[int] = []
    square_open: list[int] = []

    def scale(start: int, factor: float) -> None:
        for run in runs[start:]:
            run[1] *= factor

    for m in _TOKEN.finditer(text):
        token = m.group(0)
        weight = m.group("weight")
        if token.startswith("\\"):
            runs.append([token[1:], 1.0])
        elif token == "(":
            round_open.append(len(runs))
        elif token == "[":
            square_open.append(len(runs))
        elif weight is not None and round_open:
            scale(round_open.pop(), float(weight))
        elif token == ")" and round_open:
            scale(round_open.pop(), _ROUND)
        elif token == "]" and square_open:
            scale(square_open.pop(), _SQUARE)
        else:
            for n, part in enumerate(_BREAK.split(token)):
                if n:
                    runs.append(list(BREAK))
                runs.append([part, 1.0])

    for start in round_open:
        scale(start, _ROUND)
    for start in square_open:
        scale(start, _SQUARE)

    if not runs:
        runs = [["", 1.0]]
    merged: list[list] = [runs[0]]
    for run in runs[1:]:
        if run[1] == merged[-1][1]:
            merged[-1][0] += run[0]
        else:
            merged.append(run)
    for t, w in merged:
        if [t, w] != list(BREAK) and not (math.isfinite(w) and abs(w) <= MAX_WEIGHT):
            piece = t.strip() or t
            raise InputError(f"the emphasis weight {w:.3g} of {piece[:40]!r} is out of range: a weight must be a "
                             f"finite number between -{MAX_WEIGHT:g} and {MAX_WEIGHT:g}", where="prompt",
                             fix="use a weight such as (word:1.2), and fewer nested brackets")
    return [(t, w) for t, w in merged]


#: A1111 prompt syntax sdrt's parser reads as plain text, as A1111's grammar has it: prompt editing ends in a step
#: number (``[from:to:when]``, ``[to:when]``; ``[a:b]`` is de-emphasized text), alternation has a ``|`` in brackets
#: and composable diffusion is A1111's ``\bAND\b``; an escaped bracket is text. One set for the CLI's warnings
#: (``unsupported_syntax``) and the server's ``sdrt_not_honoured`` notes (``sdrt.serve.a1111``).
A1111_SYNTAX = {
    "editing": re.compile(r"(?<!\\)\[[^\[\]]*:\s*[+-]?(?:\d+(?:\.\d*)?|\.\d+)\s*\]"),
    "alternation": re.compile(r"(?<!\\)\[[^\[\]:]*\|[^\[\]]*\]"),
    "and": re.compile(r"\bAND\b"),
    "network": re.compile(r"<(?!(?:lora|lyco):)\w+:[^>]+>"),
}
#: name -> (A1111_SYNTAX key, what it becomes here)
_UNSUPPORTED = {
    "prompt editing ([from:to:when])": ("editing",
                                        "the text inside at the [ ] weight (1/1.1), colons and number included"),
    "alternation ([a|b])": ("alternation", "the text inside at the [ ] weight (1/1.1), the | included"),
    "composable diffusion (AND)": ("and", "the word AND"),
}
#: extra networks other than LoRA (``<hypernet:name:w>``): removed from the prompt, as A1111 removes them
_NETWORK_NOTE = ("the prompt uses A1111's extra network tag {tag!r}, which sdrt does not run: the tag is removed "
                 "from the prompt (as A1111 removes every such tag) and the image is made without it")


def unsupported_syntax(text: str) -> list[str]:
    """A1111's prompt syntax in ``text`` that sdrt does not implement and reads as text, one line each:
    prompt editing ``[from:to:when]``, alternation ``[a|b]``, composable ``AND``. :func:`parse_prompt` never
    raises on them (A1111's prompts work unchanged); a caller warns with these lines, so the difference is said."""
    out = []
    m = A1111_SYNTAX["network"].search(text)
    if m:
        out.append(_NETWORK_NOTE.format(tag=m.group(0)[:60]))
    text = re.sub(r"<\w+:[^>]+>", "", text)  # removed from the prompt before anything is read
    for name, (kind, becomes) in _UNSUPPORTED.items():
        m = A1111_SYNTAX[kind].search(text)
        if m:
            out.append(f"the prompt uses A1111's {name}, {m.group(0).strip()[:60]!r}, which sdrt does not "
                       f"implement: it is read as {becomes}")
    return out
