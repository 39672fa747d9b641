"""Reference chunks from A1111's own ``tokenize_line`` for sdrt's ``tokenize_prompt`` tests.

Writes ``tests/text/data/tokenize_line.json.gz``: prompts (comma-separated tag
lists and plain text of 20 to 300 tokens, BREAKs, emphasis, and seeded random
mixes) with the chunks (77 ids, 77 multipliers) that
``FrozenCLIPEmbedderWithCustomWords.tokenize_line`` of stable-diffusion-webui
makes with its default options (emphasis "Original", comma back-off 20), for
comma back-off 20 and 0.

It loads webui's ``modules/prompt_parser.py`` and ``modules/sd_hijack_clip.py``
from a checkout, with stand-ins only for the modules they import that do not
take part in tokenizing (devices, sd_hijack, sd_emphasis, shared.opts), and
gives it transformers' ``CLIPTokenizer`` on the committed tokenizer folder.
The prompts are ASCII, where the slow and the fast transformers tokenizers agree,
so transformers 5 (the torch venv) serves::

    /work/venv-torch/bin/python scripts/make_chunk_refs.py --webui /path/to/stable-diffusion-webui
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import random
import sys
import tempfile
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "tests" / "data" / "clip-tokenizer"
OUT = ROOT / "tests" / "text" / "data" / "tokenize_line.json.gz"

TAGS = ["masterpiece", "best quality", "ultra detailed", "8k", "a beautiful woman with long flowing red hair",
        "(blue eyes:1.2)", "[blurry]", "cinematic lighting", "by greg rutkowski and alphonse mucha",
        "highly detailed digital painting of a castle on a hill at sunset", "((sharp focus))", "bokeh",
        "trending on artstation", "award winning photograph", "4k uhd", "soft shadows", "volumetric fog"]
WORDS = "the quick brown fox jumps over lazy dog in a misty forest near river under stars".split()


def prompts() -> list[str]:
    rng = random.Random(13)
    out = ["", "a cat", "BREAK", "a BREAK b", "a cat BREAK BREAK a dog", ", ".join(["cat"] * 80),
           " ".join(["cat"] * 75), " ".join(["cat"] * 76), " ".join(["cat"] * 150), "cat, " * 40,
           "(" + ", ".join(TAGS * 3) + ")", "[" + " ".join(WORDS * 6)]
    for _ in range(60):
        n = rng.randint(3, 45)
        out.append(", ".join(rng.choice(TAGS) for _ in range(n)))
    for _ in range(30):
        parts = []
        for _ in range(rng.randint(5, 120)):
            r = rng.random()
            parts.append(rng.choice(WORDS) + ("," if r < 0.15 else "") + (" BREAK" if r > 0.97 else ""))
        out.append(" ".join(parts))
    return out


def load_webui(webui: Path, comma_backtrack: int) -> types.ModuleType:
    opts = types.SimpleNamespace(emphasis="Original", comma_padding_backtrack=comma_backtrack)
    stubs = {"modules": types.ModuleType("modules"), "modules.devices": types.ModuleType("modules.devices"),
             "modules.sd_hijack": types.ModuleType("modules.sd_hijack"),
             "modules.sd_emphasis": types.ModuleType("modules.sd_emphasis"),
             "modules.shared": types.ModuleType("modules.shared")}
    stubs["modules"].__path__ = []  # a package
    stubs["modules.shared"].opts = opts
    sys.modules.update(stubs)
    for name in ("prompt_parser", "sd_hijack_clip"):
        spec = importlib.util.spec_from_file_location(f"modules.{name}", webui / "modules" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[f"modules.{name}"] = module
        setattr(stubs["modules"], name, module)
        for stub in ("devices", "sd_hijack", "sd_emphasis"):
            setattr(stubs["modules"], stub, stubs[f"modules.{stub}"])
        spec.loader.exec_module(module)
    return sys.modules["modules.sd_hijack_clip"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--webui", type=Path, required=True, help="a stable-diffusion-webui checkout")
    args = parser.parse_args()
    from transformers import CLIPTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        for name in ("vocab.json", "merges.txt"):
            (Path(tmp) / name).write_bytes(gzip.decompress((TOKENIZER / f"{name}.gz").read_bytes()))
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            (Path(tmp) / name).write_bytes((TOKENIZER / name).read_bytes())
        tokenizer = CLIPTokenizer.from_pretrained(tmp)

    texts = prompts()
    result: dict[str, object] = {"generator": "scripts/make_chunk_refs.py", "texts": texts}
    no_embeddings = types.SimpleNamespace(find_embedding_at_position=lambda tokens, position: (None, None))
    for backtrack in (20, 0):
        clip = load_webui(args.webui, backtrack)
        embedder = clip.FrozenCLIPEmbedderWithCustomWords(types.SimpleNamespace(tokenizer=tokenizer),
                                                         types.SimpleNamespace(embedding_db=no_embeddings))
        rows = []
        for text in texts:
            chunks, _ = embedder.tokenize_line(text)
            rows.append([[c.tokens, c.multipliers] for c in chunks])
        result[f"backtrack_{backtrack}"] = rows
    OUT.write_bytes(gzip.compress(json.dumps(result, separators=(",", ":")).encode("utf-8"), 9, mtime=0))
    counts = [len(r) for r in result["backtrack_20"]]
    print(f"{len(texts)} prompts, {sum(counts)} chunks (max {max(counts)} per prompt); wrote {OUT}")


if __name__ == "__main__":
    main()
