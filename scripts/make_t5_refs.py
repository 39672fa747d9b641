"""Build the committed T5 tokenizer folder and the reference ids that sdrt's T5 tokenizer is tested against.

The vocabulary is T5's real one (t5-base / t5-v1_1-xxl: 32 000 SentencePiece
pieces and 100 ``<extra_id_N>``, Apache-2.0), the ``tokenizer.json`` that
stable-diffusion.cpp embeds in its sources (``src/tokenizers/vocab/clip_t5.hpp``,
``t5_tokenizer_json_str``), which the ``stable-diffusion-cpp-python`` sdist on
PyPI carries. No model hub is reachable here, and no PyPI package ships T5's
``spiece.model`` itself.

What it writes, under ``tests/data/t5-tokenizer/``:

- ``tokenizer.json.gz``: that file, gzipped (byte for byte the embedded JSON);
- ``spiece.model``: a SentencePiece model rebuilt from it (the same pieces,
  scores and precompiled charsmap; T5's normalizer settings and special ids),
  for the path where transformers converts from the slow tokenizer;
- ``tokenizer_config.json`` and ``special_tokens_map.json``: a T5 configuration
  without ``add_prefix_space``, so ``T5TokenizerFast`` loads ``tokenizer.json``;
- ``flux/tokenizer_config.json``: the configuration FLUX.1's ``tokenizer_2``
  ships (``add_prefix_space: true``, ``legacy: true``), with which
  ``T5TokenizerFast`` rebuilds itself from ``spiece.model``
  (transformers' ``T5Converter``) and ignores ``tokenizer.json``;
- ``reference_ids.json.gz``: a varied corpus and, for both configurations,
  ``T5TokenizerFast``'s bare ids (``add_special_tokens=False``), and its
  ``input_ids``/``attention_mask`` as SD3 (256), Flux schnell (256), Flux dev and
  Chroma (512) call it (``padding="max_length"``, ``truncation=True``), with
  and without special tokens; the slow ``T5Tokenizer``'s ids (for information);
  and the attention mask diffusers' ``ChromaPipeline._get_t5_prompt_embeds``
  hands the transformer, for a batch of prompts; and the bare ids of a folder
  with ``spiece.model`` alone (``spiece``), which transformers also converts, and
  of three more configurations (``variants``: the converter's other prefix schemes).

Run it with /work/refvenv (transformers 4.x, tokenizers, sentencepiece, protobuf,
torch and diffusers for the Chroma mask)::

    /work/refvenv/bin/python scripts/make_t5_refs.py [--sdist stable_diffusion_cpp_python-0.4.7.tar.gz]

Without ``--sdist`` it downloads the sdist with pip (``pip download --no-deps``).
"""

from __future__ import annotations

import argparse
import base64
import gzip
import json
import random
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "t5-tokenizer"
SDIST = "stable-diffusion-cpp-python==0.4.7"
HEADER = "src/tokenizers/vocab/clip_t5.hpp"
LENGTHS = (256, 512)
VARIANTS = {
    "first": {"add_prefix_space": True, "legacy": False},
    "never": {"add_prefix_space": False, "legacy": True},
    "from_slow": {"from_slow": True},
}


def extract_tokenizer_json(sdist: Path) -> bytes:
    with tarfile.open(sdist) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(HEADER))
        source = tar.extractfile(member).read().decode("ascii")
    start = source.index("t5_tokenizer_json_str[]")
    body = source[source.index("{", start) + 1 : source.index("};", start)]
    data = bytes(int(x, 16) for x in re.findall(r"0x([0-9a-fA-F]{2})", body))
    tok = json.loads(data)
    assert tok["model"]["type"] == "Unigram" and len(tok["model"]["vocab"]) == 32100, "not T5's vocabulary"
    assert tok["model"]["vocab"][3][0] == "▁" and tok["model"]["vocab"][32099][0] == "<extra_id_0>"
    return data


def build_spiece_model(tok: dict) -> bytes:
    """T5's spiece.model from its tokenizer.json: the 32 000 pieces, their scores and the charsmap."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    charsmap = next(n for n in tok["normalizer"]["normalizers"] if n["type"] == "Precompiled")["precompiled_charsmap"]
    model = pb.ModelProto()
    for index, (piece, score) in enumerate(tok["model"]["vocab"][:32000]):
        entry = model.pieces.add()
        entry.piece, entry.score = piece, score
        entry.type = {0: pb.ModelProto.SentencePiece.CONTROL, 1: pb.ModelProto.SentencePiece.CONTROL,
                      2: pb.ModelProto.SentencePiece.UNKNOWN}.get(index, pb.ModelProto.SentencePiece.NORMAL)
    spec = model.trainer_spec
    spec.model_type = pb.TrainerSpec.UNIGRAM
    spec.vocab_size = 32000
    spec.unk_id, spec.bos_id, spec.eos_id, spec.pad_id = 2, -1, 1, 0
    spec.unk_piece, spec.eos_piece, spec.pad_piece = "<unk>", "</s>", "<pad>"
    spec.byte_fallback = False
    norm = model.normalizer_spec
    norm.name = "nmt_nfkc"
    norm.precompiled_charsmap = base64.b64decode(charsmap)
    norm.add_dummy_prefix = True
    norm.remove_extra_whitespaces = True
    norm.escape_whitespaces = True
    return model.SerializeToString()


def _added(index: int, content: str) -> dict:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": True}


def configs() -> tuple[dict, dict, dict]:
    extra = [f"<extra_id_{i}>" for i in range(100)]
    decoder = {"0": _added(0, "<pad>"), "1": _added(1, "</s>"), "2": _added(2, "<unk>")}
    decoder.update({str(32099 - i): _added(32099 - i, f"<extra_id_{i}>") for i in range(100)})
    base = {
        "added_tokens_decoder": decoder, "additional_special_tokens": extra, "clean_up_tokenization_spaces": True,
        "eos_token": "</s>", "extra_ids": 100, "model_max_length": 512, "pad_token": "<pad>",
        "sp_model_kwargs": {}, "tokenizer_class": "T5Tokenizer", "unk_token": "<unk>",
    }
    flux = {"add_prefix_space": True, **base, "legacy": True}
    special = {"additional_special_tokens": extra, "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}
    return base, flux, special


def corpus() -> list[str]:
    fixed = [
        # prompts, plain and punctuation
        "a photograph of an astronaut riding a horse",
        "A cat holding a sign that says hello world",
        "Hello, world!", "what?!", "a...b", "e.g. 1,000.5", "it's", "don't", "they'll", "I'M", "We've",
        "rock'n'roll", "\"quoted\" and 'single'", "«guillemets» „low“ ‘curly’ “double”", "em—dash en–dash",
        "~!@#$%^&*()_+`-={}|[]\\:\";'<>?,./", "c++ & c# / f#", "user@example.com http://x.y/z?q=1&r=2",
        "snake_case and kebab-case", "...", "!!!", "?", ",", ", , ,", "a,b;c:d", "“smart” ‘quotes’ …",
        # numbers and digits
        "1234567890", "3.14159", "1/2 cup", "10% off", "½ ⅓ ² ³ ⁴", "Ⅻ ⅻ", "٣٤٥", "१२३", "0x1F", "1e-5",
        "2024-11-24T05:30:00Z", "4k 8K uhd", "sd1.5 vs sdxl 1.0", "Flux.1 [dev]", "1,234,567.89 $", "№ 5",
        "๑๒๓", "①②③", "⑴⑵", "¹²³", "₀₁₂", "ｘ２",
        # accents, casing, compatibility forms
        "café naïve résumé", "Crème Brûlée", "ÉCOLE ÉLÉMENTAIRE", "cafe\u0301 (decomposed)", "Ångström",
        "A\u030angstro\u0308m", "straße STRASSE", "İstanbul", "ΣΊΣΥΦΟΣ", "Ὀδυσσεύς", "Привет, мир", "ПРИВЕТ",
        "ǅemal", "ﬁne ﬂow ligatures", "ｆｕｌｌｗｉｄｔｈ", "Ａ１", "Ａ\u0301 fullwidth with a mark", "HeLLo WoRLD",
        "ﾊﾝｶｸ half-width katakana", "㍻ ㌔ ㎏ ㎞", "™ ℃ ℉ Ω", "e\u0301\u0301 two marks", "n\u0303o", "ạ̀", "ǆ",
        "Vũ Đình Nguyễn", "Łódź Kraków", "Øre ærø", "Ðð Þþ", "ﬀ ﬃ", "ℌℑ", "𝐁𝐨𝐥𝐝 𝑖𝑡𝑎𝑙𝑖𝑐", "ⓐⓑⓒ",
        # CJK and other scripts
        "猫", "一只猫在屋顶上", "日本語のテキスト", "カタカナ ひらがな", "한국어 텍스트", "cat猫dog", "北京2024",
        "中文，标点。", "汉字 漢字", "\U00020000\U0002a700", "مرحبا بالعالم", "שלום", "สวัสดี", "नमस्ते दुनिया",
        "क्षत्रिय", "தமிழ்", "ᄀᄁ 한", "\u1100\u1161\u11a8", "Ελληνικά", "ქართული", "Հայերեն", "ខ្មែរ",
        # emoji
        "🐱", "a 🐱 cat", "👍🏽", "👨‍👩‍👧 family", "❤️ heart", "🇯🇵 flag", "🏳️‍🌈", "😀😃😄", "✨sparkle✨",
        "a😀b", "🙂 🙃", "☺︎ ☺️", "1️⃣ keycap", "©️ ®️",
        # whitespace runs and control oddities
        "", " ", "   ", "  leading", "trailing  ", "trailing ", "a  b", "a   b    c", "tab\tsep", "tabs\t\t\tx",
        "new\nline", "lines\n\n\nx", "cr\r\nlf", "\u00a0nbsp\u00a0", "em\u2003space", "ideo\u3000space",
        "zero\u200bwidth", "zwj\u200dhere", "soft\u00adhyphen", "a\x00b", "bell\x07char", "repl\ufffdchar",
        "line\u2028sep", "para\u2029sep", "vt\x0bff\x0c", "\x85nel", "mixed \t \n spaces", "\u200b", "\ufeffbom",
        " \u3000 \u00a0 ", "x\u2009thin\u202fnarrow", "\u180e mongolian", "end\n", "\t", "\n\n",
        # the metaspace character itself
        "▁", "a▁b", "▁▁x", "▁ ▁",
        # A1111 syntax characters
        "(masterpiece:1.2), best quality", "[blurry]", "\\(escaped\\)", "((a))", "a BREAK b", "<lora:foo:0.8>",
        "{a|b}", "[cat:dog:0.5]", "(red hair:1.1), (blue eyes:0.9)", "score_9, score_8_up, source_anime",
        # special and added tokens in the text
        "hello</s>", "a </s> b", "</s></s>", "<pad>", "x<pad>y", "<unk>", "a <unk> b", "<extra_id_0>",
        "<extra_id_99> end", "<extra_id_100>", "<extra_id_1><extra_id_10>", "</s", "<s>", "<extra_id_5 >",
        "  </s>  ", "</s> leading space after", "word</s>word",
        # unknown characters (not in T5's vocabulary)
        "{curly}", "~tilde~", "<angle>", "`backtick`", "\\backslash", "#hash", "€ £ ¥ ₹", "→ ← ↑", "§¶†‡",
    ]
    words = ("masterpiece best quality ultra detailed photorealistic portrait woman forest light "
             "cinematic 8k sharp focus volumetric fog golden hour bokeh").split()
    long_texts = [
        ", ".join(["masterpiece", "best quality", "ultra detailed", "8k", "photorealistic"] * 30),
        " ".join(f"word{i}" for i in range(300)),
        "a very long prompt " * 150,
        "portrait of a woman, " * 60 + "(detailed eyes:1.3), [[blurry]]",
        " ".join(random.Random(5).choice(words) for _ in range(700)),
        "1234567890 " * 80,
        "猫犬" * 400,
        "The quick brown fox jumps over the lazy dog. " * 40,
        "café, naïve — résumé! " * 60,
        "🐱 a cat " * 150,
    ]
    rng = random.Random(13)
    pool = (
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
        "     ,.;:!?'\"()[]{}<>\\/|-_+=*&^%$#@~`"
        "éèêëàâäôöûüçñßÉÀØøåæœ\u0301\u0308"
        "猫犬日本語中文字한국어ｆＡ１ﬁ"
        "😀🐱👍🏽❤️✨\u200d\ufe0f▁"
        "\t\n\r\u00a0\u3000\u200b½²٣"
    )
    randoms = ["".join(rng.choice(pool) for _ in range(rng.randint(1, 80))) for _ in range(160)]
    randoms += ["".join(rng.choice(pool) for _ in range(rng.randint(300, 1500))) for _ in range(6)]
    randoms += ["<extra_id_7>".join(rng.choice(["a", " ", "</s>", "x y", "<pad>", "  "]) for _ in range(12))
                for _ in range(6)]
    return fixed + long_texts + randoms


def fast_rows(tokenizer, texts: list[str]) -> dict:
    rows: dict[str, object] = {"ids": [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]}
    for length in LENGTHS:
        for special in (True, False):
            out = tokenizer(texts, padding="max_length", max_length=length, truncation=True,
                            add_special_tokens=special)
            assert all(len(row) == length for row in out["input_ids"])
            key = f"{length}{'' if special else '_bare'}"
            rows[key] = {"input_ids": out["input_ids"], "attention_mask": out["attention_mask"]}
    return rows


def chroma_masks(folder: Path, texts: list[str]) -> list[list[int]]:
    """The transformer's text mask as diffusers' ChromaPipeline computes it, for a batch of prompts."""
    from types import SimpleNamespace

    import torch
    from diffusers import ChromaPipeline
    from transformers import T5Config, T5EncoderModel, T5TokenizerFast

    torch.manual_seed(0)
    encoder = T5EncoderModel(T5Config(vocab_size=32128, d_model=8, d_kv=4, d_ff=16, num_layers=1, num_heads=2))
    fake = SimpleNamespace(tokenizer=T5TokenizerFast.from_pretrained(folder), text_encoder=encoder,
                           _execution_device=torch.device("cpu"))
    _, mask = ChromaPipeline._get_t5_prompt_embeds(fake, texts, max_sequence_length=512,
                                                    device=torch.device("cpu"), dtype=torch.float32)
    return mask.to(torch.int64).tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sdist", type=Path, help="stable_diffusion_cpp_python-*.tar.gz (else pip downloads it)")
    args = parser.parse_args()

    # the refvenv's torchvision does not match its torch; transformers and diffusers use it only if it imports
    sys.modules.setdefault("torchvision", None)
    import transformers
    from transformers import T5Tokenizer, T5TokenizerFast

    with tempfile.TemporaryDirectory() as tmp:
        sdist = args.sdist
        if sdist is None:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", tmp,
                            SDIST], check=True)
            sdist = next(Path(tmp).glob("*.tar.gz"))
        raw = extract_tokenizer_json(sdist)
    tok = json.loads(raw)

    (OUT / "flux").mkdir(parents=True, exist_ok=True)  # reference_ids_tf5.json.gz (make_t5_refs_tf5.py) stays
    with gzip.GzipFile(OUT / "tokenizer.json.gz", "wb", mtime=0) as f:
        f.write(raw)
    (OUT / "spiece.model").write_bytes(build_spiece_model(tok))
    base, flux, special = configs()
    (OUT / "tokenizer_config.json").write_text(json.dumps(base, indent=2) + "\n", encoding="utf-8")
    (OUT / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n", encoding="utf-8")
    (OUT / "flux" / "tokenizer_config.json").write_text(json.dumps(flux, indent=2) + "\n", encoding="utf-8")

    texts = corpus()
    result: dict[str, object] = {
        "transformers": transformers.__version__,
        "texts": texts,
    }
    with tempfile.TemporaryDirectory() as tmp:
        plain, flux_dir = Path(tmp) / "plain", Path(tmp) / "flux"
        for folder, config in ((plain, base), (flux_dir, flux)):
            folder.mkdir()
            (folder / "tokenizer.json").write_bytes(raw)
            shutil.copy(OUT / "spiece.model", folder / "spiece.model")
            shutil.copy(OUT / "special_tokens_map.json", folder / "special_tokens_map.json")
            (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
        fast = T5TokenizerFast.from_pretrained(plain)
        converted = T5TokenizerFast.from_pretrained(flux_dir)
        assert "Strip" in json.dumps(json.loads(converted.backend_tokenizer.to_str())["normalizer"]), \
            "the flux configuration did not convert from spiece.model"
        slow = T5Tokenizer.from_pretrained(flux_dir)
        result["json"] = fast_rows(fast, texts)
        result["flux"] = fast_rows(converted, texts)
        only_spiece = Path(tmp) / "spiece"
        only_spiece.mkdir()
        for name in ("spiece.model", "special_tokens_map.json", "tokenizer_config.json"):
            shutil.copy(OUT / name, only_spiece / name)
        from_spiece = T5TokenizerFast.from_pretrained(only_spiece)
        result["spiece"] = {"ids": [from_spiece(t, add_special_tokens=False)["input_ids"] for t in texts]}
        # the other prefix schemes of the converter (legacy=False: "first"; add_prefix_space false or
        # from_slow with a tokenizer.json: "never"): bare ids
        variants: dict[str, dict] = {}
        for name, overrides in VARIANTS.items():
            folder = Path(tmp) / name
            folder.mkdir()
            for file in ("spiece.model", "special_tokens_map.json"):
                shutil.copy(OUT / file, folder / file)
            (folder / "tokenizer.json").write_bytes(raw)
            (folder / "tokenizer_config.json").write_text(json.dumps({**base, **overrides}), encoding="utf-8")
            tok_variant = T5TokenizerFast.from_pretrained(folder)
            scheme = json.loads(tok_variant.backend_tokenizer.to_str())["pre_tokenizer"]["prepend_scheme"]
            variants[name] = {"config": overrides, "prepend_scheme": scheme,
                              "ids": [tok_variant(t, add_special_tokens=False)["input_ids"] for t in texts]}
        result["variants"] = variants
        result["slow_ids"] = [slow(t, add_special_tokens=False)["input_ids"] for t in texts]
        batch = [texts[0], "", "a cat", texts[-20], " ".join(["long"] * 600), "猫 " * 3]
        result["chroma"] = {"texts": batch, "mask": chroma_masks(plain, batch)}
    import tokenizers

    result["tokenizers"] = tokenizers.__version__
    with gzip.GzipFile(OUT / "reference_ids.json.gz", "wb", mtime=0) as f:
        f.write(json.dumps(result, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))

    agree = sum(a == b for a, b in zip(result["json"]["ids"], result["flux"]["ids"]))
    slow_agree = sum(a == b for a, b in zip(result["flux"]["ids"], result["slow_ids"]))
    longest = max(len(ids) for ids in result["json"]["ids"])
    past = {n: sum(len(ids) >= n for ids in result["json"]["ids"]) for n in LENGTHS}
    print(f"{len(texts)} texts; longest {longest} ids; at or past 256: {past[256]}, 512: {past[512]}")
    print(f"tokenizer.json vs converted-from-spiece.model (flux config): {agree}/{len(texts)} texts agree")
    print(f"slow T5Tokenizer (sentencepiece) vs fast (flux config): {slow_agree}/{len(texts)} agree")
    for path in sorted(OUT.rglob("*")):
        if path.is_file():
            print(f"  {path.relative_to(ROOT)}: {path.stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
