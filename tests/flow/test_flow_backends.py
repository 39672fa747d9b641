"""Every exported part of the flow folders on every installed backend, against onnxruntime and diffusers.

The feeds are the real ones of each folder's first reference case (token ids, the transformer's first call
as diffusers made it, the VAE decoder's input, the init image); the transformer's output is also checked
against the output torch gave in that call. ggml gets the feeds' shapes pinned (it needs static shapes).
Tolerance: 1e-4 of the output's largest magnitude (the float32 parts agree to ~1e-6 here; the bound leaves
room for other CPUs' summation orders, not for a wrong op).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import KINDS, cases, folder, refs, register

import sdrt

ort = pytest.importorskip("onnxruntime")

BACKENDS = ("reference", "openvino", "ggml")
T5 = {"sd3": "text_encoder_3", "flux-dev": "text_encoder_2", "flux-schnell": "text_encoder_2", "chroma": "text_encoder"}
IDS = {"text_encoder": {"sd3": "ids_l", "chroma": "ids_t5"}, "text_encoder_2": {"sd3": "ids_g"}}


def _parts(kind: str) -> list[str]:
    return sorted(p.name for p in folder(kind).iterdir() if (p / "model.onnx").exists())


def feeds_for(kind: str, part: str) -> dict[str, np.ndarray]:
    r = refs(kind)
    case = cases(kind)[0]
    n = case["name"]
    if part == "transformer":
        f = {k.rsplit("/", 1)[1]: r[k] for k in r if k.startswith(f"{n}/call0/") and not k.endswith("/out")}
        if kind == "sd3":
            pe = r[f"{n}/prompt_embeds"]
            f["encoder_hidden_states"] = np.concatenate([r[f"{n}/negative_prompt_embeds"], pe]) if case["cfg"] > 1 else pe
        else:
            f["encoder_hidden_states"] = r[f"{n}/prompt/prompt_embeds"]
        return f
    if part == "vae_decoder":
        return {"latent_sample": r[f"{n}/decoder_in"]}
    if part == "vae_encoder":
        img = r["init_image"].astype(np.float32)[None].transpose(0, 3, 1, 2) / np.float32(255) * 2 - 1
        return {"sample": img.astype(np.float32)}
    key = "ids_t5" if part == T5[kind] else IDS.get(part, {}).get(kind, "ids_clip")
    f = {"input_ids": r[f"{n}/prompt/{key}"].astype(np.int64)}
    if kind == "chroma":
        f["attention_mask"] = r[f"{n}/prompt/tokenizer_mask"].astype(np.int64)
    return f


PARAMS = [(k, p, b) for k in KINDS for p in _parts(k) for b in BACKENDS]


@pytest.mark.parametrize(("kind", "part", "backend"), PARAMS, ids=[f"{k}-{p}-{b}" for k, p, b in PARAMS])
def test_part_matches_onnxruntime(kind: str, part: str, backend: str) -> None:
    register(backend)
    path = folder(kind) / part / "model.onnx"
    feeds = feeds_for(kind, part)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    options = {"shapes": {k: v.shape for k, v in feeds.items()}} if backend == "ggml" else {}
    with sdrt.load(path, backend=backend, **options) as s:
        got = s.run(feeds)
    names = [o.name for o in s.outputs]
    for name, w in zip(names, want):
        g = got[name]
        assert g.shape == w.shape, name
        assert np.isfinite(g).all(), f"{part} {name}: non-finite values on {backend}"
        scale = max(1.0, float(np.abs(w).max()))
        err = float(np.abs(g.astype(np.float32) - w.astype(np.float32)).max())
        assert err <= 1e-4 * scale, f"{kind} {part} {name} on {backend}: max error {err:.2e} (scale {scale:.1f})"
    if part == "transformer":
        torch_out = refs(kind)[f"{cases(kind)[0]['name']}/call0/out"]
        err = float(np.abs(got[names[0]] - torch_out).max())
        assert err <= 1e-4 * max(1.0, float(np.abs(torch_out).max())), f"vs diffusers: {err:.2e}"


def test_chroma_case_really_drops_padding_rows() -> None:
    """The transformer test above feeds a mask that drops text rows (their attention has no key left), so its
    finite, matching outputs cover the zero-row rule on every backend."""
    f = feeds_for("chroma", "transformer")
    mask = f["attention_mask"]
    text = f["encoder_hidden_states"].shape[1]
    assert mask.dtype == bool and not mask[:, :text].all() and mask[:, text:].all()
    assert mask[0, :text].sum() == refs("chroma")[f"{cases('chroma')[0]['name']}/prompt/tokenizer_mask"].sum() + 1
