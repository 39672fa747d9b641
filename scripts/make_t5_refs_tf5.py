"""Reference ids of transformers 5's T5 tokenizer for the corpus of scripts/make_t5_refs.py.

transformers 5 rebuilds every T5 tokenizer the same way (the vocabulary and the
charsmap; whitespace split and ``Metaspace``), whatever the folder's
``tokenizer.json`` says and whether ``tokenizer_config.json`` sets
``add_prefix_space``. sdrt follows it with ``T5Tokenizer.from_folder(path, transformers=5)``.
This writes ``tests/data/t5-tokenizer/reference_ids_tf5.json.gz``: for the same
texts as ``reference_ids.json.gz``, in three folder configurations (tokenizer.json
with the plain configuration, with FLUX's, and spiece.model alone), the bare ids,
and ``input_ids``/``attention_mask`` at 256 and 512 (``padding="max_length"``,
``truncation=True``).

The refvenv has transformers 4.x; run this in a venv with transformers 5, no torch needed::

    python -m venv /tmp/tf5 && /tmp/tf5/bin/pip install "transformers>=5" sentencepiece protobuf
    /tmp/tf5/bin/python scripts/make_t5_refs_tf5.py
"""

from __future__ import annotations

import gzip
import json
import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "t5-tokenizer"
CONFIGS = {
    "json": ("tokenizer.json", "spiece.model", "special_tokens_map.json"),
    "flux": ("tokenizer.json", "spiece.model", "special_tokens_map.json"),
    "spiece": ("spiece.model", "special_tokens_map.json"),
}


def main() -> None:
    import tokenizers
    import transformers
    from transformers import T5TokenizerFast

    assert int(transformers.__version__.split(".")[0]) >= 5, "run this with transformers 5"
    texts = json.loads(gzip.decompress((DATA / "reference_ids.json.gz").read_bytes()))["texts"]
    result: dict[str, object] = {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        for config, files in CONFIGS.items():
            folder = Path(tmp) / config
            folder.mkdir()
            for name in files:
                if name == "tokenizer.json":
                    (folder / name).write_bytes(gzip.decompress((DATA / "tokenizer.json.gz").read_bytes()))
                else:
                    shutil.copy(DATA / name, folder / name)
            shutil.copy((DATA / "flux" if config == "flux" else DATA) / "tokenizer_config.json",
                        folder / "tokenizer_config.json")
            tok = T5TokenizerFast.from_pretrained(folder)
            rows: dict[str, object] = {"ids": [tok(t, add_special_tokens=False)["input_ids"] for t in texts]}
            for length in (256, 512):
                out = tok(texts, padding="max_length", max_length=length, truncation=True)
                rows[str(length)] = {"input_ids": out["input_ids"], "attention_mask": out["attention_mask"]}
            result[config] = rows
    with gzip.GzipFile(DATA / "reference_ids_tf5.json.gz", "wb", mtime=0) as f:
        f.write(json.dumps(result, separators=(",", ":")).encode("utf-8"))
    base = json.loads(gzip.decompress((DATA / "reference_ids.json.gz").read_bytes()))
    for config in CONFIGS:
        for old in ("json", "flux"):
            agree = sum(a == b for a, b in zip(result[config]["ids"], base[old]["ids"]))  # type: ignore[index]
            print(f"transformers {transformers.__version__} ({config} folder) vs 4.x ({old}): {agree}/{len(texts)}")


if __name__ == "__main__":
    main()
