"""Build real torch/diffusers ONNX exports with random weights for the ggml tests.

Run with the torch venv (never from the tests):

    /work/venv-torch/bin/python scripts/make_ggml_exports.py OUT_DIR [NAME ...]

Each model is what ``torch.onnx.export`` (opset 17, ``do_constant_folding=True``, the
TorchScript exporter) writes for the architecture, with seeded random weights. Names:

- ``vae_decoder_32`` / ``vae_decoder_64``: diffusers ``AutoencoderKL()`` (its default config)
  decoder on a 32x32 / 64x64 latent (the SD 1.5 decoder structure at small width);
- ``vae_encoder_32`` / ``vae_encoder_64``: the same VAE's encoder (mean of the latent);
- ``vae_sd15_decoder_32``: the SD 1.5 VAE block layout (4 blocks, 2 layers each) at width 32;
- ``unet_sd15`` / ``unet_sdxl``: ``UNet2DConditionModel`` with the SD 1.5 and SDXL block types,
  attention layout and conditioning (SDXL: text_time added conditioning), small widths;
- ``clip_vit_l14``: transformers ``CLIPTextModel`` with ViT-L/14's text config, fewer layers/width;
- ``openclip_bigg``: transformers ``CLIPTextModelWithProjection`` with bigG's (gelu, projection)
  config, fewer layers/width;
- ``mobilenet_v2``, ``mobilenet_v3_small``, ``resnet50``: torchvision, random weights, 64x64 input.

Writes ``NAME.onnx`` (weights inside) and ``NAME.npz`` (example inputs) per model. With
``--strip`` the float initializers of 256 elements or more keep their name, type and shape
but lose their data (``doc_string`` "sdrt-test: random"): the tests fill them with seeded
random values, so the committed graphs stay a few hundred KB (``tests/data/ggml_exports``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

OPSET = 17


def _torchvision_shim() -> None:
    """torchvision 0.28 in the torch venv fails at import (``operator torchvision::nms does not
    exist``: its C ops do not match torch 2.13) and diffusers/transformers import it. Only its
    fake-kernel registrations need the C ops; models do not, so skip that one module."""
    import types

    try:
        import torchvision  # noqa: F401
    except ModuleNotFoundError:
        return  # only the torchvision models need it
    except RuntimeError:
        for name in [m for m in sys.modules if m.startswith("torchvision")]:
            del sys.modules[name]
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
        import torchvision  # noqa: F401


_torchvision_shim()


def _export(model, args, names, outs, path: Path) -> None:
    model.eval()
    with torch.no_grad():
        torch.onnx.export(model, args, str(path), opset_version=OPSET, do_constant_folding=True,
                          input_names=names, output_names=outs, dynamo=False)


class _Decoder(torch.nn.Module):
    def __init__(self, vae):
        super().__init__()
        self.vae = vae

    def forward(self, z):
        return self.vae.decode(z).sample


class _Encoder(torch.nn.Module):
    def __init__(self, vae):
        super().__init__()
        self.vae = vae

    def forward(self, x):
        return self.vae.encode(x).latent_dist.mean


def _vae(**kw):
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    return AutoencoderKL(**kw)


def _sd15_vae():
    return _vae(block_out_channels=(32, 32, 64, 64), layers_per_block=2, norm_num_groups=32,
                down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4)


def make(name: str) -> tuple[torch.nn.Module, dict[str, np.ndarray], list[str]]:
    """The torch module of export ``name`` (seeded random weights), its example inputs, its output names."""
    rng = np.random.default_rng(0)
    feeds: dict[str, np.ndarray]
    if name.startswith("vae_decoder_") or name == "vae_sd15_decoder_32":
        side = int(name.rsplit("_", 1)[1])
        vae = _sd15_vae() if "sd15" in name else _vae()
        feeds = {"latent": rng.standard_normal((1, 4, side, side)).astype(np.float32)}
        model, outs = _Decoder(vae), ["image"]
    elif name.startswith("vae_encoder_"):
        side = int(name.rsplit("_", 1)[1])
        feeds = {"image": rng.uniform(-1, 1, (1, 3, side, side)).astype(np.float32)}
        model, outs = _Encoder(_vae()), ["latent"]
    elif name in ("unet_sd15", "unet_sdxl"):
        from diffusers import UNet2DConditionModel

        torch.manual_seed(0)
        xl = name == "unet_sdxl"
        common = dict(sample_size=16, in_channels=4, out_channels=4, layers_per_block=1, norm_num_groups=8,
                      attention_head_dim=(2, 4) if xl else 8)
        if xl:
            unet = UNet2DConditionModel(
                block_out_channels=(16, 32), down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32,
                transformer_layers_per_block=(1, 2), use_linear_projection=True, addition_embed_type="text_time",
                addition_time_embed_dim=8, projection_class_embeddings_input_dim=8 * 6 + 16, **common)
        else:
            unet = UNet2DConditionModel(
                block_out_channels=(16, 32), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32, **common)
        feeds = {"sample": rng.standard_normal((1, 4, 16, 16)).astype(np.float32),
                 "timestep": np.array([500.0], np.float32),
                 "encoder_hidden_states": rng.standard_normal((1, 7, 32)).astype(np.float32)}
        if xl:
            feeds["text_embeds"] = rng.standard_normal((1, 16)).astype(np.float32)
            feeds["time_ids"] = np.array([[32, 32, 0, 0, 32, 32]], np.float32)

            class _XL(torch.nn.Module):
                def __init__(self, u):
                    super().__init__()
                    self.u = u

                def forward(self, s, t, e, te, ti):
                    return self.u(s, t, e, added_cond_kwargs={"text_embeds": te, "time_ids": ti}).sample

            model = _XL(unet)
        else:
            class _SD(torch.nn.Module):
                def __init__(self, u):
                    super().__init__()
                    self.u = u

                def forward(self, s, t, e):
                    return self.u(s, t, e).sample

            model = _SD(unet)
        outs = ["out_sample"]
    elif name in ("clip_vit_l14", "openclip_bigg"):
        from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

        torch.manual_seed(0)
        big = name == "openclip_bigg"
        cfg = CLIPTextConfig(vocab_size=49408, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                             num_attention_heads=4, max_position_embeddings=77,
                             hidden_act="gelu" if big else "quick_gelu", projection_dim=32,
                             bos_token_id=49406, eos_token_id=49407, pad_token_id=1)
        cls = CLIPTextModelWithProjection if big else CLIPTextModel
        enc = cls(cfg)
        ids = np.full((1, 77), 49407, np.int64)
        ids[0, :6] = [49406, 320, 1125, 539, 320, 49407]
        feeds = {"input_ids": ids}

        class _Text(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, i):
                o = self.m(i, output_hidden_states=True)
                first = o.text_embeds if big else o.pooler_output
                return o.last_hidden_state, first, o.hidden_states[-2]

        model, outs = _Text(enc), ["last_hidden_state", "pooled", "penultimate"]
    elif name in ("mobilenet_v2", "mobilenet_v3_small", "resnet50"):
        import torchvision

        torch.manual_seed(0)
        model = getattr(torchvision.models, name)(weights=None)
        feeds = {"input": rng.standard_normal((1, 3, 64, 64)).astype(np.float32)}
        outs = ["logits"]
    else:
        raise SystemExit(f"unknown model {name!r}")
    return model, feeds, outs


def build(name: str, out: Path) -> None:
    model, feeds, outs = make(name)
    _export(model, tuple(torch.from_numpy(v) for v in feeds.values()), list(feeds), outs, out / f"{name}.onnx")
    np.savez(out / f"{name}.npz", **feeds)


STRIP_MIN = 256
STRIP_MARK = "sdrt-test: random"


def strip(path: Path) -> None:
    import onnx

    model = onnx.load(str(path))
    for init in model.graph.initializer:
        if init.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16) and np.prod(init.dims) >= STRIP_MIN:
            init.ClearField("raw_data")
            init.ClearField("float_data")
            init.doc_string = STRIP_MARK
    onnx.save(model, str(path))


ALL = ("vae_decoder_32", "vae_decoder_64", "vae_encoder_32", "vae_encoder_64", "vae_sd15_decoder_32", "unet_sd15",
       "unet_sdxl", "clip_vit_l14", "openclip_bigg", "mobilenet_v2", "mobilenet_v3_small", "resnet50")

if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--strip"]
    dest = Path(args[0])
    dest.mkdir(parents=True, exist_ok=True)
    for n in args[1:] or ALL:
        build(n, dest)
        if "--strip" in sys.argv:
            strip(dest / f"{n}.onnx")
        print(n, (dest / f"{n}.onnx").stat().st_size)
