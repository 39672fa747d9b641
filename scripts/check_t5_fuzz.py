"""Compare sdrt's T5Tokenizer with transformers' T5TokenizerFast on many seeded random strings (not committed data).

The committed corpus (scripts/make_t5_refs.py) is hand-picked; this draws code
points from the Unicode blocks where normalization and grapheme clustering are
tricky (combining marks, fullwidth and halfwidth forms, compatibility
characters, Hangul jamo, Indic viramas, emoji with modifiers, ZWJ and variation
selectors, regional indicators, tags, controls, format and whitespace characters)
mixed with ASCII words, and counts the texts on which the ids differ::

    PYTHONPATH=core/src /work/refvenv/bin/python scripts/check_t5_fuzz.py --count 20000

Both configurations of tests/data/t5-tokenizer are checked (tokenizer.json, and
FLUX's, which converts from spiece.model), following the installed transformers' major version
(4 in the refvenv; a venv with transformers 5, sdrt's dependencies and ``PYTHONPATH=core/src`` runs 5).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "t5-tokenizer"

BLOCKS = [
    (0x20, 0x7E), (0x00, 0x1F), (0x7F, 0x9F), (0xA0, 0xFF), (0x100, 0x24F), (0x250, 0x2FF), (0x300, 0x36F),
    (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x5FF), (0x600, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F),
    (0x1100, 0x11FF), (0x1E00, 0x1EFF), (0x2000, 0x206F), (0x2070, 0x209F), (0x20A0, 0x20CF), (0x2100, 0x218F),
    (0x2190, 0x21FF), (0x2460, 0x24FF), (0x2E80, 0x2FDF), (0x3000, 0x30FF), (0x3130, 0x318F), (0x3200, 0x33FF),
    (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xF900, 0xFAFF), (0xFB00, 0xFB4F), (0xFE00, 0xFE0F), (0xFE30, 0xFE6F),
    (0xFF00, 0xFFEF), (0xFFF0, 0xFFFF), (0x1D400, 0x1D7FF), (0x1F1E6, 0x1F1FF), (0x1F300, 0x1F6FF),
    (0x1F3FB, 0x1F3FF), (0x1F900, 0x1FAFF), (0x20000, 0x2A6DF), (0xE0020, 0xE007F), (0xE000, 0xE0FF),
]
SPECIAL = ["\u200d", "\ufe0f", "\u0301", "\u094d", " ", "  ", "\t", "\n", "\u3000", "\u00a0", "</s>", "<pad>",
           "<extra_id_3>", "▁", "\r\n", "\u200b", "ﾞ", "ﾟ"]
WORDS = "a cat photo of the best quality 8k portrait woman hello world 1234 3.5 café naïve".split()


def random_text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 12)):
        roll = rng.random()
        if roll < 0.35:
            parts.append(rng.choice(WORDS) + rng.choice(["", " ", "  ", ","]))
        elif roll < 0.5:
            parts.append(rng.choice(SPECIAL))
        else:
            lo, hi = rng.choice(BLOCKS)
            parts.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 4))))
    return "".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    sys.modules.setdefault("torchvision", None)  # the refvenv's torchvision does not match its torch
    import transformers
    from transformers import T5TokenizerFast

    from sdrt.text import T5Tokenizer

    major = int(transformers.__version__.split(".")[0])
    print(f"transformers {transformers.__version__}: sdrt's T5Tokenizer(transformers={major})")
    rng = random.Random(args.seed)
    texts = [random_text(rng) for _ in range(args.count)]
    texts = [t.encode("utf-8", errors="ignore").decode("utf-8") for t in texts]  # no lone surrogates
    with tempfile.TemporaryDirectory() as tmp:
        for config in ("json", "flux"):
            folder = Path(tmp) / config
            folder.mkdir()
            import gzip

            (folder / "tokenizer.json").write_bytes(gzip.decompress((DATA / "tokenizer.json.gz").read_bytes()))
            for name in ("spiece.model", "special_tokens_map.json"):
                shutil.copy(DATA / name, folder / name)
            shutil.copy((DATA / "flux" if config == "flux" else DATA) / "tokenizer_config.json",
                        folder / "tokenizer_config.json")
            fast = T5TokenizerFast.from_pretrained(folder)
            ours = T5Tokenizer.from_folder(folder, transformers=major)
            wrong = [t for t in texts if ours.encode(t) != fast(t, add_special_tokens=False)["input_ids"]]
            print(f"{config}: {len(texts) - len(wrong)} of {len(texts)} random texts agree")
            for t in wrong[:10]:
                print("  ", json.dumps(t), ours.encode(t), fast(t, add_special_tokens=False)["input_ids"])


if __name__ == "__main__":
    main()
