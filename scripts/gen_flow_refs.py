"""Build tiny flow-matching model folders (SD3.5, Flux.1 dev/schnell, Chroma) with diffusers, export them, save references.

Run with the reference venv (torch, diffusers, transformers, sentencepiece, onnx, onnxruntime):

    /work/refvenv/bin/python scripts/gen_flow_refs.py                 # every folder under tests/data/pipelines/
    /work/refvenv/bin/python scripts/gen_flow_refs.py --only flux-dev  # one of sd3, flux-dev, flux-schnell, chroma

Each folder is a real diffusers architecture (``SD3Transformer2DModel`` with SD3.5's RMS q/k norm and one
MMDiT-X dual-attention layer, ``FluxTransformer2DModel`` with and without guidance embeddings,
``ChromaTransformer2DModel``), random weights and small widths, exported part by part in Optimum's ONNX layout
and with Optimum's input and output names (``optimum/exporters/onnx/model_configs.py``: ``SD3TransformerOnnxConfig``,
``FluxTransformerOnnxConfig``, ``CLIPTextWithProjectionOnnxConfig``, ``CLIPTextOnnxConfig``,
``T5EncoderOnnxConfig``, ``VaeEncoderOnnxConfig``, ``VaeDecoderOnnxConfig``): int64 token ids, dynamic batch,
sequence and image-size axes, ``config.json`` per part, ``model_index.json``, ``scheduler/``.

Vocabularies: CLIP's own BPE cut to its first merges (as ``gen_pipeline_refs.py`` does), and a small
SentencePiece unigram model trained here on a fixed corpus, wrapped as transformers' ``T5TokenizerFast`` and
saved with ``save_pretrained`` (``tokenizer.json``, ``spiece.model``, ``tokenizer_config.json``,
``special_tokens_map.json``), as the real releases' T5 tokenizer folders hold them.

Chroma: Optimum has no exporter. Its transformer is exported with Flux's names plus a boolean
``attention_mask`` ``[batch, text + image tokens]`` (true = attend), and its T5 encoder with ``input_ids`` and
``attention_mask`` (Chroma encodes the prompt with the tokenizer's mask). The mask keeps every real text token
and the first padding token, as lodestone-rock/flow and ComfyUI do. diffusers builds that mask as a float 0/1
tensor and hands it to ``scaled_dot_product_attention``, which adds it to the scores instead of masking
(diffusers issues #12116, #13619); the references here pass diffusers the same mask as a *boolean* tensor, so
torch masks with it, and a query row with no key left (a dropped padding token) comes out as zeros. The exported
attention does the same explicitly (``softmax`` over the masked scores, then zero where masked), so no NaN can
reach the next block; the script checks the export against torch's boolean-mask attention.

References come from diffusers' own pipelines (``StableDiffusion3Pipeline``, ``StableDiffusion3Img2ImgPipeline``,
``FluxPipeline``, ``FluxImg2ImgPipeline``, ``ChromaPipeline``) with ``torch.Generator("cpu").manual_seed(seed)``
and the scheduler as the folder's ``scheduler/`` gives it. ``refs.json`` lists the cases; ``refs.npz`` holds the
images (uint8) and, per case, the pieces a family implementation can be checked on one at a time: token ids,
prompt embeddings, pooled embeddings, ``txt_ids``/``img_ids``, the Chroma mask, the initial (packed) latents,
the timesteps and sigmas, every transformer call's inputs and output, the latents after each step, and the VAE
decoder's input. ``flow_schedules.json`` holds ``FlowMatchEulerDiscreteScheduler``'s timesteps and sigmas for
many configs. ``t5_corpus.json`` holds the corpus and the ids ``T5TokenizerFast`` gives for it.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

sys.modules["torchvision"] = None  # type: ignore[assignment]  # not needed; its build does not load here

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
from diffusers import (  # noqa: E402
    AutoencoderKL,
    ChromaPipeline,
    ChromaTransformer2DModel,
    FlowMatchEulerDiscreteScheduler,
    FluxImg2ImgPipeline,
    FluxPipeline,
    FluxTransformer2DModel,
    SD3Transformer2DModel,
    StableDiffusion3Img2ImgPipeline,
    StableDiffusion3Pipeline,
)
from diffusers.pipelines.flux.pipeline_flux import calculate_shift  # noqa: E402
from PIL import Image  # noqa: E402
from transformers import (  # noqa: E402
    CLIPTextConfig,
    CLIPTextModel,
    CLIPTextModelWithProjection,
    T5Config,
    T5EncoderModel,
    T5TokenizerFast,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_pipeline_refs import init_image, optimum_model_index, scale_weights, write_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "pipelines"
OPSET = 17
T5_VOCAB = 800
T5_WIDTH = 64
MAX_SEQ = 32  # the cases' max_sequence_length (one case per family keeps the family's default)

# ---------------------------------------------------------------- scheduler configs as the releases ship them
RELEASE_SCHEDULERS = {
    "sd3": {"_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.29.0.dev0",
            "num_train_timesteps": 1000, "shift": 3.0},
    "flux-dev": {"_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.30.0.dev0",
                 "base_image_seq_len": 256, "base_shift": 0.5, "max_image_seq_len": 4096, "max_shift": 1.15,
                 "num_train_timesteps": 1000, "shift": 3.0, "use_dynamic_shifting": True},
    "flux-schnell": {"_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.30.0.dev0",
                     "base_image_seq_len": 256, "base_shift": 0.5, "max_image_seq_len": 4096, "max_shift": 1.15,
                     "num_train_timesteps": 1000, "shift": 1.0, "use_dynamic_shifting": False},
    "chroma": {"_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.35.0.dev0",
               "base_image_seq_len": 256, "base_shift": 0.5, "invert_sigmas": False, "max_image_seq_len": 4096,
               "max_shift": 1.15, "num_train_timesteps": 1000, "shift": 3.0, "shift_terminal": None,
               "stochastic_sampling": False, "time_shift_type": "exponential", "use_beta_sigmas": False,
               "use_dynamic_shifting": True, "use_exponential_sigmas": False, "use_karras_sigmas": False},
}

# ---------------------------------------------------------------- T5 vocabulary (SentencePiece unigram)
_WORDS = ("a photo of red cat sitting on wooden table sunset portrait woman man dog house tree river mountain "
          "city street night rain snow forest lake beach ocean sky cloud sun moon star light shadow blue green "
          "yellow orange purple black white golden silver old young small large beautiful dark bright soft "
          "painting drawing sketch render cinematic detailed realistic anime style oil watercolor digital art "
          "by with and in the under over behind between near far highly intricate sharp focus dramatic "
          "lighting volumetric fog smoke fire water glass metal stone flower garden window door road car train "
          "bird horse fish castle robot astronaut space planet galaxy neon cyberpunk fantasy dragon knight "
          "wearing holding standing walking running flying looking smiling hat coat dress shoes hair eyes face "
          "hands background foreground texture pattern wallpaper macro wide angle lens 35mm 85mm bokeh hdr 4k "
          "8k masterpiece best quality ultra high resolution trending artstation").split()
_EXTRA = ["Café crème, naïve façade; São Paulo — Zürich & Kraków!", "déjà vu: résumé, piñata, Ångström, Øresund.",
          "東京の夜景 霓虹灯 北京 上海 한국어 텍스트", "Price: $12.50 (was 19.99) — 3/4 off, 100% sure; #1 at 10:30?",
          "Quotes \"double\" and 'single', brackets [x] {y} <z>, path a/b\\c, email me@x.org",
          "ＦＵＬＬＷＩＤＴＨ ｌｅｔｔｅｒｓ and ﬁ ligatures, ½ fractions, ² superscripts", "tabs\tand\nnewlines   spaces"]


def t5_corpus(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 30))]
        words = [w.capitalize() if rng.random() < 0.15 else w.upper() if rng.random() < 0.03 else w for w in words]
        if i % 7 == 0:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 100000)))
        if i % 5 == 0:
            words.append(rng.choice([",", ".", "!", "?", ";", ":", "(", ")", "-"]))
        out.append(" ".join(words))
    return out + _EXTRA


def write_t5_tokenizer(folder: Path) -> T5TokenizerFast:
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(t5_corpus(4000, 0) * 2), model_writer=model, vocab_size=T5_VOCAB,
        model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1, character_coverage=1.0,
        normalization_rule_name="nmt_nfkc", hard_vocab_limit=False, minloglevel=2,
    )
    work = Path(tempfile.mkdtemp())
    (work / "spiece.model").write_bytes(model.getvalue())
    # legacy=True with add_prefix_space=True: the released T5 tokenizers' behaviour (Metaspace prepend "always",
    # the same pieces as sentencepiece itself gives); without add_prefix_space transformers 4.57 writes
    # prepend_scheme "never" and the first word loses its "▁".
    tok = T5TokenizerFast(vocab_file=str(work / "spiece.model"), extra_ids=100, legacy=True, add_prefix_space=True,
                          from_slow=True, model_max_length=512)
    tok.save_pretrained(folder)
    return T5TokenizerFast.from_pretrained(folder)


# ---------------------------------------------------------------- models
def clip_config(tok, hidden: int, act: str = "quick_gelu") -> CLIPTextConfig:
    return CLIPTextConfig(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 2, num_attention_heads=4,
        num_hidden_layers=3, max_position_embeddings=77, hidden_act=act, projection_dim=hidden,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )


def t5_encoder(tok, seed: int) -> T5EncoderModel:
    cfg = T5Config(vocab_size=len(tok), d_model=T5_WIDTH, d_kv=16, d_ff=96, num_layers=2, num_heads=4,
                   relative_attention_num_buckets=32, relative_attention_max_distance=128,
                   feed_forward_proj="gated-gelu", dense_act_fn="gelu_new", is_gated_act=True,
                   pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, tie_word_embeddings=False)
    model = T5EncoderModel(cfg).eval()
    scale_weights(model, seed)
    return model


def flow_vae(scaling: float, shift: float, seed: int) -> AutoencoderKL:
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(8, 16, 16, 16), layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        norm_num_groups=8, sample_size=64, scaling_factor=scaling, shift_factor=shift, use_quant_conv=False,
        use_post_quant_conv=False,
    ).eval()
    scale_weights(vae, seed)
    return vae


def build(kind: str):
    torch.manual_seed(0)
    work = Path(tempfile.mkdtemp())
    sched = FlowMatchEulerDiscreteScheduler.from_config(RELEASE_SCHEDULERS[kind])
    dirs: dict[str, Path] = {}
    if kind == "sd3":
        tok = write_tokenizer(work / "tokenizer", "<|endoftext|>")
        tok2 = write_tokenizer(work / "tokenizer_2", "!")
        tok3 = write_t5_tokenizer(work / "tokenizer_3")
        dirs = {"tokenizer": work / "tokenizer", "tokenizer_2": work / "tokenizer_2", "tokenizer_3": work / "tokenizer_3"}
        # CLIP-L and CLIP-G widths add up to less than T5's (as 768 + 1280 < 4096), so SD3's zero padding is real
        te = CLIPTextModelWithProjection(clip_config(tok, 16)).eval()
        te2 = CLIPTextModelWithProjection(clip_config(tok2, 32, "gelu")).eval()
        te3 = t5_encoder(tok3, 3)
        scale_weights(te, 1)
        scale_weights(te2, 2)
        tr = SD3Transformer2DModel(sample_size=16, patch_size=2, in_channels=16, num_layers=2, attention_head_dim=8,
                                   num_attention_heads=4, joint_attention_dim=T5_WIDTH, caption_projection_dim=32,
                                   pooled_projection_dim=16 + 32, out_channels=16, pos_embed_max_size=16,
                                   dual_attention_layers=(0,), qk_norm="rms_norm").eval()
        scale_weights(tr, 4)
        vae = flow_vae(1.5305, 0.0609, 5)
        pipe = StableDiffusion3Pipeline(transformer=tr, scheduler=sched, vae=vae, text_encoder=te, tokenizer=tok,
                                        text_encoder_2=te2, tokenizer_2=tok2, text_encoder_3=te3, tokenizer_3=tok3)
    elif kind.startswith("flux"):
        tok = write_tokenizer(work / "tokenizer", "<|endoftext|>")
        tok2 = write_t5_tokenizer(work / "tokenizer_2")
        dirs = {"tokenizer": work / "tokenizer", "tokenizer_2": work / "tokenizer_2"}
        te = CLIPTextModel(clip_config(tok, 32)).eval()
        te2 = t5_encoder(tok2, 2)
        scale_weights(te, 1)
        tr = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=1, num_single_layers=2,
                                    attention_head_dim=16, num_attention_heads=2, joint_attention_dim=T5_WIDTH,
                                    pooled_projection_dim=32, guidance_embeds=kind == "flux-dev",
                                    axes_dims_rope=(4, 6, 6)).eval()
        scale_weights(tr, 4)
        vae = flow_vae(0.3611, 0.1159, 5)
        pipe = FluxPipeline(scheduler=sched, vae=vae, text_encoder=te, tokenizer=tok, text_encoder_2=te2,
                            tokenizer_2=tok2, transformer=tr)
    else:
        tok = write_t5_tokenizer(work / "tokenizer")
        dirs = {"tokenizer": work / "tokenizer"}
        te = t5_encoder(tok, 2)
        tr = ChromaTransformer2DModel(patch_size=1, in_channels=64, num_layers=1, num_single_layers=2,
                                      attention_head_dim=16, num_attention_heads=2, joint_attention_dim=T5_WIDTH,
                                      axes_dims_rope=(4, 6, 6), approximator_num_channels=16,
                                      approximator_hidden_dim=32, approximator_layers=2).eval()
        scale_weights(tr, 4)
        vae = flow_vae(0.3611, 0.1159, 5)
        pipe = ChromaPipeline(scheduler=sched, vae=vae, text_encoder=te, tokenizer=tok, transformer=tr)
    pipe.set_progress_bar_config(disable=True)
    pipe.tokenizer_dirs = dirs
    return pipe


# ---------------------------------------------------------------- Chroma's masked attention, for the export
class MaskedFluxAttnProcessor:
    """Flux/Chroma attention with a boolean mask, written out: masked scores get the dtype's minimum, the
    softmax runs, then masked weights are set to zero. Rows with some key left equal torch's boolean-mask
    ``scaled_dot_product_attention``; a row with none comes out as zeros (as torch gives), never NaN."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        def heads(x):
            return x.unflatten(-1, (attn.heads, -1))

        q, k, v = heads(attn.to_q(hidden_states)), heads(attn.to_k(hidden_states)), heads(attn.to_v(hidden_states))
        q, k = attn.norm_q(q), attn.norm_k(k)
        if encoder_hidden_states is not None:
            eq = attn.norm_added_q(heads(attn.add_q_proj(encoder_hidden_states)))
            ek = attn.norm_added_k(heads(attn.add_k_proj(encoder_hidden_states)))
            ev = heads(attn.add_v_proj(encoder_hidden_states))
            q, k, v = torch.cat([eq, q], 1), torch.cat([ek, k], 1), torch.cat([ev, v], 1)
        if image_rotary_emb is not None:
            q = _rotary(q, image_rotary_emb, sequence_dim=1)
            k = _rotary(k, image_rotary_emb, sequence_dim=1)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        scores = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
        if attention_mask is not None:
            mask = attention_mask.bool()
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
            weights = scores.softmax(-1).masked_fill(~mask, 0.0)
        else:
            weights = scores.softmax(-1)
        out = (weights @ v).transpose(1, 2).flatten(2, 3).to(q.dtype)
        if encoder_hidden_states is not None:
            n = encoder_hidden_states.shape[1]
            enc, out = out[:, :n], out[:, n:]
            out = attn.to_out[1](attn.to_out[0](out))
            return out, attn.to_add_out(enc)
        return out


# ---------------------------------------------------------------- ONNX export (Optimum's layout and names)
class _ClipProj(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        out = self.model(input_ids=input_ids, output_hidden_states=True)
        return (out.text_embeds, out.last_hidden_state, *out.hidden_states)


class _Clip(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        out = self.model(input_ids=input_ids)
        return out.last_hidden_state, out.pooler_output


class _T5(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask=None):
        return self.model(input_ids=input_ids, attention_mask=attention_mask)[0]


class _SD3(torch.nn.Module):
    def __init__(self, tr):
        super().__init__()
        self.tr = tr

    def forward(self, hidden_states, encoder_hidden_states, pooled_projections, timestep):
        return self.tr(hidden_states=hidden_states, encoder_hidden_states=encoder_hidden_states,
                       pooled_projections=pooled_projections, timestep=timestep, return_dict=False)[0]


class _Flux(torch.nn.Module):
    def __init__(self, tr):
        super().__init__()
        self.tr = tr

    def forward(self, hidden_states, encoder_hidden_states, pooled_projections, timestep, txt_ids, img_ids,
                guidance=None):
        return self.tr(hidden_states=hidden_states, encoder_hidden_states=encoder_hidden_states,
                       pooled_projections=pooled_projections, timestep=timestep, img_ids=img_ids, txt_ids=txt_ids,
                       guidance=guidance, return_dict=False)[0]


class _Chroma(torch.nn.Module):
    def __init__(self, tr):
        super().__init__()
        self.tr = tr

    def forward(self, hidden_states, encoder_hidden_states, timestep, txt_ids, img_ids, attention_mask):
        return self.tr(hidden_states=hidden_states, encoder_hidden_states=encoder_hidden_states, timestep=timestep,
                       img_ids=img_ids, txt_ids=txt_ids, attention_mask=attention_mask, return_dict=False)[0]


class _VaeEncoder(torch.nn.Module):
    def __init__(self, vae):
        super().__init__()
        self.vae = vae

    def forward(self, sample):
        return self.vae.encode(sample).latent_dist.parameters


class _VaeDecoder(torch.nn.Module):
    def __init__(self, vae):
        super().__init__()
        self.vae = vae

    def forward(self, latent_sample):
        return self.vae.decode(latent_sample, return_dict=False)[0]


def _rms_norm_decomposed(self, x):
    eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
    out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return out * self.weight if self.weight is not None else out


def _rotary(x, freqs_cis, use_real=True, use_real_unbind_dim=-1, sequence_dim=2):
    """Flux's rotary embedding with strided slices instead of a reshape to pairs: traced, that reshape keeps
    the export's sequence length as a constant (Optimum's Flux exporter patches it the same way)."""
    assert use_real and use_real_unbind_dim == -1
    cos, sin = freqs_cis
    index = (None, None) if sequence_dim == 2 else (None, slice(None), None)
    cos, sin = cos[index], sin[index]
    rotated = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(3)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


def _chroma_time_embed(self, timestep):
    """diffusers' ChromaCombinedTimestepTextProjEmbeddings.forward with the batch taken from ``timestep``: the
    original builds its zero guidance as ``torch.tensor([0] * batch_size)``, which the tracer keeps as a constant
    of the export's batch size."""
    t = self.time_proj(timestep).to(dtype=timestep.dtype)
    g = self.guidance_proj(torch.zeros_like(timestep)).to(dtype=timestep.dtype)
    n = self.mod_proj.shape[0]
    tg = torch.cat([t, g], dim=1).unsqueeze(1).repeat(1, n, 1)
    mod = self.mod_proj.to(dtype=t.dtype)[None].expand(timestep.shape[0], -1, -1)
    return torch.cat([tg, mod], dim=-1).to(timestep.dtype)


def _export(module, args, path: Path, inputs, outputs, dynamic, external: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    module.eval()  # the export restores the wrapper's mode afterwards, recursively: a fresh wrapper would leave
    # T5's dropout switched on for the references. torch.nn.RMSNorm (Flux's q/k norms) has no opset-17
    # symbolic: it is exported as the Pow/ReduceMean/Sqrt/Div sequence diffusers' own RMSNorm gives.
    import diffusers.models.transformers.transformer_chroma as chroma_module
    import diffusers.models.transformers.transformer_flux as flux_module

    with torch.no_grad(), _patched(torch.nn.RMSNorm, "forward", _rms_norm_decomposed), \
            _patched(flux_module, "apply_rotary_emb", _rotary), \
            _patched(chroma_module.ChromaCombinedTimestepTextProjEmbeddings, "forward", _chroma_time_embed):
        torch.onnx.export(module, args, str(path), input_names=inputs, output_names=outputs,
                          dynamic_axes=dynamic, opset_version=OPSET, dynamo=False, do_constant_folding=True)
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    if external:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location="model.onnx_data", size_threshold=1024)


class _patched:
    def __init__(self, owner, name, value) -> None:
        self.owner, self.name, self.value = owner, name, value

    def __enter__(self) -> None:
        self.old = getattr(self.owner, self.name)
        setattr(self.owner, self.name, self.value)

    def __exit__(self, *exc) -> None:
        setattr(self.owner, self.name, self.old)


def _check_export(path: Path, module, feeds: dict[str, np.ndarray], atol: float = 1e-4) -> None:
    """The exported graph, run by onnxruntime on shapes other than the export's, against torch."""
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(None, feeds)[0]
    with torch.no_grad():
        want = module(*[torch.from_numpy(feeds[i.name]) for i in sess.get_inputs()])
    want = (want[0] if isinstance(want, tuple) else want).numpy()
    assert np.isfinite(got).all(), f"{path}: non-finite output"
    err = float(np.abs(got - want).max())
    assert err < atol * max(1.0, float(np.abs(want).max())), f"{path}: onnxruntime vs torch max error {err}"
    print(f"  {path.parent.name}: onnxruntime vs torch max abs error {err:.2e}")


def export(pipe, kind: str, out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    tmp = out / "_torch"
    pipe.save_pretrained(tmp, safe_serialization=True)
    (out / "scheduler").mkdir()
    (out / "scheduler" / "scheduler_config.json").write_text(json.dumps(RELEASE_SCHEDULERS[kind], indent=2) + "\n")
    pipe.scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(out / "scheduler")
    for name, src in pipe.tokenizer_dirs.items():
        shutil.copytree(src, out / name)
    b, bs = {0: "batch_size"}, {0: "batch_size", 1: "sequence_length"}
    ids = torch.zeros((1, 77), dtype=torch.int64)
    rng = np.random.default_rng(0)

    def clip_ids(n):
        return rng.integers(0, 500, (2, n)).astype(np.int64)

    # text encoders
    if kind == "sd3":
        for name in ("text_encoder", "text_encoder_2"):
            enc = getattr(pipe, name)
            hidden = [f"hidden_states.{i}" for i in range(enc.config.num_hidden_layers + 1)]
            outs = ["text_embeds", "last_hidden_state", *hidden]
            path = out / name / "model.onnx"
            _export(_ClipProj(enc), (ids,), path, ["input_ids"], outs,
                    {"input_ids": bs, "text_embeds": b, **{n: bs for n in outs[1:]}})
            _check_export(path, _ClipProj(enc), {"input_ids": clip_ids(77)})
            shutil.copy(tmp / name / "config.json", out / name / "config.json")
    if kind.startswith("flux"):
        path = out / "text_encoder" / "model.onnx"
        _export(_Clip(pipe.text_encoder), (ids,), path, ["input_ids"], ["last_hidden_state", "pooler_output"],
                {"input_ids": bs, "last_hidden_state": bs, "pooler_output": b})
        _check_export(path, _Clip(pipe.text_encoder), {"input_ids": clip_ids(77)})
        shutil.copy(tmp / "text_encoder" / "config.json", out / "text_encoder" / "config.json")
    t5name = {"sd3": "text_encoder_3", "chroma": "text_encoder"}.get(kind, "text_encoder_2")
    t5 = getattr(pipe, t5name)
    t5ids = torch.zeros((1, 16), dtype=torch.int64)
    path = out / t5name / "model.onnx"
    if kind == "chroma":
        mask = torch.ones((1, 16), dtype=torch.int64)
        _export(_T5(t5), (t5ids, mask), path, ["input_ids", "attention_mask"], ["last_hidden_state"],
                {"input_ids": bs, "attention_mask": bs, "last_hidden_state": bs})
        m = np.ones((2, 40), np.int64)
        m[0, 9:] = 0
        _check_export(path, _T5(t5), {"input_ids": rng.integers(0, 800, (2, 40)).astype(np.int64), "attention_mask": m})
    else:
        _export(_T5(t5), (t5ids,), path, ["input_ids"], ["last_hidden_state"],
                {"input_ids": bs, "last_hidden_state": bs})
        _check_export(path, _T5(t5), {"input_ids": rng.integers(0, 800, (2, 40)).astype(np.int64)})
    shutil.copy(tmp / t5name / "config.json", out / t5name / "config.json")

    # transformer
    tr = pipe.transformer
    jd = tr.config.joint_attention_dim  # read from the model: scripts/gen_family_variants.py varies them
    pd = getattr(tr.config, "pooled_projection_dim", None)
    path = out / "transformer" / "model.onnx"
    f32 = np.float32
    if kind == "sd3":
        args = (torch.randn(1, 16, 8, 8), torch.randn(1, 20, jd), torch.randn(1, pd), torch.tensor([500.0]))
        names = ["hidden_states", "encoder_hidden_states", "pooled_projections", "timestep"]
        dyn = {"hidden_states": {0: "batch_size", 2: "height", 3: "width"}, "encoder_hidden_states": bs,
               "pooled_projections": b, "timestep": {0: "step"},
               "out_hidden_states": {0: "batch_size", 2: "height", 3: "width"}}
        _export(_SD3(tr), args, path, names, ["out_hidden_states"], dyn, external=True)
        _check_export(path, _SD3(tr), {"hidden_states": rng.standard_normal((2, 16, 8, 12)).astype(f32),
                                       "encoder_hidden_states": rng.standard_normal((2, 41, jd)).astype(f32),
                                       "pooled_projections": rng.standard_normal((2, pd)).astype(f32),
                                       "timestep": np.array([700.0, 700.0], f32)})
    else:
        img = torch.randn(1, 16, 64)
        txt = torch.randn(1, 20, jd)
        txt_ids = torch.zeros(20, 3)
        img_ids = torch.zeros(16, 3)
        hw = {0: "batch_size", 1: "packed_height_width"}
        dyn = {"hidden_states": hw, "encoder_hidden_states": bs, "timestep": {0: "step"},
               "txt_ids": {0: "sequence_length"}, "img_ids": {0: "packed_height_width"}, "out_hidden_states": hw}
        n_txt, n_img = 41, 24
        grid = np.zeros((4, 6, 3), f32)
        grid[..., 1] = np.arange(4)[:, None]
        grid[..., 2] = np.arange(6)[None, :]
        feeds = {"hidden_states": rng.standard_normal((2, n_img, 64)).astype(f32),
                 "encoder_hidden_states": rng.standard_normal((2, n_txt, jd)).astype(f32),
                 "timestep": np.array([0.7, 0.7], f32), "txt_ids": np.zeros((n_txt, 3), f32),
                 "img_ids": grid.reshape(-1, 3)}
        if kind == "chroma":
            tr.set_attn_processor(MaskedFluxAttnProcessor())
            mask = torch.ones(1, 36, dtype=torch.bool)
            names = ["hidden_states", "encoder_hidden_states", "timestep", "txt_ids", "img_ids", "attention_mask"]
            dyn["attention_mask"] = {0: "batch_size", 1: "sequence_length + packed_height_width"}
            _export(_Chroma(tr), (img, txt, torch.tensor([0.5]), txt_ids, img_ids, mask), path, names,
                    ["out_hidden_states"], dyn, external=True)
            m = np.ones((2, n_txt + n_img), bool)
            m[0, 8:n_txt] = False  # 7 real tokens + the first padding token kept, the rest dropped
            m[1, 30:n_txt] = False
            feeds["attention_mask"] = m
            _check_export(path, _Chroma(tr), feeds)
            check_chroma_mask_path(tr, feeds)
        else:
            names = ["hidden_states", "encoder_hidden_states", "pooled_projections", "timestep", "txt_ids", "img_ids"]
            dyn["pooled_projections"] = b
            args = (img, txt, torch.randn(1, pd), torch.tensor([0.5]), txt_ids, img_ids)
            feeds["pooled_projections"] = rng.standard_normal((2, pd)).astype(f32)
            if tr.config.guidance_embeds:
                names.append("guidance")
                dyn["guidance"] = b
                args = (*args, torch.tensor([3.5]))
                feeds["guidance"] = np.array([3.5, 2.0], f32)
            _export(_Flux(tr), args, path, names, ["out_hidden_states"], dyn, external=True)
            _check_export(path, _Flux(tr), feeds)
    shutil.copy(tmp / "transformer" / "config.json", out / "transformer" / "config.json")

    # VAE
    _export(_VaeEncoder(pipe.vae), (torch.randn(1, 3, 64, 64),), out / "vae_encoder" / "model.onnx", ["sample"],
            ["latent_parameters"], {"sample": {0: "batch_size", 2: "sample_height", 3: "sample_width"},
                                    "latent_parameters": {0: "batch_size", 2: "sample_height / 8",
                                                          3: "sample_width / 8"}})
    _check_export(out / "vae_encoder" / "model.onnx", _VaeEncoder(pipe.vae),
                  {"sample": rng.uniform(-1, 1, (1, 3, 64, 96)).astype(f32)})
    _export(_VaeDecoder(pipe.vae), (torch.randn(1, 16, 8, 8),), out / "vae_decoder" / "model.onnx",
            ["latent_sample"], ["sample"], {"latent_sample": {0: "batch_size", 2: "latent_height", 3: "latent_width"},
                                             "sample": {0: "batch_size", 2: "latent_height * 8",
                                                        3: "latent_width * 8"}})
    _check_export(out / "vae_decoder" / "model.onnx", _VaeDecoder(pipe.vae),
                  {"latent_sample": rng.standard_normal((1, 16, 8, 12)).astype(f32)})
    for part in ("vae_encoder", "vae_decoder"):
        shutil.copy(tmp / "vae" / "config.json", out / part / "config.json")

    index = optimum_model_index(json.loads((tmp / "model_index.json").read_text()))
    (out / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
    shutil.rmtree(tmp)


def check_chroma_mask_path(tr, feeds: dict[str, np.ndarray]) -> None:
    """The exported processor against diffusers' own processor given a boolean mask (torch SDPA)."""
    t = {k: torch.from_numpy(v) for k, v in feeds.items()}
    with torch.no_grad():
        mine = _Chroma(tr)(*[t[n] for n in ("hidden_states", "encoder_hidden_states", "timestep", "txt_ids",
                                            "img_ids", "attention_mask")])
        from diffusers.models.transformers.transformer_flux import FluxAttnProcessor

        tr.set_attn_processor(FluxAttnProcessor())
        theirs = _Chroma(tr)(*[t[n] for n in ("hidden_states", "encoder_hidden_states", "timestep", "txt_ids",
                                              "img_ids", "attention_mask")])
        tr.set_attn_processor(MaskedFluxAttnProcessor())
    err = float((mine - theirs).abs().max())
    assert torch.isfinite(theirs).all() and err < 1e-4, f"masked processor vs diffusers' boolean-mask path: {err}"
    print(f"  chroma: written-out masked attention vs diffusers + torch boolean-mask SDPA max abs error {err:.2e}")


# ---------------------------------------------------------------- references
PROMPT = "a photo of a red cat sitting on a wooden table, sunset"
NEGATIVE = "blurry, low quality"
LONG = ("a highly detailed oil painting of an old castle on a mountain by a lake at night, volumetric fog, neon "
        "lights, 8k masterpiece, dramatic lighting, golden hour, intricate texture, trending on artstation")


def cases_for(kind: str) -> list[dict]:
    base = dict(prompt=PROMPT, negative_prompt=None, steps=3, seed=1234, width=64, height=64, batch=1,
                max_sequence_length=MAX_SEQ, mode="txt2img")
    if kind == "sd3":
        return [
            dict(base, name="txt2img/64x96/cfg 5/negative", width=96, cfg=5.0, negative_prompt=NEGATIVE, seed=1),
            dict(base, name="txt2img/128x64/cfg 3.5/2 steps", width=128, cfg=3.5, steps=2, seed=2),
            dict(base, name="txt2img/64x64/cfg 1/4 steps/long prompt", prompt=LONG, cfg=1.0, steps=4, seed=3),
            dict(base, name="txt2img/64x64/cfg 7/default max_sequence_length", cfg=7.0, negative_prompt=NEGATIVE,
                 steps=2, seed=4, max_sequence_length=256),
            dict(base, name="txt2img/64x64/batch 2", cfg=4.0, batch=2, steps=2, seed=5),
            dict(base, name="img2img/strength 0.6", mode="img2img", cfg=5.0, negative_prompt=NEGATIVE, steps=4,
                 strength=0.6, seed=6),
        ]
    if kind == "flux-dev":
        return [
            dict(base, name="txt2img/96x64/guidance 3.5", width=96, guidance=3.5, cfg=1.0, seed=11),
            dict(base, name="txt2img/64x128/guidance 5/4 steps", width=64, height=128, guidance=5.0, cfg=1.0,
                 steps=4, seed=12),
            dict(base, name="txt2img/64x64/guidance 1.5/2 steps/long", prompt=LONG, guidance=1.5, cfg=1.0, steps=2,
                 seed=13),
            dict(base, name="txt2img/64x64/true cfg 4/negative", guidance=3.5, cfg=4.0, negative_prompt=NEGATIVE,
                 steps=2, seed=14),
            dict(base, name="txt2img/64x64/default max_sequence_length", guidance=3.5, cfg=1.0, steps=2, seed=15,
                 max_sequence_length=512),
            dict(base, name="img2img/strength 0.7", mode="img2img", guidance=3.5, cfg=1.0, steps=4, strength=0.7,
                 seed=16),
        ]
    if kind == "flux-schnell":
        return [
            dict(base, name="txt2img/96x64/4 steps", width=96, cfg=1.0, steps=4, seed=21),
            dict(base, name="txt2img/64x64/2 steps/batch 2", cfg=1.0, steps=2, batch=2, seed=22),
            dict(base, name="txt2img/64x128/1 step", height=128, cfg=1.0, steps=1, seed=23),
            dict(base, name="img2img/strength 0.5", mode="img2img", cfg=1.0, steps=4, strength=0.5, seed=24),
        ]
    return [  # chroma
        dict(base, name="txt2img/96x64/cfg 4/negative", width=96, cfg=4.0, negative_prompt=NEGATIVE, seed=31),
        dict(base, name="txt2img/64x128/cfg 3/empty negative/4 steps", height=128, cfg=3.0, negative_prompt="",
             steps=4, seed=32),
        dict(base, name="txt2img/64x64/cfg 1/long", prompt=LONG, cfg=1.0, steps=2, seed=33),
        dict(base, name="txt2img/64x64/cfg 5/default max_sequence_length", cfg=5.0, negative_prompt=NEGATIVE,
             steps=2, seed=34, max_sequence_length=512),
    ]


class Recorder:
    """Every transformer call's inputs and output, the VAE decoder's input and the steps' latents."""

    def __init__(self, pipe) -> None:
        self.calls: list[dict[str, np.ndarray]] = []
        self.decoder_in: list[np.ndarray] = []
        self.step_latents: list[np.ndarray] = []
        self.hooks = [
            pipe.transformer.register_forward_hook(self._tr, with_kwargs=True),
            pipe.vae.decoder.register_forward_pre_hook(self._dec),
        ]
        self.post_quant = pipe.vae

    def _tr(self, module, args, kwargs, output) -> None:
        rec = {k: v.detach().numpy().copy() for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
        out = output[0] if isinstance(output, tuple) else output.sample
        rec["out"] = out.detach().numpy().copy()
        self.calls.append(rec)

    def _dec(self, module, args) -> None:
        self.decoder_in.append(args[0].detach().numpy().copy())

    def step(self, pipe, i, t, kw):
        self.step_latents.append(kw["latents"].detach().numpy().copy())
        return {}

    def close(self) -> None:
        for h in self.hooks:
            h.remove()


def _np(x) -> np.ndarray:
    return x.detach().numpy().copy()


def encode(pipe, kind: str, case: dict, prefix: str, refs: dict[str, np.ndarray]):
    """Prompt embeddings through diffusers' own encode_prompt; records them and the token ids."""
    msl = case["max_sequence_length"]
    neg = case["negative_prompt"]
    p, n = case["prompt"], neg if neg is not None else ""
    if kind == "sd3":
        for key, text in (("prompt", p), ("negative", n)):
            refs[f"{prefix}/{key}/ids_l"] = pipe.tokenizer(text, padding="max_length", max_length=77,
                                                           truncation=True, return_tensors="np").input_ids
            refs[f"{prefix}/{key}/ids_g"] = pipe.tokenizer_2(text, padding="max_length", max_length=77,
                                                             truncation=True, return_tensors="np").input_ids
            refs[f"{prefix}/{key}/ids_t5"] = pipe.tokenizer_3(text, padding="max_length", max_length=msl,
                                                              truncation=True, add_special_tokens=True,
                                                              return_tensors="np").input_ids
        with torch.no_grad():
            pe, ne, pp, npp = pipe.encode_prompt(p, p, p, negative_prompt=n, negative_prompt_2=n,
                                                 negative_prompt_3=n, do_classifier_free_guidance=True,
                                                 max_sequence_length=msl)
        refs.update({f"{prefix}/prompt_embeds": _np(pe), f"{prefix}/pooled_prompt_embeds": _np(pp),
                     f"{prefix}/negative_prompt_embeds": _np(ne), f"{prefix}/negative_pooled_prompt_embeds": _np(npp)})
        return None
    if kind.startswith("flux"):
        for key, text in (("prompt", p), ("negative", n)):
            refs[f"{prefix}/{key}/ids_clip"] = pipe.tokenizer(text, padding="max_length", max_length=77,
                                                              truncation=True, return_tensors="np").input_ids
            refs[f"{prefix}/{key}/ids_t5"] = pipe.tokenizer_2(text, padding="max_length", max_length=msl,
                                                              truncation=True, return_tensors="np").input_ids
            with torch.no_grad():
                pe, pp, tid = pipe.encode_prompt(text, text, max_sequence_length=msl)
            refs[f"{prefix}/{key}/prompt_embeds"] = _np(pe)
            refs[f"{prefix}/{key}/pooled_prompt_embeds"] = _np(pp)
            refs[f"{prefix}/{key}/text_ids"] = _np(tid)
        return None
    out = {}
    for key, text in (("prompt", p), ("negative", n)):
        t = pipe.tokenizer(text, padding="max_length", max_length=msl, truncation=True, return_tensors="np")
        refs[f"{prefix}/{key}/ids_t5"] = t.input_ids
        refs[f"{prefix}/{key}/tokenizer_mask"] = t.attention_mask
        with torch.no_grad():
            pe, tid, mask = pipe.encode_prompt(text, do_classifier_free_guidance=False, max_sequence_length=msl)[:3]
        mask = mask.bool()  # diffusers builds it as float 0/1; torch masks only with a boolean one
        refs[f"{prefix}/{key}/prompt_embeds"] = _np(pe)
        refs[f"{prefix}/{key}/text_ids"] = _np(tid)
        refs[f"{prefix}/{key}/text_mask"] = _np(mask)
        out[key] = (pe, mask)
    return out


def run_case(pipe, kind: str, case: dict, refs: dict[str, np.ndarray]) -> None:
    prefix = case["name"]
    chroma = encode(pipe, kind, case, prefix, refs)
    rec = Recorder(pipe)
    gen = torch.Generator("cpu").manual_seed(case["seed"])
    common = dict(num_inference_steps=case["steps"], generator=gen, num_images_per_prompt=case["batch"],
                  output_type="np", max_sequence_length=case["max_sequence_length"],
                  callback_on_step_end=rec.step, callback_on_step_end_tensor_inputs=["latents"])
    init = Image.fromarray(init_image())
    img2img = case["mode"] == "img2img"
    sched_hist: dict[str, np.ndarray] = {}
    orig_set = pipe.scheduler.set_timesteps

    @functools.wraps(orig_set)  # the pipelines inspect its signature for `sigmas` and `mu`
    def set_timesteps(*a, **k):
        orig_set(*a, **k)
        sched_hist["timesteps"] = _np(pipe.scheduler.timesteps)
        sched_hist["sigmas"] = _np(pipe.scheduler.sigmas)
        if "mu" in k and k["mu"] is not None:
            sched_hist["mu"] = np.array(k["mu"], np.float64)

    pipe.scheduler.set_timesteps = set_timesteps
    try:
        with torch.no_grad():
            if kind == "sd3":
                kw = dict(prompt=case["prompt"], negative_prompt=case["negative_prompt"],
                          guidance_scale=case["cfg"], **common)
                if img2img:
                    p = StableDiffusion3Img2ImgPipeline(**pipe.components)
                    p.set_progress_bar_config(disable=True)
                    result = p(image=init, strength=case["strength"], height=64, width=64, **kw)
                else:
                    result = pipe(height=case["height"], width=case["width"], **kw)
            elif kind.startswith("flux"):
                kw = dict(prompt=case["prompt"], negative_prompt=case["negative_prompt"],
                          true_cfg_scale=case["cfg"], guidance_scale=case.get("guidance", 3.5), **common)
                if img2img:
                    p = FluxImg2ImgPipeline(**pipe.components)
                    p.set_progress_bar_config(disable=True)
                    result = p(image=init, strength=case["strength"], height=64, width=64, **kw)
                else:
                    result = pipe(height=case["height"], width=case["width"], **kw)
            else:
                (pe, pm), (ne, nm) = chroma["prompt"], chroma["negative"]
                kw = dict(prompt_embeds=pe, prompt_attention_mask=pm, guidance_scale=case["cfg"], **common)
                if case["cfg"] > 1:  # an absent negative prompt is "", as diffusers encodes it
                    kw.update(negative_prompt_embeds=ne, negative_prompt_attention_mask=nm)
                result = pipe(height=case["height"], width=case["width"], **kw)
    finally:
        pipe.scheduler.set_timesteps = orig_set
        rec.close()
    image = (result.images * 255).round().astype(np.uint8)
    refs[f"{prefix}/image"] = image
    for k, v in sched_hist.items():
        refs[f"{prefix}/scheduler/{k}"] = v
    refs[f"{prefix}/step_latents"] = np.stack(rec.step_latents)
    refs[f"{prefix}/decoder_in"] = rec.decoder_in[-1]
    for i, call in enumerate(rec.calls):
        for k, v in call.items():
            if k == "encoder_hidden_states" or (k in ("pooled_projections", "txt_ids") and i > 1):
                continue  # the prompt's (or negative prompt's) embeddings above; the same every step
            refs[f"{prefix}/call{i}/{k}"] = v
    case["calls"] = len(rec.calls)
    case["begin_index"] = int(pipe.scheduler.begin_index or 0) if img2img else 0
    finite = all(np.isfinite(c["out"]).all() for c in rec.calls)
    assert finite, f"{kind} {prefix}: non-finite transformer output"
    print(f"  {kind} {prefix}: {image.shape} std {float(image.std()):.1f}, {len(rec.calls)} transformer calls")


def flow_schedule_tables() -> list[dict]:
    """FlowMatchEulerDiscreteScheduler's timesteps and sigmas for many configs, as the pipelines call it."""
    rows = []
    for steps in (1, 2, 3, 4, 7, 20, 28, 50):
        for shift in (1.0, 3.0, 2.0):  # SD3 style: no sigmas passed
            s = FlowMatchEulerDiscreteScheduler(shift=shift)
            s.set_timesteps(steps)
            rows.append(dict(config=dict(shift=shift), call=dict(num_inference_steps=steps),
                             timesteps=_np(s.timesteps).tolist(), sigmas=_np(s.sigmas).tolist()))
        for seq in (16, 24, 256, 1024, 4096, 6400):  # Flux/Chroma style: linspace sigmas and mu
            mu = calculate_shift(seq, 256, 4096, 0.5, 1.15)
            sig = np.linspace(1.0, 1 / steps, steps)
            s = FlowMatchEulerDiscreteScheduler(**{k: v for k, v in RELEASE_SCHEDULERS["flux-dev"].items()
                                                   if not k.startswith("_")})
            s.set_timesteps(steps, sigmas=sig, mu=mu)
            rows.append(dict(config=dict(use_dynamic_shifting=True, shift=3.0), image_seq_len=seq, mu=mu,
                             call=dict(num_inference_steps=steps, sigmas=sig.tolist(), mu=mu),
                             timesteps=_np(s.timesteps).tolist(), sigmas=_np(s.sigmas).tolist()))
        s = FlowMatchEulerDiscreteScheduler(shift=1.0)  # schnell: linspace sigmas, no dynamic shift
        sig = np.linspace(1.0, 1 / steps, steps)
        s.set_timesteps(steps, sigmas=sig)
        rows.append(dict(config=dict(shift=1.0), call=dict(num_inference_steps=steps, sigmas=sig.tolist()),
                         timesteps=_np(s.timesteps).tolist(), sigmas=_np(s.sigmas).tolist()))
        s = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, time_shift_type="linear")
        s.set_timesteps(steps, sigmas=sig, mu=0.8)
        rows.append(dict(config=dict(shift=3.0, use_dynamic_shifting=True, time_shift_type="linear"),
                         call=dict(num_inference_steps=steps, sigmas=sig.tolist(), mu=0.8),
                         timesteps=_np(s.timesteps).tolist(), sigmas=_np(s.sigmas).tolist()))
    return rows


def t5_agreement(tok: T5TokenizerFast) -> dict:
    corpus = t5_corpus(300, 7) + [" ".join(t5_corpus(60, 8))[:3000], " ".join(t5_corpus(120, 9)), "1234567890 3.14159 2,718",
                                  "Ünïcödé àccents ñ ç ø å", "日本語のテキストと中文文本", "", "   ", "a" * 300]
    long = [t for t in corpus if len(tok(t).input_ids) > 256][:3]
    return {"tokenizer": "T5TokenizerFast", "corpus": corpus, "ids": [tok(t).input_ids for t in corpus],
            "padded": [{"text": t, "max_length": n,
                        "ids": tok(t, padding="max_length", max_length=n, truncation=True).input_ids}
                       for t in long + [corpus[0]] for n in (256, 512)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=["sd3", "flux-dev", "flux-schnell", "chroma"])
    args = ap.parse_args()
    torch.set_num_threads(2)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "flow_schedules.json").write_text(json.dumps(flow_schedule_tables()) + "\n")
    for kind in args.only:
        print(kind)
        pipe = build(kind)
        folder = OUT / f"tiny-{kind}"
        export(pipe, kind, folder)
        refs: dict[str, np.ndarray] = {"init_image": init_image()}
        cases = cases_for(kind)
        for case in cases:
            run_case(pipe, kind, case, refs)
        (folder / "refs.json").write_text(json.dumps(cases, indent=1) + "\n")
        np.savez_compressed(folder / "refs.npz", **refs)
        if kind == "flux-dev":
            (folder / "t5_corpus.json").write_text(json.dumps(t5_agreement(pipe.tokenizer_2), ensure_ascii=False) + "\n")
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        print(f"  {kind} folder size {size / 1e6:.2f} MB")


def write_refs(folder: Path, cases: list[dict], refs: dict[str, np.ndarray], report: dict | None = None) -> None:
    """A reference folder's tail: ``refs.json`` (the cases), ``refs.npz`` (the images), ``checks.json`` (the
    script's own checks, when it makes some); prints the folder's size."""
    (folder / "refs.json").write_text(json.dumps(cases, indent=1) + "\n")
    if report is not None:
        (folder / "checks.json").write_text(json.dumps(report, indent=1) + "\n")
    np.savez_compressed(folder / "refs.npz", **refs)
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    print(f"  {folder.name}: {size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
