"""A CLIP tokenizer folder as transformers 5 saves it (``tokenizer.json`` and ``tokenizer_config.json`` only, no
``vocab.json``/``merges.txt``), with an added token, and transformers' ids for a few prompts, for
tests/text/test_text_tokenizer.py.

    /work/refvenv/bin/python scripts/make_clip_tokenizer_json.py   # -> tests/text/data/clip-tokenizer-json/
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

sys.modules["torchvision"] = None  # type: ignore[assignment]

from transformers import CLIPTokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "tests" / "data" / "pipelines" / "tiny-sd15" / "tokenizer"
OUT = ROOT / "tests" / "text" / "data" / "clip-tokenizer-json"
PROMPTS = ["a photo of a red cat sitting on a wooden table, sunset", "A  PHOTO\tof   <my-style> cats!!",
           "", "naïve café 123 ### <|endoftext|> the end", "mysterious xyzzy qwerty " * 3]


def main() -> None:
    tok = CLIPTokenizer.from_pretrained(str(SRC))
    tok.add_tokens(["<my-style>"])
    folder = OUT / "tokenizer"
    shutil.rmtree(folder, ignore_errors=True)
    tok.save_pretrained(str(folder))
    saved = sorted(p.name for p in folder.iterdir())
    assert "vocab.json" not in saved and "tokenizer.json" in saved, saved
    for extra in set(saved) - {"tokenizer.json", "tokenizer_config.json"}:
        (folder / extra).unlink()
    again = CLIPTokenizer.from_pretrained(str(folder))
    ids = [again(p, padding="max_length", max_length=77, truncation=True).input_ids for p in PROMPTS]
    (OUT / "ids.json").write_text(json.dumps({"prompts": PROMPTS, "ids": ids}) + "\n")
    print(saved, [len(i) for i in ids])


if __name__ == "__main__":
    main()
