"""LoRA files as diffusers' training scripts and SimpleTuner's LyCORIS save them, and their references.

Writes into ``tests/data/lora/`` (random factors on the tiny models the other LoRA tests use):

- ``peft_meta_sd1.safetensors``: a PEFT LoRA on the tiny SD 1.x UNet of ``tests/data/ckpt/sd1`` (``make_unet(0)``)
  saved by ``StableDiffusionPipeline.save_lora_weights(..., unet_lora_adapter_metadata=LoraConfig.to_dict())``, as
  diffusers' training scripts save (``_collate_lora_metadata``): no alpha tensors; ``lora_alpha`` 8 against ``r``
  4, a ``rank_pattern`` (``to_k``: 2) and an ``alpha_pattern`` (``attn1.to_q``: 16), all in the header's
  ``lora_adapter_metadata``. ``peft_meta_rslora_sd1.safetensors``: the same with ``use_rslora``. Reference:
  diffusers' ``load_lora_weights`` + ``fuse_lora(lora_scale=0.8)``, which builds its ``LoraConfig`` from that
  metadata (``peft_meta_refs.npz``: ``<file>/unet/<parameter>`` = fused minus before).
- ``flux_peft_meta.safetensors``: the same on the tiny Flux.1 dev transformer (``tests/data/pipelines/tiny-flux-dev``)
  by ``FluxPipeline.save_lora_weights(..., transformer_lora_adapter_metadata=...)``, ``lora_alpha`` 16, ``r`` 4;
  reference likewise (``<file>/<parameter>``).
- ``lycoris_prefix_sd1_{lora,loha,lokr}.safetensors`` and ``lycoris_prefix_flux_lokr.safetensors``: LyCORIS's own
  wrapper (``lycoris.create_lycoris``, as SimpleTuner trains and saves LyCORIS), whose keys are the model's module
  names flattened after ``lycoris_`` (``lycoris_down_blocks_0_attentions_0_proj_in.lokr_w1``,
  ``lycoris_transformer_blocks_0_attn_to_q.lokr_w1``). Reference: LyCORIS's own ``merge_to(1.0)``
  (``lycoris_prefix_refs.npz``). alpha = rank (lycoris-lora 4.1.3 scales LoHa/LoKr by alpha/rank twice, see
  docs/checkpoints.md), 2 for the LoCon file.
- ``lycoris_full_sd1.safetensors`` / ``lycoris_full_prefix_sd1.safetensors``: LyCORIS's full weight differences
  (``algo="full"``: ``diff``, ``diff_b``) and norm deltas (``train_norm=True``: ``w_norm``, ``b_norm``); reference:
  LyCORIS's ``create_lycoris_from_weights`` + ``merge_to(0.7)`` (``lycoris_full_refs.npz``), see ``lycoris_full_norm``;
  ``lycoris_full_flux.safetensors``: the same full diffs (weights and biases) on the tiny Flux.1 dev transformer;
  ``lycoris_full_bfl_flux.safetensors``: full diffs in Black Forest Labs' fused names (sd-scripts), see
  ``lycoris_full_bfl`` (after ``lycoris_full_norm``: it adds to the same npz).
- ``peft_meta_{loha,lokr}_sd1.safetensors``: peft's LoHa / LoKr (``alpha`` 8, ``r`` 4) saved by diffusers'
  ``save_lora_adapter`` (bare keys, the config as bare ``lora_adapter_metadata``); reference: peft's ``merge()``
  (``peft_meta_lycoris_refs.npz``).

    PYTHONPATH=scripts/_tvblock:scripts:core/src /work/refvenv/bin/python scripts/make_lora_layout_refs.py [step ...]
    (needs lycoris-lora 4.1.3, einops and toml beside torch, diffusers 0.42.1 and peft)
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import torch
import tvblock  # noqa: F401  (before transformers is used)
from diffusers import EulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel, StableDiffusionPipeline
from gen_checkpoint_data import fused_deltas, make_unet
from peft import LoraConfig, get_peft_model_state_dict
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "lora"
FLUX_CONFIG = ROOT / "tests" / "data" / "pipelines" / "tiny-flux-dev" / "transformer" / "config.json"
SCALE = 0.8
SD1_MODULES = ["down_blocks.0.attentions.0.proj_in", "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q",
               "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_k",
               "down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_q",
               "up_blocks.1.attentions.0.transformer_blocks.0.ff.net.2", "up_blocks.0.resnets.0.conv1"]
FLUX_MODULES = ["transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.add_k_proj", "transformer_blocks.0.ff.net.2",
                "single_transformer_blocks.0.proj_mlp", "single_transformer_blocks.1.attn.to_v"]


def _randomize(model: torch.nn.Module, seed: int, scale: float = 0.3) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n or "lokr_" in n or "hada_" in n:
                p.copy_(torch.randn(p.shape, generator=g) * scale)


def _sd1_pipe(unet):
    return StableDiffusionPipeline(vae=None, text_encoder=None, tokenizer=None, unet=unet,
                                   scheduler=EulerDiscreteScheduler(), safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)


def _flux():
    cfg = {k: v for k, v in json.loads(FLUX_CONFIG.read_text()).items() if not k.startswith("_")}
    torch.manual_seed(0)
    return FluxTransformer2DModel(**cfg).eval()


def peft_metadata() -> None:
    refs = {}
    for name, extra in (("peft_meta_sd1", {}), ("peft_meta_rslora_sd1", {"use_rslora": True})):
        cfg = LoraConfig(r=4, lora_alpha=8, target_modules=SD1_MODULES, init_lora_weights=False,
                         rank_pattern={"to_k": 2}, alpha_pattern={"attn1.to_q": 16}, **extra)
        unet = make_unet(0)
        unet.add_adapter(cfg)
        _randomize(unet, 5)
        StableDiffusionPipeline.save_lora_weights(OUT, unet_lora_layers=get_peft_model_state_dict(unet),
                                                  unet_lora_adapter_metadata=cfg.to_dict(),
                                                  weight_name=f"{name}.safetensors")
        fresh = make_unet(0)
        for k, v in fused_deltas(_sd1_pipe(fresh), {"unet": fresh}, OUT / f"{name}.safetensors", SCALE).items():
            refs[f"{name}/{k}"] = v
    cfg = LoraConfig(r=4, lora_alpha=16, target_modules=FLUX_MODULES, init_lora_weights=False)
    model = _flux()
    model.add_adapter(cfg)
    _randomize(model, 6, 0.5)
    FluxPipeline.save_lora_weights(OUT, transformer_lora_layers=get_peft_model_state_dict(model),
                                   transformer_lora_adapter_metadata=cfg.to_dict(),
                                   weight_name="flux_peft_meta.safetensors")
    fresh = _flux()
    pipe = FluxPipeline(scheduler=None, vae=None, text_encoder=None, tokenizer=None, text_encoder_2=None,
                        tokenizer_2=None, transformer=fresh)
    for k, v in fused_deltas(pipe, {"transformer": fresh}, OUT / "flux_peft_meta.safetensors", SCALE).items():
        refs[f"flux_peft_meta/{k.split('/', 1)[1]}"] = v
    np.savez_compressed(OUT / "peft_meta_refs.npz", **refs)
    print(f"peft metadata: {len(refs)} parameters changed")


def lycoris_prefix() -> None:
    from lycoris import LycorisNetwork, create_lycoris

    refs = {}
    cases = [(f"lycoris_prefix_sd1_{algo}", make_unet, SD1_MODULES, algo, alpha)
             for algo, alpha in (("lora", 2.0), ("loha", 4.0), ("lokr", 4.0))]
    cases.append(("lycoris_prefix_flux_lokr", _flux, FLUX_MODULES, "lokr", 4.0))
    for name, build, modules, algo, alpha in cases:
        model = build(0) if build is make_unet else build()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        LycorisNetwork.LORA_PREFIX = "lycoris"
        with tempfile.TemporaryDirectory() as tmp:  # a preset file naming the modules (LyCORIS reads toml)
            preset = Path(tmp) / "preset.toml"
            preset.write_text("target_module = []\ntarget_name = [" + ", ".join(f'"{m}"' for m in modules) + "]\n")
            net = create_lycoris(model, 1.0, linear_dim=4, linear_alpha=alpha, algo=algo, factor=4, preset=str(preset))
        net.apply_to()
        g = torch.Generator().manual_seed(9)
        with torch.no_grad():
            for _, p in net.named_parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        net.save_weights(str(OUT / f"{name}.safetensors"), torch.float32, {})
        net.merge_to(1.0)
        changed = 0
        for k, v in model.state_dict().items():
            d = (v.float() - before[k].float()).numpy()
            if np.abs(d).max() > 0:
                refs[f"{name}/{k}"] = d
                changed += 1
        assert changed == len(modules), (name, changed)
    np.savez_compressed(OUT / "lycoris_prefix_refs.npz", **refs)
    print(f"lycoris_ prefix: {len(refs)} parameters changed")


def peft_lycoris_metadata() -> None:
    """``peft_meta_{loha,lokr}_sd1.safetensors``: peft's LoHa / LoKr (``alpha`` 8, ``r`` 4) on the tiny SD 1.x UNet,
    saved by diffusers' ``save_lora_adapter`` (bare module keys, the config as bare ``lora_adapter_metadata``);
    reference: peft's own ``merge()`` of each layer (``peft_meta_lycoris_refs.npz``)."""
    from peft import LoHaConfig, LoKrConfig

    refs = {}
    for name, cfg in (("peft_meta_loha_sd1", LoHaConfig(r=4, alpha=8, target_modules=SD1_MODULES[:5],
                                                         init_weights=False)),
                      ("peft_meta_lokr_sd1", LoKrConfig(r=4, alpha=8, target_modules=SD1_MODULES[:5],
                                                         init_weights=False, decompose_factor=4))):
        unet = make_unet(0)
        before = {k: v.clone() for k, v in unet.state_dict().items()}
        unet.add_adapter(cfg)
        _randomize(unet, 7)
        with tempfile.TemporaryDirectory() as tmp:
            unet.save_lora_adapter(tmp, weight_name="x.safetensors")
            (OUT / f"{name}.safetensors").write_bytes((Path(tmp) / "x.safetensors").read_bytes())
        for m in unet.modules():
            if hasattr(m, "merge") and hasattr(m, "get_delta_weight"):
                m.merge()
        for k, v in unet.state_dict().items():
            k = k.replace("base_layer.", "")
            if k in before and not torch.equal(v, before[k]):
                refs[f"{name}/unet/{k}"] = (v.float() - before[k].float()).numpy()
    np.savez_compressed(OUT / "peft_meta_lycoris_refs.npz", **refs)
    print(f"peft LoHa/LoKr metadata: {len(refs)} parameters changed")


SD3_CONFIG = ROOT / "tests" / "data" / "pipelines" / "tiny-sd3" / "transformer" / "config.json"
#: kohya sd-scripts' SD3 LoRA modules (``networks/lora_sd3.py``: Stability's MMDiT names flattened after ``lora_unet_``)
SD3_KOHYA = ["joint_blocks.0.x_block.attn.qkv", "joint_blocks.0.x_block.attn2.qkv", "joint_blocks.0.context_block.attn.qkv",
             "joint_blocks.0.x_block.adaLN_modulation.1", "joint_blocks.1.context_block.adaLN_modulation.1",
             "joint_blocks.1.x_block.attn.proj", "joint_blocks.0.x_block.mlp.fc1", "final_layer.adaLN_modulation.1",
             "final_layer.linear", "x_embedder.proj", "context_embedder", "t_embedder.mlp.0", "y_embedder.mlp.2"]


def sd3_kohya() -> None:
    """``sd3_kohya.safetensors``: a LoRA on the tiny SD3 transformer of ``tests/data/pipelines/tiny-sd3`` in kohya
    sd-scripts' SD3 names (``lora_unet_joint_blocks_0_x_block_attn_qkv.lora_down.weight``, ``.alpha`` 2, rank 4; the
    fused ``qkv`` and adaLN layers, the last block's pre-only context adaLN, the final layer, the patch embedder's
    conv). diffusers 0.42 does not load such files, so the reference is diffusers' own single-file converter
    (``convert_sd3_transformer_checkpoint_to_diffusers``) applied to each layer's full change
    ``0.8 * alpha / rank * up @ down`` written under its Stability name, every other tensor zero: it splits q, k, v
    and swaps the adaLN halves as it does for weights (``sd3_kohya_refs.npz``: ``<diffusers parameter>``)."""
    import re
    import sys

    from diffusers import SD3Transformer2DModel
    from diffusers.loaders.single_file_utils import convert_sd3_transformer_checkpoint_to_diffusers

    sys.path.insert(0, str(ROOT / "tests" / "checkpoint"))
    from flow_file_helpers import sd3_transformer  # diffusers -> Stability names (checked by the converter below)

    cfg = {k: v for k, v in json.loads(SD3_CONFIG.read_text()).items() if not k.startswith("_")}
    torch.manual_seed(0)
    model = SD3Transformer2DModel(**cfg).eval()
    params = {k: v.numpy() for k, v in model.state_dict().items() if k != "pos_embed.pos_embed"}
    stability = sd3_transformer(params, tuple(model.state_dict()["pos_embed.pos_embed"].shape))
    g = torch.Generator().manual_seed(11)
    lora, full = {}, {k: torch.zeros(v.shape) for k, v in stability.items()}
    for mod in SD3_KOHYA:
        w = stability[mod + ".weight"]
        conv = w.ndim == 4
        down = torch.randn(4, *w.shape[1:], generator=g) * 0.3 if conv else torch.randn(4, w.shape[1], generator=g) * 0.3
        up = torch.randn(w.shape[0], 4, *((1, 1) if conv else ()), generator=g) * 0.3
        key = "lora_unet_" + mod.replace(".", "_")
        lora.update({f"{key}.lora_down.weight": down.half(), f"{key}.lora_up.weight": up.half(),
                     f"{key}.alpha": torch.tensor(2.0)})
        delta = (up.half().float().reshape(w.shape[0], 4) @ down.half().float().reshape(4, -1)).reshape(w.shape)
        full[mod + ".weight"] = SCALE * 2.0 / 4 * delta
    save_file(lora, str(OUT / "sd3_kohya.safetensors"))
    conv = convert_sd3_transformer_checkpoint_to_diffusers(dict(full))
    refs = {k: v.numpy() for k, v in conv.items() if v.abs().max() > 0}
    assert all(re.search(r"\.weight$", k) for k in refs), sorted(refs)
    assert set(refs) <= set(model.state_dict()), sorted(set(refs) - set(model.state_dict()))
    np.savez_compressed(OUT / "sd3_kohya_refs.npz", **refs)
    print(f"SD3 kohya: {len(lora) // 3} layers, {len(refs)} parameters changed")


#: the modules of the full-diff / norm files: linear, 1x1 and 3x3 convs with and without a bias, and the GroupNorm and
#: LayerNorm norms LyCORIS's ``train_norm`` trains (``w_norm`` / ``b_norm``)
FULL_MODULES = ["down_blocks.0.attentions.0.proj_in", "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q",
                "down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_out.0", "up_blocks.0.resnets.0.conv1",
                "up_blocks.0.resnets.0.time_emb_proj", "down_blocks.0.attentions.0.norm",
                "down_blocks.0.attentions.0.transformer_blocks.0.norm1", "up_blocks.0.resnets.0.norm2"]


def lycoris_full_norm() -> None:
    """``lycoris_full_sd1.safetensors`` (LyCORIS's ``algo="full"`` with ``train_norm=True`` through
    ``create_lycoris``, kohya names as sd-scripts' ``lycoris.kohya`` network writes them: ``lora_unet_<module>.diff``,
    ``.diff_b``, ``.w_norm``, ``.b_norm``) and ``lycoris_full_prefix_sd1.safetensors`` (the same layers under LyCORIS's
    own ``lycoris_`` prefix, as SimpleTuner saves), and ``lycoris_full_flux.safetensors`` (full diffs on the tiny Flux.1
dev transformer's ``FLUX_MODULES``, ``lycoris_`` names: SimpleTuner's Flux LyCORIS). The trained change is random: the full modules' weights and biases
    moved after ``apply_to`` (LyCORIS saves the new weight minus the old), the norms' deltas set. Reference: the file
    loaded back by ``create_lycoris_from_weights`` into a fresh UNet and merged by LyCORIS's ``merge_to(0.7)``
    (``lycoris_full_refs.npz``: ``<file>/unet/<parameter>`` = merged minus before)."""
    from lycoris import LycorisNetwork, create_lycoris, create_lycoris_from_weights

    refs = {}
    for name, prefix, build, modules in (("lycoris_full_sd1", "lora_unet", make_unet, FULL_MODULES),
                                         ("lycoris_full_prefix_sd1", "lycoris", make_unet, FULL_MODULES),
                                         ("lycoris_full_flux", "lycoris", _flux, FLUX_MODULES)):
        LycorisNetwork.LORA_PREFIX = prefix
        model = build(0) if build is make_unet else build()
        with tempfile.TemporaryDirectory() as tmp:
            preset = Path(tmp) / "preset.toml"
            preset.write_text("target_module = []\ntarget_name = [" + ", ".join(f'"{m}"' for m in modules) + "]\n")
            net = create_lycoris(model, 1.0, linear_dim=4, linear_alpha=1.0, algo="full", train_norm=True,
                                 preset=str(preset))
        net.apply_to()
        g = torch.Generator().manual_seed(13)
        with torch.no_grad():
            for p in net.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.2)
        path = OUT / f"{name}.safetensors"
        net.save_weights(str(path), torch.float32, {})
        fresh = build(0) if build is make_unet else build()
        before = {k: v.clone() for k, v in fresh.state_dict().items()}
        loaded, _ = create_lycoris_from_weights(0.7, str(path), fresh)
        assert len(loaded.loras) == len(modules), (name, len(loaded.loras))
        loaded.merge_to(0.7)
        for k, v in fresh.state_dict().items():
            d = (v.float() - before[k].float()).numpy()
            if np.abs(d).max() > 0:
                refs[f"{name}/{'unet/' if build is make_unet else ''}{k}"] = d
    LycorisNetwork.LORA_PREFIX = "lycoris"
    np.savez_compressed(OUT / "lycoris_full_refs.npz", **refs)
    print(f"LyCORIS full / norm: {len(refs)} parameters changed")


#: Black Forest Labs' fused modules of the BFL-named full-diff file: q, k, v in one ``qkv``, the final adaLN (its halves
#: swapped against diffusers'), and unfused ones (not ``linear1``: diffusers' converter splits it at the full model's
#: 3072 / 12288 rows, whatever the file's width)
BFL_FULL = ["double_blocks.0.img_attn.qkv", "double_blocks.0.txt_attn.qkv", "double_blocks.0.txt_attn.proj",
            "double_blocks.0.img_mod.lin", "single_blocks.1.linear2", "final_layer.adaLN_modulation.1"]


def lycoris_full_bfl() -> None:
    """``lycoris_full_bfl_flux.safetensors``: LyCORIS full diffs as sd-scripts' ``lycoris.kohya`` network saves them on
    a Flux model (sd-scripts' Flux is Black Forest Labs' layout: ``lora_unet_double_blocks_0_img_attn_qkv.diff`` and
    ``.diff_b``), on the tiny Flux.1 dev transformer's ``BFL_FULL`` modules. diffusers 0.42 loads no such file, so the
    reference is its own single-file converter (``convert_flux_transformer_checkpoint_to_diffusers``) applied to the
    whole change ``0.7 * diff`` written under BFL's names (every other tensor zero): it splits ``qkv`` and swaps the final adaLN's halves as it does for weights and biases (``lycoris_full_refs.npz``:
    ``lycoris_full_bfl_flux/<diffusers parameter>``)."""
    import sys

    from diffusers.loaders.single_file_utils import convert_flux_transformer_checkpoint_to_diffusers

    sys.path.insert(0, str(ROOT / "tests" / "checkpoint"))
    from flow_file_helpers import bfl_transformer  # diffusers -> BFL names (checked by the converter below)

    model = _flux()
    bfl = bfl_transformer({k: v.numpy() for k, v in model.state_dict().items()})
    g = torch.Generator().manual_seed(17)
    lyco, full = {}, {k: torch.zeros(v.shape) for k, v in bfl.items()}
    for mod in BFL_FULL:
        key = "lora_unet_" + mod.replace(".", "_")
        for end, tensor in (("diff", ".weight"), ("diff_b", ".bias")):
            d = torch.randn(bfl[mod + tensor].shape, generator=g) * 0.2
            lyco[f"{key}.{end}"] = d
            full[mod + tensor] = 0.7 * d
    save_file(lyco, str(OUT / "lycoris_full_bfl_flux.safetensors"))
    for k in [k for k in full if ".linear1." in k]:  # zeros, at the rows the converter splits (3 x 3072 + 12288)
        full[k] = torch.zeros((21504, 1) if k.endswith(".weight") else (21504,))
    conv = convert_flux_transformer_checkpoint_to_diffusers(dict(full))
    refs = dict(np.load(OUT / "lycoris_full_refs.npz"))
    refs = {k: v for k, v in refs.items() if not k.startswith("lycoris_full_bfl_flux/")}
    new = {f"lycoris_full_bfl_flux/{k}": v.numpy() for k, v in conv.items() if v.abs().max() > 0}
    assert set(k.split("/", 1)[1] for k in new) <= set(model.state_dict()), sorted(new)
    np.savez_compressed(OUT / "lycoris_full_refs.npz", **refs, **new)
    print(f"LyCORIS full, BFL names: {len(lyco)} tensors, {len(new)} diffusers parameters changed")


if __name__ == "__main__":
    import sys

    OUT.mkdir(parents=True, exist_ok=True)
    steps = {f.__name__: f for f in (peft_metadata, lycoris_prefix, peft_lycoris_metadata, sd3_kohya, lycoris_full_norm,
                                     lycoris_full_bfl)}
    for step in sys.argv[1:] or steps:  # one step by name, or all
        steps[step]()
