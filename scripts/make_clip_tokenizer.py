"""Build the committed CLIP tokenizer folder and the reference ids that sdrt's tokenizer is tested against.

What it writes, under ``tests/data/clip-tokenizer/``:

- ``vocab.json.gz`` and ``merges.txt.gz``: CLIP's vocabulary, built from the BPE
  file that ``open_clip_torch`` ships (``bpe_simple_vocab_16e6.txt.gz``) exactly as
  open_clip and transformers build it (256 byte symbols, the same with ``</w>``,
  48 894 merges, then ``<|startoftext|>`` and ``<|endoftext|>``: 49 408 ids);
- ``tokenizer_config.json`` and ``special_tokens_map.json``: SD 1.x's (pads with
  ``<|endoftext|>``);
- ``sd2/tokenizer_config.json`` and ``sd2/special_tokens_map.json``: SD 2.x's
  (pads with ``!``, id 0);
- ``contractions_ids.json``: the same for texts built around CLIP's seven
  contractions (``'s 't 're 've 'm 'll 'd``, lower, upper and mixed case, at word
  ends, alone, before letters, digits and punctuation), which the word pattern
  matches before letters; kept apart so that the corpus above stays as it was;
- ``reference_ids.json``: a varied corpus (punctuation, numbers, accents, CJK,
  emoji, whitespace oddities, A1111 syntax, special tokens, text past 77 tokens,
  and seeded random strings) with the ids of transformers' slow ``CLIPTokenizer``
  (bare and padded to 77) for both configurations, and whether
  ``CLIPTokenizerFast`` gives the same ids.

It needs transformers 4.x, the last series with the slow Python ``CLIPTokenizer``
(5.x has only the ``tokenizers``-backed one), and no torch::

    python -m venv /tmp/tok-ref && /tmp/tok-ref/bin/pip install "transformers==4.57.6"
    /tmp/tok-ref/bin/python scripts/make_clip_tokenizer.py \\
        --bpe /path/to/site-packages/open_clip/bpe_simple_vocab_16e6.txt.gz

Without ``ftfy`` installed, transformers cleans text with BERT's BasicTokenizer;
sdrt reproduces that path. With ``--ftfy`` it also counts how often the
ftfy path would agree (ftfy must be installed then); that count is printed, not stored.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import random
import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "clip-tokenizer"

BOS, EOS = "<|startoftext|>", "<|endoftext|>"


def _special(content: str) -> dict[str, object]:
    return {"content": content, "lstrip": False, "normalized": True, "rstrip": False, "single_word": False}


# the configurations as the SD 1.5 and SD 2.1 repositories ship them (the fields that matter)
SD1_CONFIG = {
    "add_prefix_space": False, "bos_token": _special(BOS), "do_lower_case": True, "eos_token": _special(EOS),
    "errors": "replace", "model_max_length": 77, "pad_token": EOS, "tokenizer_class": "CLIPTokenizer",
    "unk_token": _special(EOS),
}
SD1_SPECIAL = {"bos_token": _special(BOS), "eos_token": _special(EOS), "pad_token": EOS, "unk_token": _special(EOS)}
SD2_CONFIG = {**SD1_CONFIG, "pad_token": "!"}
SD2_SPECIAL = {**SD1_SPECIAL, "pad_token": "!"}


def bytes_to_unicode() -> dict[int, str]:
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            cs.append(256 + extra)
            extra += 1
    return dict(zip(printable, [chr(c) for c in cs]))


def build_vocab(bpe_file: Path) -> tuple[dict[str, int], list[str]]:
    lines = gzip.open(bpe_file).read().decode("utf-8").split("\n")
    merges = lines[1 : 49152 - 256 - 2 + 1]
    symbols = list(bytes_to_unicode().values())
    vocab = symbols + [s + "</w>" for s in symbols]
    vocab += ["".join(m.split()) for m in merges]
    vocab += [BOS, EOS]
    return {t: i for i, t in enumerate(vocab)}, merges


def corpus() -> list[str]:
    fixed = [
        # plain and punctuation
        "a photograph of an astronaut riding a horse",
        "Hello, world!", "what?!", "a...b", "e.g. 1,000.5", "it's", "don't", "they'll", "I'M", "We've",
        "rock'n'roll", "\"quoted\" and 'single'", "«guillemets» „low“ ‘curly’", "em—dash en–dash",
        "~!@#$%^&*()_+`-={}|[]\\:\";'<>?,./", "c++ & c# / f#", "user@example.com http://x.y/z?q=1",
        "snake_case and kebab-case", "...", "!!!", "?", ",", ", , ,",
        # numbers
        "1234567890", "3.14159", "1/2 cup", "10% off", "½ ⅓ ² ³ ⁴", "Ⅻ ⅻ", "٣٤٥", "१२३", "0x1F", "1e-5",
        "2024-11-24T05:30:00Z", "4k 8K uhd", "sd1.5 vs sdxl 1.0",
        # accents and casing
        "café naïve résumé", "Crème Brûlée", "ÉCOLE ÉLÉMENTAIRE", "cafe\u0301 (decomposed)", "Ångström",
        "straße STRASSE", "İstanbul", "ΣΊΣΥΦΟΣ", "Ὀδυσσεύς", "Привет, мир", "ПРИВЕТ", "ǅemal", "ﬁne ligature",
        "ｆｕｌｌｗｉｄｔｈ", "Ａ１", "HeLLo WoRLD",
        # CJK and other scripts
        "猫", "一只猫在屋顶上", "日本語のテキスト", "カタカナ ひらがな", "한국어 텍스트", "cat猫dog", "北京2024",
        "中文，标点。", "汉字 漢字", "\U00020000\U0002a700", "مرحبا بالعالم", "שלום", "สวัสดี", "नमस्ते दुनिया",
        # emoji
        "🐱", "a 🐱 cat", "👍🏽", "👨‍👩‍👧 family", "❤️ heart", "🇯🇵 flag", "🏳️‍🌈", "😀😃😄", "✨sparkle✨",
        # whitespace and control oddities
        "", " ", "   ", "  leading", "trailing  ", "tab\tsep", "new\nline", "cr\r\nlf", "\u00a0nbsp\u00a0",
        "em\u2003space", "zero\u200bwidth", "soft\u00adhyphen", "a\x00b", "bell\x07char", "repl\ufffdchar",
        "line\u2028sep", "para\u2029sep", "vt\x0bff\x0c", "\x85nel", "mixed \t \n spaces",
        # A1111 syntax characters
        "(masterpiece:1.2), best quality", "[blurry]", "\\(escaped\\)", "((a))", "a BREAK b", "<lora:foo:0.8>",
        "{a|b}", "[cat:dog:0.5]", "(word:1.2:3)", "((((deep))))", "(unbalanced", "embedding:easynegative",
        "score_9, score_8_up, source_anime", "(red hair:1.1), (blue eyes:0.9)",
        # special tokens in the text (and "!", which SD 2.x's tokenizer treats as one)
        f"{BOS}hi{EOS}", f"a {EOS} b", f"{EOS}{EOS}", "a!b", "wow!!", "<|startoftext", "|endoftext|>",
    ]
    long_texts = [
        ", ".join(["masterpiece", "best quality", "ultra detailed", "8k", "photorealistic"] * 8),
        " ".join(f"word{i}" for i in range(120)),
        "a very long prompt " * 30,
        "portrait of a woman, " * 20 + "(detailed eyes:1.3), [[blurry]]",
    ]
    rng = random.Random(13)
    pool = (
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
        "     ,.;:!?'\"()[]{}<>\\/|-_+=*&^%$#@~`"
        "éèêëàâäôöûüçñßÉÀØøåæœ"
        "猫犬日本語中文字한국어"
        "😀🐱👍🏽❤️✨\u200d\ufe0f"
        "\t\n\u00a0\u3000½²٣"
    )
    randoms = ["".join(rng.choice(pool) for _ in range(rng.randint(1, 60))) for _ in range(120)]
    return fixed + long_texts + randoms


CONTRACTIONS = ("s", "t", "re", "ve", "m", "ll", "d")


def contraction_texts() -> list[str]:
    """Every contraction of CLIP's word pattern in lower, upper and mixed case, in the places the pattern meets it."""
    words = {"s": "it", "t": "don", "re": "you", "ve": "we", "m": "i", "ll": "they", "d": "she"}
    texts = []
    for c in CONTRACTIONS:
        w = words[c]
        for word, suffix in ((w, c), (w.upper(), c.upper()), (w.capitalize(), c.upper()), (w.upper(), c)):
            texts.append(f"{word}'{suffix}")
        texts += [f"'{c}", f"'{c.upper()}", f" '{c} ", f"x'{c}x", f"X'{c.upper()}ABC", f"1990'{c}", f"#'{c}!",
                  f"'{c}'{c}", f"''{c}", f"{w}\u2019{c}"]  # the last: a curly apostrophe is not a contraction
    texts += [
        "you're the one who's said they'd've known i'm here and we'll see",
        "YOU'RE THE ONE WHO'S SAID THEY'D'VE KNOWN I'M HERE AND WE'LL SEE",
        "You'Re tHe OnE wHo'S sAiD tHeY'd'Ve KnOwN i'M hErE aNd We'Ll SeE",
        "a portrait of a cat that's sleeping, (they're cute:1.2), [it'd be] nice, we've won, i'll go, i'm ok",
        "'re're're 'REVE 'velvet 'dance 'mmm 'llama 'sss 'ttt",
        "猫'RE 猫's 5'LL 5'd é're É'VE",
    ]
    return texts


def reference(folder: Path, texts: list[str]) -> tuple[list[dict[str, object]], int]:
    from transformers import CLIPTokenizer, CLIPTokenizerFast

    slow = CLIPTokenizer.from_pretrained(folder)
    fast = CLIPTokenizerFast.from_pretrained(folder, from_slow=True)
    if slow.fix_text is not None:  # ftfy is installed: take transformers' own path for when it is not
        from transformers.models.bert.tokenization_bert import BasicTokenizer

        slow.fix_text = None
        slow.nlp = BasicTokenizer(strip_accents=False, do_split_on_punc=False)
    rows = []
    agree = 0
    for text in texts:
        ids = slow(text, add_special_tokens=False)["input_ids"]
        padded = slow(text, padding="max_length", truncation=True, max_length=77)["input_ids"]
        fast_ids = fast(text, add_special_tokens=False)["input_ids"]
        fast_padded = fast(text, padding="max_length", truncation=True, max_length=77)["input_ids"]
        same = ids == fast_ids and padded == fast_padded
        agree += same
        rows.append({"ids": ids, "padded": padded, "fast_agrees": same})
    return rows, agree


def ftfy_agreement(folder: Path, texts: list[str], rows: list[dict[str, object]]) -> int:
    import ftfy
    from transformers import CLIPTokenizer

    tok = CLIPTokenizer.from_pretrained(folder)
    tok.fix_text = ftfy.fix_text
    return sum(tok(t, add_special_tokens=False)["input_ids"] == r["ids"] for t, r in zip(texts, rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bpe", type=Path, help="open_clip's bpe_simple_vocab_16e6.txt.gz")
    parser.add_argument("--ftfy", action="store_true", help="also count agreement of the ftfy path")
    args = parser.parse_args()
    bpe = args.bpe
    if bpe is None:
        spec = importlib.util.find_spec("open_clip")
        if spec is None or not spec.submodule_search_locations:
            parser.error("give --bpe: open_clip is not installed here")
        bpe = Path(next(iter(spec.submodule_search_locations))) / "bpe_simple_vocab_16e6.txt.gz"
    vocab, merges = build_vocab(bpe)
    assert len(vocab) == 49408, len(vocab)

    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "sd2").mkdir(exist_ok=True)
    vocab_text = json.dumps(vocab, ensure_ascii=False)
    merges_text = "#version: 0.2\n" + "\n".join(merges) + "\n"
    # mtime=0 keeps the archives byte-identical from run to run
    (OUT / "vocab.json.gz").write_bytes(gzip.compress(vocab_text.encode("utf-8"), 9, mtime=0))
    (OUT / "merges.txt.gz").write_bytes(gzip.compress(merges_text.encode("utf-8"), 9, mtime=0))
    configs = {"sd1": (SD1_CONFIG, SD1_SPECIAL, OUT), "sd2": (SD2_CONFIG, SD2_SPECIAL, OUT / "sd2")}
    for config, special, folder in configs.values():
        (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
        (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")

    import tokenizers
    import transformers

    texts = corpus()
    result: dict[str, object] = {
        "generator": "scripts/make_clip_tokenizer.py",
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "texts": texts,
    }
    extra: dict[str, object] = {**result, "texts": contraction_texts()}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (config, special, _) in configs.items():
            folder = Path(tmp) / name
            folder.mkdir()
            (folder / "vocab.json").write_text(vocab_text, encoding="utf-8")
            (folder / "merges.txt").write_text(merges_text, encoding="utf-8")
            (folder / "tokenizer_config.json").write_text(json.dumps(config))
            (folder / "special_tokens_map.json").write_text(json.dumps(special))
            rows, agree = reference(folder, texts)
            result[name] = rows
            print(f"{name}: {len(texts)} texts, slow and fast CLIPTokenizer agree on {agree}")
            extra[name], agree = reference(folder, extra["texts"])
            print(f"{name}: {len(extra['texts'])} contraction texts, slow and fast agree on {agree}")
            if args.ftfy:
                print(f"{name}: the ftfy path gives the BasicTokenizer path's ids on"
                      f" {ftfy_agreement(folder, texts, rows)} of {len(texts)}")
        shutil.rmtree(tmp, ignore_errors=True)
    (OUT / "reference_ids.json").write_text(json.dumps(result, ensure_ascii=False, separators=(",", ":")) + "\n",
                                            encoding="utf-8")
    (OUT / "contractions_ids.json").write_text(json.dumps(extra, ensure_ascii=False, separators=(",", ":")) + "\n",
                                               encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
