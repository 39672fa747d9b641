"""Reference output of A1111's ``parse_prompt_attention`` for sdrt's prompt-syntax tests.

Writes ``tests/text/data/parse_prompt_attention.json``: a list of prompts
(hand-picked malformed ones and seeded random strings over the syntax characters)
with what A1111's own function returns for each, or the exception it raises.

Run it with a checkout of stable-diffusion-webui (its ``modules/prompt_parser.py``
imports ``lark`` and ``torch``; the torch venv has torch, ``pip install lark``)::

    /work/venv-torch/bin/python scripts/make_prompt_refs.py --webui /path/to/stable-diffusion-webui
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "text" / "data" / "parse_prompt_attention.json"

HAND_PICKED = [
    "", " ", "normal text", "an (important) word", "(unbalanced", "\\(literal\\]", "(unnecessary)(parens)",
    "a (((house:1.3)) [on] a (hill:0.5), sun, (((sky))).", "[blurry]", "[[very blurry]]", "((a)) [[b]]",
    "(a:1.2)", "(a: 1.2)", "(a:1.2 )", "(a:+1.2)", "(a:-1)", "(a:.5)", "(a:5.)", "(a:1.2.3)", "(a:.)",
    "(a:..5)", "(a:1e3)", "(a:abc)", "(a:)", "(:1.2)", "a:1.2)", "((a:1.2):1.5)", "(a:1.2", "a)", "a]",
    "a ] b ) c", "[a(b]c)", "([a)]", "(((((deep)))))", "[[[[[low]]]]]", "\\", "a\\", "\\\\", "\\\\(a)",
    "\\a", "a\\:b", "a BREAK b", "aBREAK b", "a BREAKb", "BREAK", "BREAK BREAK", "a BREAK BREAK b",
    "(a BREAK b)", "(a BREAK b:1.3)", "[a BREAK b]", "break", "a\nBREAK\nb", "(BREAK:-1)", "a,BREAK,b",
    "(masterpiece:1.2), best quality, (blue eyes:0.9), [[blurry]]", "<lora:foo:0.8> (cat:1.1)",
    "[cat:dog:0.5]", "[a|b]", "a: b: c", ":", "::", "(:)", "([:])", "(a:1.2)(b:1.2)", "(a)(b:1.1)",
    "café (naïve:1.1) 猫 [🐱]", "embedding:easynegative (x:0)", "(a:0)", "(a:0.0) (b:0)",
]


def random_prompts(n: int) -> list[str]:
    rng = random.Random(13)
    pieces = ["a", "b", "cat", " ", ", ", "(", ")", "[", "]", ":", "1.2", ".5", "-0.3", "\\", "BREAK", "\n", "\\(",
              "1.1.1", "+2"]
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 14))) for _ in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--webui", type=Path, required=True, help="a stable-diffusion-webui checkout")
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("a1111_prompt_parser", args.webui / "modules" / "prompt_parser.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    cases = []
    for text in HAND_PICKED + random_prompts(400):
        try:
            cases.append({"text": text, "runs": [[t, w] for t, w in module.parse_prompt_attention(text)]})
        except Exception as exc:  # noqa: BLE001 - recorded: A1111 raises on some weights
            cases.append({"text": text, "raises": type(exc).__name__})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"generator": "scripts/make_prompt_refs.py", "cases": cases}, ensure_ascii=False,
                              indent=0) + "\n", encoding="utf-8")
    print(f"{len(cases)} prompts, {sum('raises' in c for c in cases)} raise in A1111; wrote {OUT}")


if __name__ == "__main__":
    main()
