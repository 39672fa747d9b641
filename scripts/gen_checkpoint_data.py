"""Build the test data of issue 14 (single-file checkpoints, LoRA, embeddings) with torch and diffusers.

Writes ``tests/data/ckpt/``:

- ``sd1/{text_encoder,unet,vae_encoder,vae_decoder}/model.onnx``: a tiny SD 1.x
  pipeline (random weights "A", real diffusers/transformers architectures),
  exported with torch's TorchScript exporter (``dynamo=False``, opset 17) in
  Optimum's layout and input/output names. The text encoder is exported with
  transformers 5 (no ``text_model.`` prefix) and, by the ``te-t4`` step, with
  transformers 4 (``text_encoder_t4/``, the layout of every published export).
- ``sd1/ldm.safetensors``: weights "B" (another seed) in the original LDM/CompVis
  single-file layout, fp16. The script checks that diffusers' own single-file
  loader (``from_single_file`` / ``single_file_utils.convert_*``) reads it back
  equal to B, then saves reference outputs of each part with B loaded that way.
- ``sd2_te/``, ``sdxl_te/``, ``sdxl_unet/``: an OpenCLIP text encoder (SD 2.x,
  fused ``in_proj``, one layer more in the checkpoint than in the export), the
  two SDXL text encoders and a tiny SDXL UNet, same scheme.
- ``sd1/lora_kohya.safetensors`` (kohya keys on UNet and text encoder, with a
  1x1 conv ``proj_in``), ``sd1/lora_peft.safetensors``, and references made by
  diffusers' ``load_lora_weights`` + ``fuse_lora``.
- ``sd1/emb.safetensors`` (A1111 ``emb_params``), ``sdxl_te/emb.safetensors``
  (``clip_l``/``clip_g``), and text-encoder references with the vectors added as
  new token rows (what diffusers' ``load_textual_inversion`` does).

Run (torch venv; its torchvision does not match its torch, ``tvblock`` hides it):

    PYTHONPATH=scripts/_tvblock /work/venv-torch/bin/python scripts/gen_checkpoint_data.py build
    pip install --no-deps --target /tmp/t4 "transformers==4.57.6" "tokenizers>=0.22,<0.23" "huggingface_hub<1"
    PYTHONPATH=/tmp/t4:scripts/_tvblock /work/venv-torch/bin/python scripts/gen_checkpoint_data.py te-t4
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import tvblock  # noqa: F401  (must come before transformers is used)
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "ckpt"
VOCAB = 1000
LPB = 1  # layers per block of the tiny UNets


# -- tiny models -------------------------------------------------------------
def te_config(kind: str):
    from transformers import CLIPTextConfig

    act = "quick_gelu" if kind == "l" else "gelu"
    hidden = 32 if kind == "l" else 48
    return CLIPTextConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                          num_attention_heads=4, max_position_embeddings=77, projection_dim=hidden, hidden_act=act,
                          bos_token_id=0, eos_token_id=2, pad_token_id=1)


def make_te(kind: str, seed: int, projection: bool = False):
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    torch.manual_seed(seed)
    cls = CLIPTextModelWithProjection if projection else CLIPTextModel
    m = cls(te_config(kind)).eval()
    _randomize(m, seed)  # CLIP initialises biases to 0 and norms to 1: the exporter would merge equal tensors
    return m


def unet_kwargs(sdxl: bool) -> dict:
    kw = dict(sample_size=8, in_channels=4, out_channels=4, layers_per_block=LPB, block_out_channels=(16, 32),
              down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D",
                                                                                          "CrossAttnUpBlock2D"),
              cross_attention_dim=32, attention_head_dim=8, norm_num_groups=8)
    if sdxl:
        kw.update(cross_attention_dim=80, use_linear_projection=True, addition_embed_type="text_time",
                  addition_time_embed_dim=8, projection_class_embeddings_input_dim=48 + 6 * 8,
                  transformer_layers_per_block=(1, 1), attention_head_dim=(2, 4),
                  down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
                  up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D"))
    return kw


def make_unet(seed: int, sdxl: bool = False):
    from diffusers import UNet2DConditionModel

    torch.manual_seed(seed)
    m = UNet2DConditionModel(**unet_kwargs(sdxl)).eval()
    _randomize(m, seed)
    return m


def make_vae(seed: int):
    from diffusers import AutoencoderKL

    torch.manual_seed(seed)
    m = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(16, 32),
                      down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                      layers_per_block=1, norm_num_groups=8, sample_size=16).eval()
    _randomize(m, seed)
    return m


def _randomize(m, seed: int) -> None:
    """diffusers zero-initialises some convs (conv_out, proj_out): give every tensor random values."""
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for name, p in m.named_parameters():
            scale = 0.2 if p.ndim > 1 else 0.05
            p.copy_(torch.randn(p.shape, generator=g) * scale + (1.0 if "norm" in name and name.endswith("weight")
                                                                   else 0.0))


# -- diffusers -> LDM (the inverse of what sdrt.checkpoint does) --------------
_RES = [("norm1", "in_layers.0"), ("conv1", "in_layers.2"), ("time_emb_proj", "emb_layers.1"),
        ("norm2", "out_layers.0"), ("conv2", "out_layers.3"), ("conv_shortcut", "skip_connection")]


def unet_to_ldm(sd: dict, has_attn_up: list[bool], lpb: int = LPB) -> dict:
    out = {}
    n = lpb + 1
    for k, v in sd.items():
        m = None
        new = None
        for a, b in [("time_embedding.linear_1", "time_embed.0"), ("time_embedding.linear_2", "time_embed.2"),
                     ("add_embedding.linear_1", "label_emb.0.0"), ("add_embedding.linear_2", "label_emb.0.2"),
                     ("conv_in", "input_blocks.0.0"), ("conv_norm_out", "out.0"), ("conv_out", "out.2")]:
            if k.startswith(a + "."):
                new = b + k[len(a):]
        if new is None and (m := re.match(r"down_blocks\.(\d+)\.(resnets|attentions)\.(\d+)\.(.*)", k)):
            b, kind, lyr, rest = int(m[1]), m[2], int(m[3]), m[4]
            new = f"input_blocks.{1 + b * n + lyr}." + (f"0.{_res(rest)}" if kind == "resnets" else f"1.{rest}")
        elif new is None and (m := re.match(r"down_blocks\.(\d+)\.downsamplers\.0\.conv\.(.*)", k)):
            new = f"input_blocks.{1 + int(m[1]) * n + lpb}.0.op.{m[2]}"
        elif new is None and (m := re.match(r"mid_block\.(resnets|attentions)\.(\d+)\.(.*)", k)):
            idx = {"resnets0": 0, "attentions0": 1, "resnets1": 2}[m[1] + m[2]]
            new = f"middle_block.{idx}.{_res(m[3]) if m[1] == 'resnets' else m[3]}"
        elif new is None and (m := re.match(r"up_blocks\.(\d+)\.(resnets|attentions)\.(\d+)\.(.*)", k)):
            b, kind, lyr, rest = int(m[1]), m[2], int(m[3]), m[4]
            new = f"output_blocks.{b * n + lyr}." + (f"0.{_res(rest)}" if kind == "resnets" else f"1.{rest}")
        elif new is None and (m := re.match(r"up_blocks\.(\d+)\.upsamplers\.0\.conv\.(.*)", k)):
            b = int(m[1])
            new = f"output_blocks.{b * n + lpb}.{2 if has_attn_up[b] else 1}.conv.{m[2]}"
        if new is None:
            raise KeyError(k)
        out["model.diffusion_model." + new] = v
    return out


def _res(rest: str) -> str:
    for a, b in _RES:
        if rest.startswith(a + "."):
            return b + rest[len(a):]
    return rest


def vae_to_ldm(sd: dict, nup: int) -> dict:
    out = {}
    for k, v in sd.items():
        new = k
        new = re.sub(r"^encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.", r"encoder.down.\1.block.\2.", new)
        new = re.sub(r"^encoder\.down_blocks\.(\d+)\.downsamplers\.0\.", r"encoder.down.\1.downsample.", new)
        new = re.sub(r"^decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.",
                     lambda m: f"decoder.up.{nup - 1 - int(m[1])}.block.{m[2]}.", new)
        new = re.sub(r"^decoder\.up_blocks\.(\d+)\.upsamplers\.0\.",
                     lambda m: f"decoder.up.{nup - 1 - int(m[1])}.upsample.", new)
        new = new.replace("mid_block.resnets.0.", "mid.block_1.").replace("mid_block.resnets.1.", "mid.block_2.")
        new = new.replace(".conv_shortcut.", ".nin_shortcut.").replace(".conv_norm_out.", ".norm_out.")
        if "mid_block.attentions.0." in new:
            new = new.replace("mid_block.attentions.0.", "mid.attn_1.")
            for a, b in [("group_norm", "norm"), ("to_q", "q"), ("to_k", "k"), ("to_v", "v"),
                         ("to_out.0", "proj_out")]:
                new = new.replace(f".{a}.", f".{b}.")
            if v.ndim == 2:
                v = v[:, :, None, None]
        out["first_stage_model." + new] = v
    return out


def openclip_from_hf(sd: dict, extra_layer: bool, seed: int) -> dict:
    """A CLIPTextModel(WithProjection) state dict in OpenCLIP's layout (``in_proj`` fused, [in, out] projection)."""
    sd = {k.removeprefix("text_model."): v for k, v in sd.items()}
    out = {"token_embedding.weight": sd["embeddings.token_embedding.weight"],
           "positional_embedding": sd["embeddings.position_embedding.weight"],
           "ln_final.weight": sd["final_layer_norm.weight"], "ln_final.bias": sd["final_layer_norm.bias"]}
    if "text_projection.weight" in sd:
        out["text_projection"] = sd["text_projection.weight"].T.contiguous()
    layers = sorted({int(m[1]) for k in sd if (m := re.match(r"encoder\.layers\.(\d+)\.", k))})
    for i in layers:
        p, q = f"encoder.layers.{i}.", f"transformer.resblocks.{i}."
        for a, b in [("layer_norm1", "ln_1"), ("layer_norm2", "ln_2"), ("self_attn.out_proj", "attn.out_proj"),
                     ("mlp.fc1", "mlp.c_fc"), ("mlp.fc2", "mlp.c_proj")]:
            for t in ("weight", "bias"):
                out[f"{q}{b}.{t}"] = sd[f"{p}{a}.{t}"]
        for t in ("weight", "bias"):
            out[f"{q}attn.in_proj_{t}"] = torch.cat([sd[f"{p}self_attn.{x}_proj.{t}"] for x in "qkv"])
    if extra_layer:  # SD 2.x checkpoints hold all 24 layers; the export uses 23 (penultimate layer)
        g = torch.Generator().manual_seed(seed)
        last = len(layers)
        for k in [k for k in out if k.startswith(f"transformer.resblocks.{layers[-1]}.")]:
            out[k.replace(f"resblocks.{layers[-1]}.", f"resblocks.{last}.")] = torch.randn(out[k].shape, generator=g)
        out["logit_scale"] = torch.tensor(4.6)
    return out


# -- ONNX export (Optimum's names) -------------------------------------------
def export(model, args: tuple, path: Path, inputs: list[str], outputs: list[str], dynamic: dict | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(model, args, str(path), input_names=inputs, output_names=outputs, opset_version=17,
                          do_constant_folding=True, dynamo=False, dynamic_axes=dynamic)


class TEWrap(torch.nn.Module):
    """Calls a text encoder and returns Optimum's outputs (for the torch references)."""

    def __init__(self, te, projection: bool = False) -> None:
        super().__init__()
        self.te, self.projection = te, projection

    def forward(self, input_ids):
        o = self.te(input_ids=input_ids, output_hidden_states=True, return_dict=True)
        first = o.text_embeds if self.projection else o.last_hidden_state
        second = o.last_hidden_state if self.projection else o.pooler_output
        return (first, second, *o.hidden_states)


def for_export(model, forward):
    """A copy of ``model`` whose class has ``forward`` replaced, so the exported names and node scopes are the
    model's own (``down_blocks.0...``, ``/text_model/encoder/...``), as in an Optimum export (a wrapper module
    would prefix them all)."""
    import copy

    m = copy.deepcopy(model)
    m.__class__ = type("Export" + type(model).__name__, (type(model),), {"forward": forward})
    return m


def te_export(te, projection: bool = False):
    """The text encoder itself, asked for every hidden state: outputs come out in Optimum's order
    (``last_hidden_state``, ``pooler_output`` or ``text_embeds``, ``last_hidden_state``, then ``hidden_states.*``)."""
    import copy

    m = copy.deepcopy(te)
    m.config.output_hidden_states = True
    return m


def te_names(te, projection: bool) -> list[str]:
    n = te.config.num_hidden_layers + 1
    first = ["text_embeds", "last_hidden_state"] if projection else ["last_hidden_state", "pooler_output"]
    return first + [f"hidden_states.{i}" for i in range(n)]


def _unet_forward(sdxl: bool):
    def forward(self, sample, timestep, encoder_hidden_states, text_embeds=None, time_ids=None):
        extra = {"added_cond_kwargs": {"text_embeds": text_embeds, "time_ids": time_ids}} if sdxl else {}
        return type(self).__mro__[1].forward(self, sample, timestep, encoder_hidden_states, return_dict=False,
                                             **extra)[0]
    return forward


def unet_export(unet, sdxl: bool = False):
    return for_export(unet, _unet_forward(sdxl))


def _enc_forward(self, sample):
    return self.encode(sample).latent_dist.parameters


def _dec_forward(self, latent_sample):
    return self.decode(latent_sample, return_dict=False)[0]


class UNetWrap(torch.nn.Module):
    def __init__(self, unet, sdxl: bool = False) -> None:
        super().__init__()
        self.unet, self.sdxl = unet, sdxl

    def forward(self, sample, timestep, encoder_hidden_states, text_embeds=None, time_ids=None):
        extra = {"added_cond_kwargs": {"text_embeds": text_embeds, "time_ids": time_ids}} if self.sdxl else {}
        return self.unet(sample, timestep, encoder_hidden_states, return_dict=False, **extra)[0]


# -- fixed inputs --------------------------------------------------------------
def inputs() -> dict[str, np.ndarray]:
    g = np.random.default_rng(1234)
    ids = np.full((2, 77), 1, np.int64)
    ids[:, 0] = 0
    ids[0, 1:6] = [5, 17, 300, 42, 2]
    ids[1, 1:4] = [998, 999, 2]  # 998/999 are replaced by embedding rows in the embedding test
    ids[0, 6:] = 2
    return {
        "input_ids": ids,
        "sample": g.standard_normal((1, 4, 8, 8)).astype(np.float32),
        "timestep": np.array([500], np.int64),
        "ehs": g.standard_normal((1, 77, 32)).astype(np.float32),
        "ehs_xl": g.standard_normal((1, 77, 80)).astype(np.float32),
        "text_embeds": g.standard_normal((1, 48)).astype(np.float32),
        "time_ids": np.array([[16, 16, 0, 0, 16, 16]], np.float32),
        "image": (g.random((1, 3, 16, 16)) * 2 - 1).astype(np.float32),
        "latent": g.standard_normal((1, 4, 4, 4)).astype(np.float32),
    }


def fused_deltas(pipe, parts: dict, lora_path: Path, scale: float) -> dict[str, np.ndarray]:
    """diffusers' ``load_lora_weights`` + ``fuse_lora(scale)`` of ``lora_path`` on ``pipe``: the change of every
    parameter of ``parts`` ({component name: module}) it moved (fused minus before, float32, torch layout) under
    ``<component>/<parameter>``. The LoRA is unloaded after, the fused weights stay."""
    before = {p: {k: v.clone() for k, v in m.state_dict().items()} for p, m in parts.items()}
    pipe.load_lora_weights(str(lora_path), adapter_name="x")
    pipe.fuse_lora(lora_scale=scale, adapter_names=["x"], components=list(parts))
    pipe.unload_lora_weights()
    refs = {}
    for p, m in parts.items():
        for k, v in m.state_dict().items():
            d = (v.float() - before[p][k].float()).numpy()
            if np.abs(d).max() > 0:
                refs[f"{p}/{k}"] = d.astype(np.float32)
    return refs


def run_parts(te, unet, vae, x: dict) -> dict[str, np.ndarray]:
    with torch.no_grad():
        out = {}
        if te is not None:
            out["te"] = TEWrap(te)(torch.from_numpy(x["input_ids"]))[0].numpy()
        if unet is not None:
            out["unet"] = unet(torch.from_numpy(x["sample"]), torch.from_numpy(x["timestep"]),
                               torch.from_numpy(x["ehs"])).sample.numpy()
        if vae is not None:
            out["vae_dec"] = vae.decode(torch.from_numpy(x["latent"])).sample.numpy()
            out["vae_enc"] = vae.encode(torch.from_numpy(x["image"])).latent_dist.parameters.numpy()
    return out


def assert_same(a: dict, b: dict, what: str) -> None:
    assert set(a) == set(b), (what, sorted(set(a) ^ set(b))[:10])
    bad = [k for k in a if not torch.equal(a[k].float(), b[k].float())]
    assert not bad, (what, bad[:10])
    print(f"{what}: {len(a)} tensors read back equal")


def half(sd: dict) -> dict:
    return {k: v.detach().to(torch.float16).contiguous() for k, v in sd.items()}


# -- steps ---------------------------------------------------------------------
def build_sd1(x: dict) -> None:
    from diffusers import AutoencoderKL, UNet2DConditionModel

    d = OUT / "sd1"
    te_a, unet_a, vae_a = make_te("l", 1), make_unet(2), make_vae(3)
    torch.save(te_a.state_dict(), Path(tempfile.gettempdir()) / "sdrt-ckpt-te-a.pt")
    export(te_export(te_a), (torch.from_numpy(x["input_ids"][:1]),), d / "text_encoder" / "model.onnx", ["input_ids"],
           te_names(te_a, False))
    export(unet_export(unet_a), (torch.from_numpy(x["sample"]), torch.from_numpy(x["timestep"]),
                              torch.from_numpy(x["ehs"])), d / "unet" / "model.onnx",
           ["sample", "timestep", "encoder_hidden_states"], ["out_sample"])
    export(for_export(vae_a, _enc_forward), (torch.from_numpy(x["image"]),), d / "vae_encoder" / "model.onnx", ["sample"],
           ["latent_parameters"], {"sample": {2: "height", 3: "width"}, "latent_parameters": {2: "h", 3: "w"}})
    export(for_export(vae_a, _dec_forward), (torch.from_numpy(x["latent"]),), d / "vae_decoder" / "model.onnx", ["latent_sample"],
           ["sample"], {"latent_sample": {2: "h", 3: "w"}, "sample": {2: "height", 3: "width"}})

    # weights B, written as an LDM single file (fp16)
    te_b, unet_b, vae_b = make_te("l", 11), make_unet(12), make_vae(13)
    has_attn_up = ["CrossAttn" in t for t in unet_b.config.up_block_types]
    ldm = {}
    ldm.update(unet_to_ldm(unet_b.state_dict(), has_attn_up))
    ldm.update(vae_to_ldm(vae_b.state_dict(), len(vae_b.config.up_block_types)))
    te_sd = {("text_model." + k if not k.startswith("text_model.") else k): v for k, v in te_b.state_dict().items()}
    ldm.update({"cond_stage_model.transformer." + k: v for k, v in te_sd.items()})
    ldm = half(ldm)
    save_file(ldm, str(d / "ldm.safetensors"), metadata={"format": "pt"})

    # diffusers' single-file loader reads it back
    with tempfile.TemporaryDirectory() as tmp:
        unet_b.save_pretrained(f"{tmp}/unet")
        vae_b.save_pretrained(f"{tmp}/vae")
        unet_l = UNet2DConditionModel.from_single_file(str(d / "ldm.safetensors"), config=tmp, subfolder="unet",
                                                       local_files_only=True).float().eval()
        vae_l = AutoencoderKL.from_single_file(str(d / "ldm.safetensors"), config=tmp, subfolder="vae",
                                               local_files_only=True).float().eval()
    from diffusers.loaders.single_file_utils import convert_ldm_clip_checkpoint

    te_l = make_te("l", 99)
    ck = {k: v.float() for k, v in load_file(str(d / "ldm.safetensors")).items()}
    te_conv = convert_ldm_clip_checkpoint(ck)
    te_conv = {k: v for k, v in te_conv.items() if "position_ids" not in k}
    missing = te_l.load_state_dict({k.removeprefix("text_model.") if not any(
        s.startswith("text_model.") for s in te_l.state_dict()) else k: v for k, v in te_conv.items()}, strict=True)
    print("te load:", missing)
    assert_same(unet_l.state_dict(), half(unet_b.state_dict()), "unet single-file")
    assert_same(vae_l.state_dict(), half(vae_b.state_dict()), "vae single-file")
    assert_same(te_l.state_dict(), half(te_b.state_dict()), "text encoder single-file")
    te_l.eval()
    refs = run_parts(te_l, unet_l, vae_l, x)
    refs_a = run_parts(te_a, unet_a, vae_a, x)
    np.savez_compressed(d / "refs_ldm.npz", **refs)
    np.savez_compressed(d / "refs_base.npz", **refs_a)

    build_sd1_lora(d, te_l, unet_l, x)
    build_sd1_embedding(d, te_l, x)


def build_sd1_lora(d: Path, te, unet, x: dict) -> None:
    """A kohya LoRA on UNet attention/ff/proj_in (1x1 conv) and the text encoder's attention/mlp."""
    import copy

    from diffusers import StableDiffusionPipeline

    g = torch.Generator().manual_seed(77)
    lora = {}
    r = 4

    def add(kohya: str, out_f: int, in_f: int, conv: bool = False, alpha: float = 2.0) -> None:
        down = torch.randn((r, in_f, 1, 1) if conv else (r, in_f), generator=g) * 0.3
        up = torch.randn((out_f, r, 1, 1) if conv else (out_f, r), generator=g) * 0.3
        lora[f"{kohya}.lora_down.weight"] = down
        lora[f"{kohya}.lora_up.weight"] = up
        lora[f"{kohya}.alpha"] = torch.tensor(alpha)

    mods = dict(unet.named_modules())
    for name, mod in mods.items():
        if re.search(r"attentions\.\d+\.(proj_in|transformer_blocks\.\d+\.(attn\d\.to_(q|k|v|out\.0)|ff\.net\.2))$",
                     name):
            w = mod.weight
            add("lora_unet_" + name.replace(".", "_"), w.shape[0], w.shape[1], conv=w.ndim == 4)
    for name, mod in te.named_modules():
        if re.search(r"layers\.\d+\.(self_attn\.(q|k|v|out)_proj|mlp\.fc1)$", name):
            n = name if name.startswith("text_model.") else "text_model." + name
            add("lora_te_" + n.replace(".", "_"), mod.weight.shape[0], mod.weight.shape[1])
    lora = {k: v.contiguous() for k, v in lora.items()}
    save_file(lora, str(d / "lora_kohya.safetensors"))

    # diffusers: load_lora_weights (kohya conversion + peft) then fuse at scale 0.8
    from transformers import CLIPTokenizer  # noqa: F401  (pipeline wants a tokenizer object; not used)

    unet2, te2 = copy.deepcopy(unet), copy.deepcopy(te)
    from diffusers import EulerDiscreteScheduler

    pipe = StableDiffusionPipeline(vae=None, text_encoder=te2, tokenizer=None, unet=unet2,
                                   scheduler=EulerDiscreteScheduler(), safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)
    pipe.load_lora_weights(str(d / "lora_kohya.safetensors"))
    pipe.fuse_lora(lora_scale=0.8)
    refs = run_parts(pipe.text_encoder, pipe.unet, None, x)
    np.savez_compressed(d / "refs_lora.npz", **refs)
    nd = sum(1 for k in lora if k.endswith("lora_down.weight"))
    print(f"kohya LoRA: {nd} layers; refs with scale 0.8")

    # the same LoRA in PEFT/diffusers keys (lora_A/lora_B, no alpha tensors: alpha = rank)
    peft = {}
    for k, v in lora.items():
        if not k.endswith(".lora_down.weight"):
            continue
        mod = k[: -len(".lora_down.weight")]
        target = "unet." if mod.startswith("lora_unet_") else "text_encoder."
        dotted = _dotted(mod, unet if target == "unet." else te)
        a = lora[f"{mod}.alpha"].item()
        peft[f"{target}{dotted}.lora_A.weight"] = v
        peft[f"{target}{dotted}.lora_B.weight"] = (lora[f"{mod}.lora_up.weight"] * (a / r)).contiguous()
    save_file(peft, str(d / "lora_peft.safetensors"))


def _dotted(kohya_mod: str, model) -> str:
    flat = kohya_mod.split("_", 2)[2]
    for name, _ in model.named_modules():
        n = name if (model.__class__.__name__.startswith("UNet") or name.startswith("text_model.")) else name
        if n.replace(".", "_") == flat or ("text_model." + n).replace(".", "_") == flat:
            return name if model.__class__.__name__.startswith("UNet") else "text_model." + name.removeprefix(
                "text_model.")
    raise KeyError(kohya_mod)


def build_sd1_embedding(d: Path, te, x: dict) -> None:
    """An A1111 embedding (``emb_params`` [2, 32]) and the text encoder with its rows added (ids 998, 999 -> V, V+1)."""
    import copy

    g = torch.Generator().manual_seed(5)
    emb = (torch.randn((2, 32), generator=g) * 0.5).contiguous()
    save_file({"emb_params": emb}, str(d / "emb.safetensors"))
    te2 = copy.deepcopy(te)
    te2.resize_token_embeddings(VOCAB + 2)
    with torch.no_grad():
        te2.get_input_embeddings().weight[VOCAB:] = emb
    ids = x["input_ids"].copy()
    ids[1, 1:3] = [VOCAB, VOCAB + 1]
    with torch.no_grad():
        out = TEWrap(te2)(torch.from_numpy(ids))[0].numpy()
    np.savez_compressed(d / "refs_emb.npz", te=out, input_ids=ids)


def build_sd2_te(x: dict) -> None:
    from diffusers.loaders.single_file_utils import convert_open_clip_checkpoint

    d = OUT / "sd2_te"
    te_a = make_te("h", 21)
    export(te_export(te_a), (torch.from_numpy(x["input_ids"][:1]),), d / "text_encoder" / "model.onnx", ["input_ids"],
           te_names(te_a, False))
    te_b = make_te("h", 22)
    sd = {("text_model." + k if not k.startswith("text_model.") else k): v for k, v in te_b.state_dict().items()}
    ck = {"cond_stage_model.model." + k: v for k, v in openclip_from_hf(sd, True, 23).items()}
    ck = half(ck)
    save_file(ck, str(d / "ldm.safetensors"))
    te_l = make_te("h", 98)
    conv = convert_open_clip_checkpoint(te_l, {k: v.float() for k, v in ck.items()}, prefix="cond_stage_model.model.")
    # diffusers ignores the last of SD 2's 24 layers by a fixed key list (SD_2_TEXT_ENCODER_KEYS_TO_IGNORE);
    # the tiny model's extra layer is number 2
    conv = {k: v for k, v in conv.items() if "position_ids" not in k and ".layers.2." not in k}
    te_l.load_state_dict({k.removeprefix("text_model."): v for k, v in conv.items()}, strict=True)
    assert_same(te_l.state_dict(), half(te_b.state_dict()), "SD2 OpenCLIP text encoder single-file")
    te_l.eval()
    np.savez_compressed(d / "refs_ldm.npz", te=run_parts(te_l, None, None, x)["te"])


def build_sdxl(x: dict) -> None:
    from diffusers import UNet2DConditionModel
    from diffusers.loaders.single_file_utils import convert_ldm_clip_checkpoint, convert_open_clip_checkpoint

    d = OUT / "sdxl"
    te1_a, te2_a, unet_a = make_te("l", 31), make_te("h", 32, projection=True), make_unet(33, sdxl=True)
    ids = torch.from_numpy(x["input_ids"][:1])
    export(te_export(te1_a), (ids,), d / "text_encoder" / "model.onnx", ["input_ids"], te_names(te1_a, False))
    export(te_export(te2_a, True), (ids,), d / "text_encoder_2" / "model.onnx", ["input_ids"], te_names(te2_a, True))
    export(unet_export(unet_a, True), (torch.from_numpy(x["sample"]), torch.from_numpy(x["timestep"]),
                                    torch.from_numpy(x["ehs_xl"]), torch.from_numpy(x["text_embeds"]),
                                    torch.from_numpy(x["time_ids"])), d / "unet" / "model.onnx",
           ["sample", "timestep", "encoder_hidden_states", "text_embeds", "time_ids"], ["out_sample"])
    te1_b, te2_b, unet_b = make_te("l", 41), make_te("h", 42, projection=True), make_unet(43, sdxl=True)
    ck = {}
    ck.update(unet_to_ldm(unet_b.state_dict(), [True, True]))
    sd1 = {("text_model." + k if not k.startswith("text_model.") else k): v for k, v in te1_b.state_dict().items()}
    ck.update({"conditioner.embedders.0.transformer." + k: v for k, v in sd1.items()})
    ck.update({"conditioner.embedders.1.model." + k: v
               for k, v in openclip_from_hf(te2_b.state_dict(), False, 0).items()})
    ck = half(ck)
    save_file(ck, str(d / "ldm.safetensors"))
    with tempfile.TemporaryDirectory() as tmp:
        unet_b.save_pretrained(f"{tmp}/unet")
        unet_l = UNet2DConditionModel.from_single_file(str(d / "ldm.safetensors"), config=tmp, subfolder="unet",
                                                       local_files_only=True).float().eval()
    ckf = {k: v.float() for k, v in ck.items()}
    te1_l = make_te("l", 97)
    c1 = convert_ldm_clip_checkpoint(ckf)
    te1_l.load_state_dict({k.removeprefix("text_model."): v for k, v in c1.items() if "position_ids" not in k})
    te2_l = make_te("h", 96, projection=True)
    c2 = convert_open_clip_checkpoint(te2_l, ckf, prefix="conditioner.embedders.1.model.")
    te2_l.load_state_dict({k: v for k, v in c2.items() if "position_ids" not in k})
    assert_same(unet_l.state_dict(), half(unet_b.state_dict()), "SDXL unet single-file")
    assert_same(te1_l.state_dict(), half(te1_b.state_dict()), "SDXL te1 single-file")
    assert_same(te2_l.state_dict(), half(te2_b.state_dict()), "SDXL te2 single-file")
    te1_l.eval(), te2_l.eval()
    with torch.no_grad():
        refs = {
            "te1": TEWrap(te1_l)(torch.from_numpy(x["input_ids"]))[0].numpy(),
            "te2": TEWrap(te2_l, True)(torch.from_numpy(x["input_ids"]))[0].numpy(),
            "unet": UNetWrap(unet_l, True)(*(torch.from_numpy(x[k]) for k in
                                             ("sample", "timestep", "ehs_xl", "text_embeds", "time_ids"))).numpy(),
        }
    np.savez_compressed(d / "refs_ldm.npz", **refs)
    # an SDXL embedding: clip_l [2, 32] and clip_g [2, 48]
    g = torch.Generator().manual_seed(6)
    emb = {"clip_l": (torch.randn((2, 32), generator=g) * 0.5).contiguous(),
           "clip_g": (torch.randn((2, 48), generator=g) * 0.5).contiguous()}
    save_file(emb, str(d / "emb.safetensors"))
    import copy

    ids = x["input_ids"].copy()
    ids[1, 1:3] = [VOCAB, VOCAB + 1]
    out = {"input_ids": ids}
    for key, te, proj, emb_key in (("te1", te1_l, False, "clip_l"), ("te2", te2_l, True, "clip_g")):
        t = copy.deepcopy(te)
        t.resize_token_embeddings(VOCAB + 2)
        with torch.no_grad():
            t.get_input_embeddings().weight[VOCAB:] = emb[emb_key]
            out[key] = TEWrap(t, proj)(torch.from_numpy(ids))[0].numpy()
    np.savez_compressed(d / "refs_emb.npz", **out)


def checkpoint_pipeline(write: bool = True):
    """``(pipe, pl, comps, te_l, unet_l, case, imgs)``: the ``tiny-sd15`` folder's diffusers pipeline ``pipe``, its
    weights scaled into ``pipe-sd15/custom.safetensors`` (an LDM fp16 file; written when ``write``, else the
    committed one is checked to be the same) and ``pl``, diffusers' pipeline with that file's weights loaded."""
    import copy

    import gen_pipeline_refs as gp
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from diffusers.loaders.single_file_utils import convert_ldm_clip_checkpoint

    d = OUT / "pipe-sd15"
    d.mkdir(parents=True, exist_ok=True)
    pipe = gp.build("sd15")
    gp.scale_weights(pipe.text_encoder, 101)
    gp.scale_weights(pipe.unet, 103)
    gp.scale_weights(pipe.vae, 104)
    has_attn_up = ["CrossAttn" in t for t in pipe.unet.config.up_block_types]
    ck = {}
    ck.update(unet_to_ldm(pipe.unet.state_dict(), has_attn_up))
    ck.update(vae_to_ldm(pipe.vae.state_dict(), len(pipe.vae.config.up_block_types)))
    te_sd = {("text_model." + k if not k.startswith("text_model.") else k): v
             for k, v in pipe.text_encoder.state_dict().items()}
    ck.update({"cond_stage_model.transformer." + k: v for k, v in te_sd.items()})
    ck = half(ck)
    path = d / "custom.safetensors"
    if write:
        save_file(ck, str(path))
    else:
        assert_same(load_file(str(path)), ck, "pipe-sd15/custom.safetensors rebuilt")
    with tempfile.TemporaryDirectory() as tmp:
        pipe.unet.save_pretrained(f"{tmp}/unet")
        pipe.vae.save_pretrained(f"{tmp}/vae")
        unet_l = UNet2DConditionModel.from_single_file(str(path), config=tmp, subfolder="unet",
                                                       local_files_only=True).float().eval()
        vae_l = AutoencoderKL.from_single_file(str(path), config=tmp, subfolder="vae",
                                               local_files_only=True).float().eval()
    te_l = copy.deepcopy(pipe.text_encoder)
    conv = convert_ldm_clip_checkpoint({k: v.float() for k, v in ck.items()})
    te_l.load_state_dict({k.removeprefix("text_model."): v for k, v in conv.items() if "position_ids" not in k})
    assert_same(unet_l.state_dict(), half(pipe.unet.state_dict()), "tiny-sd15 unet single-file")
    assert_same(vae_l.state_dict(), half(pipe.vae.state_dict()), "tiny-sd15 vae single-file")
    assert_same(te_l.state_dict(), half(pipe.text_encoder.state_dict()), "tiny-sd15 text encoder single-file")
    comps = {**pipe.components, "unet": unet_l, "vae": vae_l, "text_encoder": te_l.eval()}
    pl = type(pipe)(**comps)
    pl.set_progress_bar_config(disable=True)
    imgs = {"init_image": gp.init_image(), "mask": gp.mask_image()}
    case = dict(prompt=gp.PROMPT, negative_prompt=gp.NEGATIVE, steps=8, cfg=7.0, seed=1234, width=gp.SIZE,
                height=gp.SIZE, batch=1, clip_skip=None, mode="txt2img", sampler="Euler")
    return pipe, pl, comps, te_l, unet_l, case, imgs


def build_pipeline_refs() -> None:
    """An LDM checkpoint, a kohya LoRA and an embedding for the pipe helper's ``tiny-sd15`` folder, and the
    images diffusers' own pipeline makes with each (Euler, 8 steps, 64x64), for sdrt's pipeline to match."""
    import copy

    import gen_pipeline_refs as gp

    d = OUT / "pipe-sd15"
    pipe, pl, comps, te_l, unet_l, case, imgs = checkpoint_pipeline()
    out = {"ckpt": gp.run_case(pl, case, imgs)}

    # a kohya LoRA on attention, ff and the text encoder, at scale 0.7 (prompt tag <lora:tinylora:0.7>)
    g = torch.Generator().manual_seed(202)
    lora = {}
    for prefix, model in (("lora_unet_", unet_l), ("lora_te_", te_l)):
        for name, mod in model.named_modules():
            if re.search(r"(attn\d\.to_(q|k|v|out\.0)|ff\.net\.2|proj_in|self_attn\.(q|k|v|out)_proj|mlp\.fc1)$",
                         name):
                n = name if prefix == "lora_unet_" else "text_model." + name.removeprefix("text_model.")
                w = mod.weight
                shp_d = (4, *w.shape[1:2], *(1, 1)[: w.ndim - 2])
                shp_u = (w.shape[0], 4, *(1, 1)[: w.ndim - 2])
                key = prefix + n.replace(".", "_")
                lora[f"{key}.lora_down.weight"] = (torch.randn(shp_d, generator=g) * 0.4).contiguous()
                lora[f"{key}.lora_up.weight"] = (torch.randn(shp_u, generator=g) * 0.4).contiguous()
                lora[f"{key}.alpha"] = torch.tensor(2.0)
    save_file(lora, str(d / "tinylora.safetensors"))
    pll = type(pipe)(**{**comps, "unet": copy.deepcopy(unet_l), "text_encoder": copy.deepcopy(te_l)})
    pll.set_progress_bar_config(disable=True)
    pll.load_lora_weights(str(d / "tinylora.safetensors"))
    pll.fuse_lora(lora_scale=0.7)
    out["lora"] = gp.run_case(pll, case, imgs)

    # an A1111 embedding of 2 vectors, trigger word "tinyemb"
    emb = (torch.randn((2, pipe.text_encoder.config.hidden_size), generator=g) * 0.8).contiguous()
    save_file({"emb_params": emb}, str(d / "tinyemb.safetensors"))
    ple = type(pipe)(**{**comps, "text_encoder": copy.deepcopy(te_l), "tokenizer": copy.deepcopy(pipe.tokenizer)})
    ple.set_progress_bar_config(disable=True)
    ple.load_textual_inversion(str(d / "tinyemb.safetensors"), token="tinyemb")
    out["emb"] = gp.run_case(ple, dict(case, prompt=gp.PROMPT + ", tinyemb"), imgs)
    # part outputs inside each pipeline (no sampler in between): prompt embeddings, one UNet call
    g2 = torch.Generator().manual_seed(9)
    sample = torch.randn((1, 4, 8, 8), generator=g2)
    for key, p, prompt in (("ckpt", pl, gp.PROMPT), ("lora", pll, gp.PROMPT), ("emb", ple, gp.PROMPT + ", tinyemb")):
        with torch.no_grad():
            emb_, _ = p.encode_prompt(prompt, "cpu", 1, False)
            out[f"{key}_embeds"] = emb_.numpy()
            out[f"{key}_unet"] = p.unet(sample, torch.tensor([500]), emb_).sample.numpy()
    out["unet_sample"] = sample.numpy()
    np.savez_compressed(d / "refs.npz", **out)
    (d / "cases.json").write_text(json.dumps({"case": case, "lora_prompt": gp.PROMPT + " <lora:tinylora:0.7>",
                                              "emb_prompt": gp.PROMPT + ", tinyemb"}, indent=1))
    print("pipeline refs:", {k: v.shape for k, v in out.items()},
          "differ:", [int(np.abs(out["ckpt"].astype(int) - out[k]).max()) for k in ("lora", "emb")])


def build_vpred_refs() -> None:
    """``pipe-sd15/vpred.npz``: diffusers' images of ``custom.safetensors`` sampled as v-prediction (its
    ``<stem>.yaml`` says ``parameterization: "v"``, as A1111 reads it) and as v-prediction with zero terminal SNR (a
    ``ztsnr`` key, as A1111 and ComfyUI read NoobAI-XL's), for the file bound onto the eps ``tiny-sd15`` folder
    (``--weights``) to match. The committed file and eps image are rebuilt first and checked."""
    import gen_pipeline_refs as gp
    from diffusers import EulerDiscreteScheduler

    d = OUT / "pipe-sd15"
    _, pl, comps, _, _, case, imgs = checkpoint_pipeline(write=False)
    eps = gp.run_case(pl, case, imgs)
    committed = np.load(d / "refs.npz")["ckpt"]
    assert int(np.abs(eps.astype(int) - committed.astype(int)).max()) <= 1, "the eps image is not the committed one"
    out = {}
    for key, extra in (("v", {}), ("v_ztsnr", {"rescale_betas_zero_snr": True})):
        sched = EulerDiscreteScheduler.from_config(pl.scheduler.config, prediction_type="v_prediction", **extra)
        pv = type(pl)(**{**comps, "scheduler": sched})
        pv.set_progress_bar_config(disable=True)
        out[key] = gp.run_case(pv, case, imgs)
    np.savez_compressed(d / "vpred.npz", **out)
    print("vpred refs: differ from eps:", {k: int(np.abs(v.astype(int) - eps.astype(int)).max()) for k, v in out.items()})


def build_clip_skip_refs() -> None:
    """``pipe-sd15/clipskip.npz``: diffusers' image of ``custom.safetensors`` at diffusers' ``clip_skip=1`` (A1111's
    clip skip 2: the penultimate layer through the file's final layer norm), for the file run on its own (sdrt's
    shipped weight-free graphs) to match. The committed file and image are rebuilt first and checked."""
    import gen_pipeline_refs as gp

    d = OUT / "pipe-sd15"
    _, pl, _, _, _, case, imgs = checkpoint_pipeline(write=False)
    committed = np.load(d / "refs.npz")["ckpt"]
    plain = gp.run_case(pl, case, imgs)
    assert int(np.abs(plain.astype(int) - committed.astype(int)).max()) <= 1, "the image is not the committed one"
    skip = gp.run_case(pl, dict(case, clip_skip=1), imgs)
    np.savez_compressed(d / "clipskip.npz", a1111_clip_skip_2=skip)
    print("clip skip ref: differs from clip skip 1 by", int(np.abs(skip.astype(int) - plain.astype(int)).max()))


def build_bench_folder(out: Path) -> None:
    """A mid-size SD 1.x-architecture folder (~0.4 GB, random weights; not committed) with an LDM checkpoint of
    other weights and a kohya LoRA, for ``python -m bench.checkpoint_swap --folder OUT ...``."""
    import shutil

    import gen_pipeline_refs as gp
    from diffusers import AutoencoderKL, PNDMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel

    work = Path(tempfile.mkdtemp())
    tok = gp.write_tokenizer(work / "tokenizer", "<|endoftext|>")
    cfg = gp.text_config(tok, "quick_gelu")
    cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.num_attention_heads = 512, 2048, 8, 8
    te = CLIPTextModel(cfg).eval()
    unet = UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=(160, 320, 320),
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=512,
        attention_head_dim=8, norm_num_groups=32).eval()
    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(64, 128, 256, 256),
                        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                        layers_per_block=2, norm_num_groups=32, sample_size=64).eval()
    for m, seed in ((te, 1), (unet, 3), (vae, 4)):
        gp.scale_weights(m, seed)
    pipe = StableDiffusionPipeline(vae=vae, text_encoder=te, tokenizer=tok, unet=unet,
                                   scheduler=PNDMScheduler.from_config(gp.SD_SCHEDULER), safety_checker=None,
                                   feature_extractor=None, requires_safety_checker=False)
    pipe.tokenizer_dir = {"tokenizer": work / "tokenizer"}
    gp.export(pipe, "sd15", out)
    shutil.rmtree(out / "_torch", ignore_errors=True)
    for m, seed in ((te, 101), (unet, 103), (vae, 104)):
        gp.scale_weights(m, seed)
    ck = unet_to_ldm(unet.state_dict(), ["CrossAttn" in t for t in unet.config.up_block_types], lpb=2)
    ck.update(vae_to_ldm(vae.state_dict(), 4))
    ck.update({"cond_stage_model.transformer.text_model." + k.removeprefix("text_model."): v
               for k, v in te.state_dict().items()})
    save_file(half(ck), str(out / "custom.safetensors"))
    g = torch.Generator().manual_seed(5)
    lora = {}
    for name, mod in unet.named_modules():
        if re.search(r"attn\d\.to_(q|k|v|out\.0)$", name):
            k = "lora_unet_" + name.replace(".", "_")
            lora[f"{k}.lora_down.weight"] = torch.randn((8, mod.weight.shape[1]), generator=g) * 0.1
            lora[f"{k}.lora_up.weight"] = torch.randn((mod.weight.shape[0], 8), generator=g) * 0.1
            lora[f"{k}.alpha"] = torch.tensor(8.0)
    save_file(lora, str(out / "lora.safetensors"))
    print("bench folder:", out, sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) / 2**20, "MiB")


def te_t4(x: dict) -> None:
    """The SD 1.x text encoder (weights A) exported with transformers 4 (``text_model.`` names and scopes)."""
    import transformers

    assert transformers.__version__.startswith("4."), transformers.__version__
    te = make_te("l", 1)
    sd = torch.load(Path(tempfile.gettempdir()) / "sdrt-ckpt-te-a.pt")
    te.load_state_dict({("text_model." + k if not k.startswith("text_model.") else k): v for k, v in sd.items()})
    export(te_export(te.eval()), (torch.from_numpy(x["input_ids"][:1]),), OUT / "sd1" / "text_encoder_t4" / "model.onnx",
           ["input_ids"], te_names(te, False))
    print("exported text_encoder_t4 with transformers", transformers.__version__)


def main() -> None:
    step = sys.argv[1] if len(sys.argv) > 1 else "build"
    x = inputs()
    OUT.mkdir(parents=True, exist_ok=True)
    if step == "build":
        np.savez_compressed(OUT / "inputs.npz", **x)
        build_sd1(x)
        build_sd2_te(x)
        build_sdxl(x)
        (OUT / "README.md").write_text(
            "Generated by scripts/gen_checkpoint_data.py (tiny random-weight models, see its docstring).\n")
    elif step == "pipeline":
        build_pipeline_refs()
    elif step == "vpred":
        build_vpred_refs()
    elif step == "clipskip":
        build_clip_skip_refs()
    elif step == "bench-folder":
        build_bench_folder(Path(sys.argv[2]))
    elif step == "te-t4":
        te_t4(x)
    else:
        raise SystemExit(f"unknown step {step!r}: build or te-t4")
    print(json.dumps({p.relative_to(OUT).as_posix(): p.stat().st_size for p in sorted(OUT.rglob("*")) if p.is_file()},
                     indent=1))


if __name__ == "__main__":
    main()
