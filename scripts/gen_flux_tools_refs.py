"""Tiny FLUX.1 Tools transformers (Fill: 384 input channels; Canny/Depth "Control": 128) and diffusers' images.

Builds the tiny Flux dev pipeline of ``gen_flow_refs.py`` again (the same seeds, so the same text encoders, VAE,
tokenizers and scheduler as ``tests/data/pipelines/tiny-flux-dev``; checked below against that folder's ONNX
parts with onnxruntime), puts in a ``FluxTransformer2DModel`` with ``in_channels`` 384 or 128 and
``out_channels`` 64 (FLUX.1-Fill-dev's and FLUX.1-Canny/Depth-dev's ``transformer/config.json``), exports it in
Optimum's layout and names (``hidden_states [batch, tokens, 384]``) and runs diffusers 0.42's ``FluxFillPipeline``
and ``FluxControlPipeline`` with ``torch.Generator("cpu").manual_seed(seed)``.

Writes ``tests/data/pipelines/tiny-flux-{fill,control}/``: ``transformer/`` (model.onnx, its data, config.json),
``model_index.json``, ``refs.json`` (the cases) and ``refs.npz`` (the init image, mask, control image, each
case's image, and the first transformer call's ``hidden_states``). The other parts are tiny-flux-dev's: the tests
put them beside the transformer (``tests/flow/flux_tools_helpers.py``).

    PYTHONPATH=scripts /work/refvenv/bin/python scripts/gen_flux_tools_refs.py
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen_flow_refs as g  # noqa: E402  (blocks torchvision first)
import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
from diffusers import FluxControlPipeline, FluxFillPipeline, FluxTransformer2DModel  # noqa: E402
from PIL import Image  # noqa: E402

DEV = g.OUT / "tiny-flux-dev"
TOOLS = {"fill": 384, "control": 128}
CLASSES = {"fill": "FluxFillPipeline", "control": "FluxControlPipeline"}

CASES = {
    "fill": [
        dict(name="fill-64x96", width=96, height=64, steps=3, seed=7, guidance=30.0, batch=1, strength=1.0),
        dict(name="fill-96x64-g10", width=64, height=96, steps=2, seed=1, guidance=10.0, batch=1, strength=1.0),
        dict(name="fill-batch2-strength", width=64, height=64, steps=4, seed=3, guidance=30.0, batch=2,
             strength=0.6),
    ],
    "control": [
        dict(name="control-96x64", width=64, height=96, steps=3, seed=5, guidance=10.0, batch=1),
        dict(name="control-batch2", width=96, height=64, steps=2, seed=11, guidance=30.0, batch=2),
    ],
}
PROMPT = "a photo of a red cat sitting on a wooden table, sunset"


def picture(h: int, w: int) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([x / (w - 1), y / (h - 1), 1 - (x / w + y / h) / 2], axis=-1)
    img[h // 4: h // 2, w // 5: w // 2] = (0.9, 0.2, 0.1)
    img[((y - 0.7 * h) ** 2 + (x - 0.3 * w) ** 2) < (h / 6) ** 2] = (0.1, 0.3, 0.9)
    return (img * 255).round().astype(np.uint8)


def mask(h: int, w: int) -> np.ndarray:
    """White = repaint; a rectangle off the 8x8 grid, with grays around 0.5 (diffusers binarizes at 0.5)."""
    m = np.zeros((h, w), np.uint8)
    m[h // 5: h // 5 + h // 2, w // 3: w // 3 + w // 2 + 3] = 255
    m[2:6, 2:30] = 127  # just under 0.5: kept
    m[6:10, 2:30] = 128  # just over: repainted
    return m


def edges(h: int, w: int) -> np.ndarray:
    """A control image (white edges on black, as a canny map): outlines of a box and a circle."""
    y, x = np.mgrid[0:h, 0:w]
    e = np.zeros((h, w), bool)
    e[h // 4, w // 5: w // 2] = e[h // 2, w // 5: w // 2] = True
    e[h // 4: h // 2, w // 5] = e[h // 4: h // 2, w // 2] = True
    r = np.sqrt((y - 0.7 * h) ** 2 + (x - 0.3 * w) ** 2)
    e |= np.abs(r - h / 6) < 0.8
    return np.repeat((e * 255).astype(np.uint8)[..., None], 3, axis=-1)


def check_shared_parts(pipe) -> None:
    """The rebuilt text encoders and VAE are tiny-flux-dev's (its ONNX parts, run by onnxruntime)."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 400, (1, 77)).astype(np.int64)
    checks = [("text_encoder", {"input_ids": ids}, lambda: pipe.text_encoder(torch.from_numpy(ids))[0]),
              ("text_encoder_2", {"input_ids": ids[:, :20]},
               lambda: pipe.text_encoder_2(torch.from_numpy(ids[:, :20]))[0])]
    z = rng.standard_normal((1, 16, 8, 12)).astype(np.float32)
    checks.append(("vae_decoder", {"latent_sample": z}, lambda: pipe.vae.decode(torch.from_numpy(z)).sample))
    for part, feeds, torch_fn in checks:
        sess = ort.InferenceSession(str(DEV / part / "model.onnx"), providers=["CPUExecutionProvider"])
        got = sess.run(None, feeds)[0]
        with torch.no_grad():
            want = torch_fn().numpy()
        err = float(np.abs(got - want).max())
        assert err < 1e-4, f"{part}: the rebuilt part is not tiny-flux-dev's (max error {err})"
        print(f"  {part}: rebuilt = tiny-flux-dev's ONNX part (max error {err:.1e})")


def transformer(in_channels: int, seed: int) -> FluxTransformer2DModel:
    torch.manual_seed(seed)
    tr = FluxTransformer2DModel(patch_size=1, in_channels=in_channels, out_channels=64, num_layers=1,
                                num_single_layers=2, attention_head_dim=16, num_attention_heads=2,
                                joint_attention_dim=g.T5_WIDTH, pooled_projection_dim=32, guidance_embeds=True,
                                axes_dims_rope=(4, 6, 6)).eval()
    g.scale_weights(tr, 4)
    return tr


def export(tr, tool: str, out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    (out / "transformer").mkdir(parents=True)
    width = tr.config.in_channels
    hw = {0: "batch_size", 1: "packed_height_width"}
    dyn = {"hidden_states": hw, "encoder_hidden_states": {0: "batch_size", 1: "sequence_length"},
           "pooled_projections": {0: "batch_size"}, "timestep": {0: "step"}, "txt_ids": {0: "sequence_length"},
           "img_ids": {0: "packed_height_width"}, "guidance": {0: "batch_size"}, "out_hidden_states": hw}
    names = ["hidden_states", "encoder_hidden_states", "pooled_projections", "timestep", "txt_ids", "img_ids",
             "guidance"]
    args = (torch.randn(1, 16, width), torch.randn(1, 20, g.T5_WIDTH), torch.randn(1, 32), torch.tensor([0.5]),
            torch.zeros(20, 3), torch.zeros(16, 3), torch.tensor([3.5]))
    path = out / "transformer" / "model.onnx"
    g._export(g._Flux(tr), args, path, names, ["out_hidden_states"], dyn, external=True)
    rng = np.random.default_rng(1)
    grid = np.zeros((4, 6, 3), np.float32)
    grid[..., 1] = np.arange(4)[:, None]
    grid[..., 2] = np.arange(6)[None, :]
    f32 = np.float32
    g._check_export(path, g._Flux(tr), {
        "hidden_states": rng.standard_normal((2, 24, width)).astype(f32),
        "encoder_hidden_states": rng.standard_normal((2, 41, g.T5_WIDTH)).astype(f32),
        "pooled_projections": rng.standard_normal((2, 32)).astype(f32), "timestep": np.array([0.7, 0.7], f32),
        "txt_ids": np.zeros((41, 3), f32), "img_ids": grid.reshape(-1, 3), "guidance": np.array([30, 2.0], f32)})
    tr.save_config(out / "transformer")
    index = json.loads((DEV / "model_index.json").read_text())
    index["_class_name"] = "ORT" + CLASSES[tool]
    (out / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")


def run(pipe, tool: str, case: dict, refs: dict) -> None:
    name, h, w = case["name"], case["height"], case["width"]
    calls: list[np.ndarray] = []
    hook = pipe.transformer.register_forward_hook(
        lambda m, a, kw, out: calls.append(kw["hidden_states"].numpy().copy()), with_kwargs=True)
    gen = torch.Generator("cpu").manual_seed(case["seed"])
    kw = dict(prompt=PROMPT, height=h, width=w, num_inference_steps=case["steps"], guidance_scale=case["guidance"],
              generator=gen, num_images_per_prompt=case["batch"], output_type="np", max_sequence_length=g.MAX_SEQ)
    try:
        with torch.no_grad():
            if tool == "fill":
                img, m = picture(h, w), mask(h, w)
                refs[f"{name}/init_image"], refs[f"{name}/mask"] = img, m
                result = pipe(image=Image.fromarray(img), mask_image=Image.fromarray(m, "L"),
                              strength=case["strength"], **kw)
            else:
                c = edges(h, w)
                refs[f"{name}/control_image"] = c
                result = pipe(control_image=Image.fromarray(c), **kw)
    finally:
        hook.remove()
    image = (result.images * 255).round().astype(np.uint8)
    refs[f"{name}/image"] = image
    refs[f"{name}/call0/hidden_states"] = calls[0]
    case.update(calls=len(calls), max_sequence_length=g.MAX_SEQ, prompt=PROMPT)
    print(f"  {name}: {image.shape} std {float(image.std()):.1f}, {len(calls)} calls, "
          f"hidden_states {tuple(calls[0].shape)}")


def _tokenizers_from_dev() -> None:
    """The tokenizers as tiny-flux-dev saved them, instead of building them again (that needs open_clip's BPE
    file and a SentencePiece training run); check_shared_parts shows the rest came out the same."""
    from transformers import CLIPTokenizer, T5TokenizerFast

    def clip(folder: Path, pad: str):
        shutil.copytree(DEV / "tokenizer", folder, dirs_exist_ok=True)
        return CLIPTokenizer.from_pretrained(folder)

    def t5(folder: Path):
        shutil.copytree(DEV / "tokenizer_2", folder, dirs_exist_ok=True)
        return T5TokenizerFast.from_pretrained(folder)

    g.write_tokenizer, g.write_t5_tokenizer = clip, t5


def main() -> None:
    torch.set_num_threads(2)
    _tokenizers_from_dev()
    base = g.build("flux-dev")
    check_shared_parts(base)
    base.scheduler = g.FlowMatchEulerDiscreteScheduler.from_pretrained(DEV / "scheduler")
    for k, (tool, width) in enumerate(TOOLS.items()):
        print(tool)
        tr = transformer(width, 20 + k)
        out = g.OUT / f"tiny-flux-{tool}"
        export(tr, tool, out)
        cls = FluxFillPipeline if tool == "fill" else FluxControlPipeline
        pipe = cls(scheduler=base.scheduler, vae=base.vae, text_encoder=base.text_encoder, tokenizer=base.tokenizer,
                   text_encoder_2=base.text_encoder_2, tokenizer_2=base.tokenizer_2, transformer=tr)
        pipe.set_progress_bar_config(disable=True)
        refs: dict[str, np.ndarray] = {}
        cases = [dict(c) for c in CASES[tool]]
        for case in cases:
            run(pipe, tool, case, refs)
        (out / "refs.json").write_text(json.dumps(cases, indent=1) + "\n")
        np.savez_compressed(out / "refs.npz", **refs)
        size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
        print(f"  tiny-flux-{tool}: {size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
