"""Train sdrt's embedded demo model: a tiny SD 1.x text-to-image latent diffusion model.

    /path/to/torch-venv/bin/python scripts/demo_model/train.py all > build/demo-train.log 2>&1

Stages (each reads the previous one's files from --work, default build/demo-model/):
  tokenizer  CLIP's BPE vocabulary cut down to the merges the captions need (writes tokenizer/)
  vae        AutoencoderKL 64x64 px -> 4x8x8 latents, on freshly rendered scenes
  latents    a fixed set of rendered scenes encoded once (so the UNet never runs the VAE)
  unet       UNet2DConditionModel + CLIPTextModel trained together from scratch (eps prediction, SD 1.x
             schedule, 10% caption dropout for classifier-free guidance, shape cells weighted, EMA weights)
  unet2      phase 2 from unet's weights, each sample's loss also weighted by 1/SNR clipped to [1, 20]:
             this is where the model learns positions (see docs/demo-model.md)
  unet3      phase 3: phase 2 again from its own weights
  export     ONNX (opset 17) in Optimum's layout -> core/src/sdrt/data/demo-sd/
  eval       diffusers' own StableDiffusionPipeline on the held-out captions, measured like tests/demo
  all        every stage in order

Deterministic: every random draw comes from a seeded generator, torch runs deterministic algorithms on
a fixed thread count (1). Only torch/diffusers/transformers versions can change the result.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import logging
import re
import sys
import time
from pathlib import Path

sys.modules.setdefault("torchvision", None)  # type: ignore[arg-type]  # not needed; a mismatched build breaks imports

import numpy as np  # noqa: E402
import torch  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "demo"))
import spec  # noqa: E402

log = logging.getLogger("demo-train")
OUT = ROOT / "core" / "src" / "sdrt" / "data" / "demo-sd"
HELDOUT_JSON = ROOT / "tests" / "demo" / "heldout.json"
SEED = 15
THREADS = 1  # one thread: on a shared, loaded 2-core machine two threads ran 8x slower (measured)
MAX_LEN = 77
HIDDEN = 32  # text encoder width = UNet cross-attention dim

SCHEDULER = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", num_train_timesteps=1000,
                 set_alpha_to_one=False, skip_prk_steps=True, steps_offset=1, clip_sample=False,
                 prediction_type="epsilon")
SCALING = 0.18215  # SD 1.x's VAE scaling factor: the latents are rescaled to match it


# ---------------------------------------------------------------- tokenizer: a subset of CLIP's vocabulary
def _bytes_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def _bpe_merges_used(word: str, ranks: dict[tuple[str, str], int]) -> list[tuple[str, str]]:
    """The merges CLIP's BPE applies to one pre-token (same loop as the reference implementation)."""
    parts = list(word[:-1]) + [word[-1] + "</w>"]
    used = []
    while len(parts) > 1:
        pairs = {(parts[i], parts[i + 1]) for i in range(len(parts) - 1)}
        best = min(pairs, key=lambda p: ranks.get(p, float("inf")))
        if best not in ranks:
            break
        used.append(best)
        merged, i = [], 0
        while i < len(parts):
            if i < len(parts) - 1 and (parts[i], parts[i + 1]) == best:
                merged.append(parts[i] + parts[i + 1])
                i += 2
            else:
                merged.append(parts[i])
                i += 1
        parts = merged
    return used


def build_tokenizer(out: Path) -> None:
    """vocab.json/merges.txt: CLIP's 512 byte tokens, the merges the caption words need, in CLIP's order."""
    import importlib.util

    origin = importlib.util.find_spec("open_clip").origin  # the file open_clip_torch ships; no import needed
    bpe = Path(origin).parent / "bpe_simple_vocab_16e6.txt.gz"
    lines = gzip.open(bpe).read().decode("utf-8").split("\n")[1 : 49152 - 256 - 2 + 1]
    merges = [tuple(m.split()) for m in lines]
    ranks = {m: i for i, m in enumerate(merges)}
    needed: set[tuple[str, str]] = set()
    for w in spec.CAPTION_WORDS:
        needed.update(_bpe_merges_used(w, ranks))
    kept = [m for m in merges if m in needed]
    base = list(_bytes_to_unicode().values())
    vocab = base + [b + "</w>" for b in base] + ["".join(m) for m in kept] + ["<|startoftext|>", "<|endoftext|>"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}, ensure_ascii=False) + "\n")
    (out / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in kept))
    special = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
               "unk_token": "<|endoftext|>"}
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    config = dict(special, add_prefix_space=False, do_lower_case=True, errors="replace", model_max_length=MAX_LEN,
                  tokenizer_class="CLIPTokenizer", clean_up_tokenization_spaces=True)
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    # check against the full vocabulary: every caption word must give the same pieces
    from transformers import CLIPTokenizer

    tok = CLIPTokenizer.from_pretrained(out)
    for w in spec.CAPTION_WORDS:
        pieces = tok.tokenize(w)
        full = _full_pieces(w, ranks)
        assert pieces == full, (w, pieces, full)
    log.info("tokenizer: %d tokens (%d merges) for %d caption words", len(vocab), len(kept), len(spec.CAPTION_WORDS))


def _full_pieces(word: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    parts = list(word[:-1]) + [word[-1] + "</w>"]
    for a, b in _bpe_merges_used(word, ranks):
        merged, i = [], 0
        while i < len(parts):
            if i < len(parts) - 1 and (parts[i], parts[i + 1]) == (a, b):
                merged.append(a + b)
                i += 2
            else:
                merged.append(parts[i])
                i += 1
        parts = merged
    return parts


# ---------------------------------------------------------------- models
#: GroupNorm epsilon of the VAE. With SD's 1e-6 every GroupNorm divides flat colour fields by their own
#: spread, and this narrow VAE (8-32 channels) needed far more steps than we have to learn colours back;
#: at 100 a GroupNorm on O(1) features is a mean subtraction and a fixed scale, so colour passes through.
VAE_NORM_EPS = 100.0


def set_vae_eps(vae):
    """diffusers' configs do not carry GroupNorm eps: set it after every construction or load."""
    for m in vae.modules():
        if isinstance(m, torch.nn.GroupNorm):
            m.eps = VAE_NORM_EPS
    return vae


def make_vae():
    from diffusers import AutoencoderKL

    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 16, 32, 32),
                        layers_per_block=1, down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4, norm_num_groups=2, sample_size=spec.SIZE,
                        scaling_factor=SCALING)
    return set_vae_eps(vae)


def load_vae(path: Path):
    from diffusers import AutoencoderKL

    return set_vae_eps(AutoencoderKL.from_pretrained(path)).eval()


@torch.no_grad()
def init_vae_as_pooling(vae) -> None:
    """Start the VAE as "latent = 8x8 mean colour, image = nearest upsampling of it".

    Every residual branch and the attention output start at zero (the blocks are identities), the
    shortcuts and the resampling convolutions carry channels 0-2 (RGB) and channel 3 (a constant 1),
    and the output convolutions read RGB back as (channel - constant channel), which the group mean
    subtraction of the last GroupNorm leaves intact. Training then only has to learn the detail.
    """
    def eye(conv, n: int, tap: tuple[int, int] | None = None, value: float = 1.0) -> None:
        conv.weight.zero_()
        if conv.bias is not None:
            conv.bias.zero_()
        k = conv.weight.shape[-1]
        y, x = tap if tap is not None else (k // 2, k // 2)
        for c in range(n):
            conv.weight[c, c, y, x] = value

    def blocks(module) -> None:
        for m in module.modules():
            if m.__class__.__name__ == "ResnetBlock2D":
                m.conv2.weight.zero_()
                m.conv2.bias.zero_()
                if m.conv_shortcut is not None:
                    eye(m.conv_shortcut, 4)
            if m.__class__.__name__ == "Attention":
                m.to_out[0].weight.zero_()
                m.to_out[0].bias.zero_()

    def read_rgb(norm, conv, rows: list[int]) -> None:
        """conv(SiLU(norm(x))): output rows[i] = x_i - x_3 + 1 (= colour i), other outputs 0."""
        norm.weight.fill_(1.0)
        norm.bias.fill_(4.0)  # SiLU is almost linear around 4 (slope 1.053)
        conv.weight.zero_()
        conv.bias.zero_()
        k = conv.weight.shape[-1] // 2
        scale = (1.0 + VAE_NORM_EPS) ** 0.5 / 1.053
        for i, r in enumerate(rows):
            conv.weight[r, i, k, k] = scale
            conv.weight[r, 3, k, k] = -scale
            conv.bias[r] = 1.0

    enc, dec = vae.encoder, vae.decoder
    eye(enc.conv_in, 3)
    enc.conv_in.bias[3] = 1.0
    blocks(enc)
    for block in enc.down_blocks:
        for down in block.downsamplers or []:
            down.conv.weight.zero_()
            down.conv.bias.zero_()
            for c in range(4):
                down.conv.weight[c, c, :2, :2] = 0.25  # mean of the 2x2 block (the pad is right/bottom)
    read_rgb(enc.conv_norm_out, enc.conv_out, [0, 1, 2])
    c = vae.config.latent_channels
    enc.conv_out.bias[c:] = -8.0  # narrow posterior: std ~0.02
    eye(vae.quant_conv, 2 * c)
    eye(vae.post_quant_conv, c)
    eye(dec.conv_in, 3)
    dec.conv_in.bias[3] = 1.0
    blocks(dec)
    for block in dec.up_blocks:
        for up in block.upsamplers or []:
            eye(up.conv, 4)
    read_rgb(dec.conv_norm_out, dec.conv_out, [0, 1, 2])


def make_unet():
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(
        sample_size=spec.SIZE // 8, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(16, 32, 64),
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=HIDDEN, attention_head_dim=2, norm_num_groups=4,
    )


def make_text_encoder(tok):
    from transformers import CLIPTextConfig, CLIPTextModel

    config = CLIPTextConfig(vocab_size=len(tok), hidden_size=HIDDEN, intermediate_size=4 * HIDDEN,
                            num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=MAX_LEN,
                            hidden_act="quick_gelu", projection_dim=HIDDEN, bos_token_id=tok.bos_token_id,
                            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return CLIPTextModel(config)


def load_tokenizer(work: Path):
    from transformers import CLIPTokenizer

    return CLIPTokenizer.from_pretrained(work / "tokenizer")


def to_tensor(images: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(images).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)


# ---------------------------------------------------------------- stages
def train_vae(work: Path, steps: int, batch: int) -> None:
    torch.manual_seed(SEED)
    vae = make_vae()
    init_vae_as_pooling(vae)
    train, _ = spec.split_scenes()
    opt = torch.optim.AdamW(vae.parameters(), lr=1e-4, weight_decay=0.0)
    t0 = time.time()
    avg = 0.0
    for step in range(steps):
        rng = np.random.default_rng([SEED, 1, step])
        picks = rng.choice(len(train), batch)
        x = to_tensor(np.stack([spec.random_render(train[i], rng)[0] for i in picks]))
        post = vae.encode(x).latent_dist
        rec = vae.decode(post.sample()).sample
        kl = post.kl().mean() / x[0].numel()
        # shape pixels (far from the image's median colour) weigh 5x: they are ~10% of the pixels
        bg = x.flatten(2).median(dim=2).values[:, :, None, None]
        weight = 1.0 + 4.0 * ((x - bg).abs().amax(dim=1, keepdim=True) > 0.1).float()
        err = rec - x
        # latent channels 0-2 pulled towards the 8x8 mean colour: a colour-like latent space from the start
        colour = (post.mean[:, :3] - torch.nn.functional.avg_pool2d(x, 8)).pow(2).mean()
        loss = (weight * (err.abs() + err.pow(2))).mean() + 0.1 * colour + 1e-4 * kl
        lr = 1e-4 * min(1.0, (step + 1) / 50) * (0.1 if step >= 0.8 * steps else 1.0)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        avg = err.abs().mean().item() if step == 0 else 0.98 * avg + 0.02 * err.abs().mean().item()
        if step % 100 == 0 or step == steps - 1:
            log.info("vae step %d/%d loss %.4f mean |error| %.4f colour %.4f (%.1f s)", step, steps, loss.item(), avg,
                     colour.item(), time.time() - t0)
    vae.eval()
    _normalise_latents(vae)
    vae.save_pretrained(work / "vae")


@torch.no_grad()
def _normalise_latents(vae) -> None:
    """Fold a per-channel affine map into quant_conv / post_quant_conv so that latents * 0.18215 ~ N(0, 1)."""
    train, _ = spec.split_scenes()
    rng = np.random.default_rng([SEED, 2])
    x = to_tensor(np.stack([spec.random_render(train[i], rng)[0] for i in rng.choice(len(train), 256)]))
    mean = vae.encode(x).latent_dist.mean  # [n, 4, 8, 8]
    mu = mean.mean(dim=(0, 2, 3))
    sd = mean.std(dim=(0, 2, 3))
    k = (1.0 / SCALING) / sd  # new = (old - mu) * k
    q, pq = vae.quant_conv, vae.post_quant_conv
    c = mu.numel()
    q.weight[:c] *= k[:, None, None, None]
    q.bias[:c] = (q.bias[:c] - mu) * k
    q.bias[c:] += 2 * torch.log(k)  # log-variance follows the scale
    # post_quant_conv(old) = W old + b = W (new / k + mu) + b
    pq.bias += (pq.weight[:, :, 0, 0] * mu[None, :]).sum(dim=1)
    pq.weight /= k[None, :, None, None]
    check = vae.encode(x).latent_dist.mean * SCALING
    log.info("latents normalised: mean %s std %s (after x %.5f)", check.mean(dim=(0, 2, 3)).numpy().round(3),
             check.std(dim=(0, 2, 3)).numpy().round(3), SCALING)


@torch.no_grad()
def encode_latents(work: Path, count: int) -> None:
    vae = load_vae(work / "vae")
    train, _ = spec.split_scenes()
    rng = np.random.default_rng([SEED, 3])
    order = np.concatenate([rng.permutation(len(train)) for _ in range(count // len(train) + 1)])[:count]
    latents, scenes, sizes = [], [], []
    for start in range(0, count, 64):
        idx = order[start : start + 64]
        imgs, szs = zip(*(spec.random_render(train[i], rng) for i in idx))
        latents.append(vae.encode(to_tensor(np.stack(imgs))).latent_dist.mean * SCALING)
        scenes.extend(int(i) for i in idx)
        sizes.extend(szs)
        if start % 1024 == 0:
            log.info("latents %d/%d", start, count)
    torch.save({"latents": torch.cat(latents), "scenes": scenes, "sizes": sizes}, work / "latents.pt")


#: share of training timesteps drawn from the noisier half [500, 1000): the layout (where the shape goes) is
#: decided there, and eps prediction gives it little loss (the x0 error is scaled by sqrt(abar / (1 - abar)))
HIGH_T_SHARE = 0.5
#: weight of the loss on the latent cells of the shape (cells far from the image's median latent)
SHAPE_WEIGHT = 5.0


def _timesteps(batch: int, gen: torch.Generator) -> torch.Tensor:
    uniform = torch.randint(0, 1000, (batch,), generator=gen)
    high = torch.randint(500, 1000, (batch,), generator=gen)
    pick = torch.rand(batch, generator=gen) < HIGH_T_SHARE
    return torch.where(pick, high, uniform)


#: phase 2's cap on the noise weighting: a sample's eps loss is weighted by 1 / SNR = (1 - abar) / abar, clipped
#: to [1, NOISY_WEIGHT], which makes it an x0 (image) loss where the noise dominates
NOISY_WEIGHT = 20.0


def train_unet(work: Path, steps: int, batch: int, lr: float, phase: int = 1, check_every: int = 1000) -> None:
    """UNet + text encoder: eps prediction on SD 1.x's schedule, shape cells weighted, EMA weights.

    Phase 1 starts from scratch at a constant rate (after 100 warm-up steps) and learns backgrounds and colours.
    It does not learn positions: an eps loss hardly counts where the shape is drawn at the noise levels where
    that is decided, because the error of the image estimate is scaled by the signal-to-noise ratio
    (abar / (1 - abar), 0.04 at t = 800). Phases 2 and 3 start from the previous phase's EMA weights (fresh
    optimizer, new draws, EMA 0.995) and weight each sample by 1 / SNR clipped to [1, NOISY_WEIGHT], the rate
    falling linearly to a fifth over the last 40% of the steps. Every ``check_every`` steps the EMA weights draw the held-out captions
    (DDIM, 10 steps) and the log says how many have the right colours and the right cell; EMA weights are saved
    every 500 steps, so a stopped run leaves a usable model.
    """
    torch.manual_seed(SEED + phase - 1)
    tok = load_tokenizer(work)
    if phase == 1:
        unet, text = make_unet(), make_text_encoder(tok)
    else:
        from diffusers import UNet2DConditionModel
        from transformers import CLIPTextModel

        unet = UNet2DConditionModel.from_pretrained(work / "unet").train()
        text = CLIPTextModel.from_pretrained(work / "text_encoder").train()
    data = torch.load(work / "latents.pt")
    latents, scene_ids, sizes = data["latents"], data["scenes"], data["sizes"]
    train, _ = spec.split_scenes()
    sched = _ddpm().from_config(SCHEDULER)
    abar = sched.alphas_cumprod
    params = list(unet.parameters()) + list(text.parameters())
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=1e-2)
    ema = [copy.deepcopy(unet).eval(), copy.deepcopy(text).eval()]
    for m in ema:
        m.requires_grad_(False)
    cache: dict[str, list[int]] = {}

    def ids_of(caption: str) -> list[int]:
        if caption not in cache:
            cache[caption] = tok(caption, padding="max_length", max_length=MAX_LEN, truncation=True).input_ids
        return cache[caption]

    vae = load_vae(work / "vae")
    gen = torch.Generator().manual_seed(SEED + phase - 1)
    t0 = time.time()
    avg = None
    for step in range(steps):
        rng = np.random.default_rng([SEED, 4, step] if phase == 1 else [SEED, 4, phase, step])
        picks = rng.choice(len(latents), batch)
        caps = [spec.random_caption(train[scene_ids[i]], sizes[i], rng) for i in picks]
        caps = ["" if rng.random() < 0.1 else c for c in caps]
        ids = torch.tensor([ids_of(c) for c in caps])
        x0 = latents[torch.from_numpy(picks)]
        t = _timesteps(batch, gen)
        noise = torch.randn(x0.shape, generator=gen)
        a = abar[t].view(-1, 1, 1, 1)
        xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
        pred = unet(xt, t, text(ids)[0]).sample
        med = x0.flatten(2).median(dim=2).values[:, :, None, None]
        shape = ((x0 - med)[:, :3].abs().amax(dim=1, keepdim=True) > 0.5).float()
        weight = 1.0 + (SHAPE_WEIGHT - 1.0) * shape
        if phase > 1:
            weight = weight * ((1 - a) / a).clamp(1.0, NOISY_WEIGHT)
        loss = (weight * (pred - noise).pow(2)).mean()
        cur = lr * min(1.0, (step + 1) / 100)
        if phase > 1:
            cur *= min(1.0, 1.0 - 0.8 * (step - 0.6 * steps) / (0.4 * steps))
        for g in opt.param_groups:
            g["lr"] = cur
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        decay = min(0.998 if phase == 1 else 0.995, (1 + step) / (10 + step))
        with torch.no_grad():
            for m, src in zip(ema, (unet, text)):
                for pe, p in zip(m.parameters(), src.parameters()):
                    pe.lerp_(p, 1 - decay)
        avg = loss.item() if avg is None else 0.98 * avg + 0.02 * loss.item()
        if step % 100 == 0 or step == steps - 1:
            log.info("unet phase %d step %d/%d loss %.4f avg %.4f lr %.2e (%.0f s)", phase, step, steps, loss.item(), avg, cur,
                     time.time() - t0)
        if (step + 1) % 500 == 0 or step == steps - 1:
            ema[0].save_pretrained(work / "unet")
            ema[1].save_pretrained(work / "text_encoder")
            (work / "unet" / "step.txt").write_text(f"phase {phase} step {step + 1} of {steps}\n")
            log.info("saved EMA weights at step %d", step + 1)
        if (step + 1) % check_every == 0 or step == steps - 1:
            colour, both = quick_check(ema[0], ema[1], vae, tok, abar)
            log.info("check at step %d: held-out colours %d/40, colours and cell %d/40", step + 1, colour, both)


def _ddpm():
    from diffusers import DDPMScheduler

    return DDPMScheduler


@torch.no_grad()
def quick_check(unet, text, vae, tok, abar: torch.Tensor, steps: int = 10, cfg: float = 7.0) -> tuple[int, int]:
    """(colours right, colours and cell right) of the 40 held-out captions, DDIM without noise, seeds fixed."""
    from demo_measure import check_image

    heldout = json.loads(HELDOUT_JSON.read_text())
    cases = heldout["cases"]
    n = len(cases)
    ids = torch.tensor([tok(c["prompt"], padding="max_length", max_length=MAX_LEN).input_ids for c in cases]
                       + [tok("", padding="max_length", max_length=MAX_LEN).input_ids] * n)
    emb = text(ids)[0]
    x = torch.randn((n, 4, spec.SIZE // 8, spec.SIZE // 8), generator=torch.Generator().manual_seed(0))
    ts = torch.linspace(999, 0, steps).round().long()
    for i, t in enumerate(ts):
        out = unet(torch.cat([x, x]), t.repeat(2 * n), emb).sample
        eps = out[n:] + cfg * (out[:n] - out[n:])
        a = abar[t]
        prev = abar[ts[i + 1]] if i + 1 < steps else torch.tensor(1.0)
        x0 = (x - (1 - a).sqrt() * eps) / a.sqrt()
        x = prev.sqrt() * x0 + (1 - prev).sqrt() * eps
    img = vae.decode(x / SCALING).sample.permute(0, 2, 3, 1)
    img = ((img + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).numpy()
    colour = sum(not check_image(im, c, heldout, position=False) for im, c in zip(img, cases))
    both = sum(not check_image(im, c, heldout) for im, c in zip(img, cases))
    return colour, both


def load_pipeline(work: Path):
    from diffusers import PNDMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel

    pipe = StableDiffusionPipeline(
        vae=load_vae(work / "vae"),
        text_encoder=CLIPTextModel.from_pretrained(work / "text_encoder").eval(),
        tokenizer=load_tokenizer(work),
        unet=UNet2DConditionModel.from_pretrained(work / "unet").eval(),
        scheduler=PNDMScheduler.from_config(SCHEDULER),
        safety_checker=None, feature_extractor=None, requires_safety_checker=False,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


#: odd text for the tokenizer agreement check: words outside the subset fall back to smaller pieces
TOKENIZER_PROBES = ["a red circle on blue", "A RED Circle, on a Blue background!!", "a teal hexagon on magenta",
                    "   stripes\ton   a white background , bottom right ", "an orange star (on) [black], 12 o'clock",
                    "une étoile rouge 🌟 sur fond bleu", "purple" * 30]


def write_heldout(work: Path) -> None:
    """tests/demo/heldout.json: the held-out captions, their expected colours and cells, the palette, and the
    token ids transformers' CLIPTokenizer gives on the shipped vocabulary (the agreement check)."""
    _, held = spec.split_scenes()
    tok = load_tokenizer(work)
    probes = [s.caption() for s in held] + TOKENIZER_PROBES
    data = {
        "token_ids": {p: tok(p, padding="max_length", max_length=MAX_LEN, truncation=True).input_ids
                      for p in probes},
        "palette": {k: list(v) for k, v in spec.COLOURS.items()},
        "cells": {k: list(v) for k, v in spec.POSITIONS.items()},
        "cases": [{"prompt": s.caption(), "colour": s.colour, "shape": s.shape, "background": s.background,
                   "position": s.position} for s in held],
    }
    text = json.dumps(data, indent=1)
    text = re.sub(r"\[\s+([^\[\]]*?)\s+\]", lambda m: "[" + re.sub(r"\s+", " ", m.group(1)) + "]", text)
    HELDOUT_JSON.write_text(text + "\n")


@torch.no_grad()
def evaluate(work: Path, steps: int, cfg: float, samplers: list[str]) -> None:
    from demo_measure import check_image
    from diffusers import (
        DDIMScheduler,
        DPMSolverMultistepScheduler,
        EulerAncestralDiscreteScheduler,
        EulerDiscreteScheduler,
    )

    heldout = json.loads(HELDOUT_JSON.read_text())
    pipe = load_pipeline(work)
    makers = {
        "Euler": lambda c: EulerDiscreteScheduler.from_config(c),
        "Euler a": lambda c: EulerAncestralDiscreteScheduler.from_config(c),
        "DPM++ 2M Karras": lambda c: DPMSolverMultistepScheduler.from_config(c, use_karras_sigmas=True),
        "DDIM": lambda c: DDIMScheduler.from_config(c),
    }
    prompts = [c["prompt"] for c in heldout["cases"]]
    for name in samplers:
        pipe.scheduler = makers[name](SCHEDULER)
        gens = [torch.Generator("cpu").manual_seed(i) for i in range(len(prompts))]
        images = pipe(prompts, height=spec.SIZE, width=spec.SIZE, num_inference_steps=steps, guidance_scale=cfg,
                      generator=gens, output_type="np").images
        images = np.clip(np.rint(images * 255), 0, 255).astype(np.uint8)
        fails = [(c["prompt"], why) for c, img in zip(heldout["cases"], images)
                 if (why := check_image(img, c, heldout))]
        log.info("diffusers %s, %d steps, cfg %.1f: %d/%d pass", name, steps, cfg, len(prompts) - len(fails),
                 len(prompts))
        for p, why in fails:
            log.info("  FAIL %s: %s", p, why)
        np.save(work / f"eval-{name.replace(' ', '_')}.npy", images)


# ---------------------------------------------------------------- export
class _Text(torch.nn.Module):
    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        out = self.model(input_ids=input_ids, output_hidden_states=True)
        return (out.last_hidden_state, out.pooler_output, *out.hidden_states)


class _Unet(torch.nn.Module):
    def __init__(self, unet) -> None:
        super().__init__()
        self.unet = unet

    def forward(self, sample, timestep, encoder_hidden_states):
        return self.unet(sample, timestep, encoder_hidden_states, return_dict=False)[0]


class _VaeEncoder(torch.nn.Module):
    def __init__(self, vae) -> None:
        super().__init__()
        self.vae = vae

    def forward(self, sample):
        return self.vae.encode(sample).latent_dist.parameters


class _VaeDecoder(torch.nn.Module):
    def __init__(self, vae) -> None:
        super().__init__()
        self.vae = vae

    def forward(self, latent_sample):
        return self.vae.decode(latent_sample, return_dict=False)[0]


def _onnx(module, args, path: Path, inputs: list[str], outputs: list[str]) -> None:
    import onnx

    path.parent.mkdir(parents=True, exist_ok=True)
    dynamic = {n: {0: "batch"} for n in inputs + outputs}
    with torch.no_grad():
        torch.onnx.export(module, args, str(path), input_names=inputs, output_names=outputs, dynamic_axes=dynamic,
                          opset_version=17, dynamo=False, do_constant_folding=True)
    model = onnx.load(str(path))
    model.producer_name = "sdrt-demo"
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def export(work: Path, out: Path = OUT) -> None:
    import shutil

    pipe = load_pipeline(work)
    if out.exists():
        shutil.rmtree(out)
    tmp = work / "_saved"
    if tmp.exists():
        shutil.rmtree(tmp)
    pipe.save_pretrained(tmp, safe_serialization=True)
    out.mkdir(parents=True)
    shutil.copytree(tmp / "scheduler", out / "scheduler")
    shutil.copytree(work / "tokenizer", out / "tokenizer")
    layers = pipe.text_encoder.config.num_hidden_layers
    hidden = [f"hidden_states.{i}" for i in range(layers + 1)]
    _onnx(_Text(pipe.text_encoder), (torch.zeros((1, MAX_LEN), dtype=torch.int32),), out / "text_encoder" /
          "model.onnx", ["input_ids"], ["last_hidden_state", "pooler_output", *hidden])
    lat = spec.SIZE // 8
    _onnx(_Unet(pipe.unet), (torch.randn(2, 4, lat, lat), torch.tensor([999, 999]), torch.randn(2, MAX_LEN, HIDDEN)),
          out / "unet" / "model.onnx", ["sample", "timestep", "encoder_hidden_states"], ["out_sample"])
    _onnx(_VaeEncoder(pipe.vae), (torch.randn(1, 3, spec.SIZE, spec.SIZE),), out / "vae_encoder" / "model.onnx",
          ["sample"], ["latent_parameters"])
    _onnx(_VaeDecoder(pipe.vae), (torch.randn(1, 4, lat, lat),), out / "vae_decoder" / "model.onnx",
          ["latent_sample"], ["sample"])
    for part, src in (("text_encoder", "text_encoder"), ("unet", "unet"), ("vae_encoder", "vae"),
                      ("vae_decoder", "vae")):
        config = json.loads((tmp / src / "config.json").read_text())
        config.pop("_name_or_path", None)  # the trainer's local path: nothing a user needs
        (out / part / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    index = json.loads((tmp / "model_index.json").read_text())
    for k in ("vae", "safety_checker", "feature_extractor", "image_encoder"):
        index.pop(k, None)
    index["_class_name"] = "ORT" + index["_class_name"]
    index["vae_encoder"] = ["optimum", "ORTModel"]
    index["vae_decoder"] = ["optimum", "ORTModel"]
    (out / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
    shutil.rmtree(tmp)
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    log.info("exported %s: %.2f MB", out, total / 1e6)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", choices=["tokenizer", "vae", "latents", "unet", "unet2", "unet3", "export", "eval", "all"])
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "demo-model")
    ap.add_argument("--vae-steps", type=int, default=600)
    ap.add_argument("--vae-batch", type=int, default=4)
    ap.add_argument("--latents", type=int, default=16000)
    ap.add_argument("--unet-steps", type=int, default=2500, help="phase 1 steps")
    ap.add_argument("--unet2-steps", type=int, default=2000, help="phase 2 (noise-weighted) steps")
    ap.add_argument("--unet3-steps", type=int, default=1000, help="phase 3 (as phase 2, from its weights) steps")
    ap.add_argument("--unet-batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--out", type=Path, default=OUT, help="export folder")
    ap.add_argument("--eval-steps", type=int, default=20)
    ap.add_argument("--cfg", type=float, default=7.0)
    ap.add_argument("--samplers", default="Euler,DPM++ 2M Karras,Euler a,DDIM")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)
    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    args.work.mkdir(parents=True, exist_ok=True)
    stages = ["tokenizer", "vae", "latents", "unet", "unet2", "unet3", "export", "eval"] if args.stage == "all" \
        else [args.stage]
    for stage in stages:
        t0 = time.time()
        if stage == "tokenizer":
            build_tokenizer(args.work / "tokenizer")
            write_heldout(args.work)
        elif stage == "vae":
            train_vae(args.work, args.vae_steps, args.vae_batch)
        elif stage == "latents":
            encode_latents(args.work, args.latents)
        elif stage == "unet":
            train_unet(args.work, args.unet_steps, args.unet_batch, args.lr)
        elif stage == "unet2":
            train_unet(args.work, args.unet2_steps, args.unet_batch, args.lr / 2, phase=2, check_every=500)
        elif stage == "unet3":
            train_unet(args.work, args.unet3_steps, args.unet_batch, args.lr / 2, phase=3, check_every=500)
        elif stage == "export":
            export(args.work, args.out)
        elif stage == "eval":
            evaluate(args.work, args.eval_steps, args.cfg, args.samplers.split(","))
        log.info("stage %s done in %.0f s", stage, time.time() - t0)


if __name__ == "__main__":
    main()
