"""References for xinsir's SDXL ControlNet Union (diffusers' ``ControlNetUnionModel``), written by diffusers.

    PYTHONPATH=scripts:core/src /work/refvenv/bin/python scripts/gen_union_refs.py   # -> tests/data/pipelines/union/

1. ``full_size_keys.json``: the tensor names and shapes of ``ControlNetUnionModel`` at xinsir/controlnet-union-sdxl-1.0's
   published config (built on the meta device: no weights), for 6 control types (the first release) and 8 (the promax
   file); the tests write sparse files of them and bind them onto sdrt's shipped graph.
2. A tiny union net on the tiny SDXL pipeline of ``tests/data/pipelines/tiny-sdxl-controlnet`` (rebuilt by
   ``gen_pipeline_refs.build("sdxl")``, the same seeded weights; checked against that folder's ``parts.npz``): the net's
   ``diffusion_pytorch_model.safetensors`` (diffusers' names), a weight-free ONNX graph of it with sdrt's union inputs
   (``sample``, ``timestep``, ``encoder_hidden_states``, ``controlnet_cond``, ``conditioning_scale``, ``text_embeds``,
   ``time_ids``, ``control_type``, ``control_type_idx``; written as make_shipped_graphs writes the shipped ones) and images of
   diffusers' ``StableDiffusionXLControlNetUnionPipeline`` (Euler, guess mode off) for two control types and two scales.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.modules["torchvision"] = None  # type: ignore[assignment]  # as gen_pipeline_refs: the venv's one does not load

import gen_controlnet_refs as C  # noqa: E402
import gen_pipeline_refs as G  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from diffusers import ControlNetUnionModel, EulerDiscreteScheduler, StableDiffusionXLControlNetUnionPipeline  # noqa: E402
from PIL import Image  # noqa: E402

OUT = G.OUT / "union"
# xinsir/controlnet-union-sdxl-1.0 config.json (the SDXL base UNet's encoder; the union's transformer at its defaults)
FULL = dict(act_fn="silu", addition_embed_type="text_time", addition_time_embed_dim=256,
            attention_head_dim=[5, 10, 20], block_out_channels=[320, 640, 1280], conditioning_channels=3,
            conditioning_embedding_out_channels=[16, 32, 96, 256], cross_attention_dim=2048,
            down_block_types=["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"], downsample_padding=1,
            flip_sin_to_cos=True, freq_shift=0, in_channels=4, layers_per_block=2, mid_block_scale_factor=1,
            norm_eps=1e-5, norm_num_groups=32, projection_class_embeddings_input_dim=2816,
            transformer_layers_per_block=[1, 2, 10], use_linear_projection=True, num_trans_channel=320,
            num_trans_head=8, num_trans_layer=1, num_proj_channel=320)
TYPES = 8
CASES = [dict(name="union/canny 1.0", mode=3, scale=1.0, seed=111), dict(name="union/canny 0.5", mode=3, scale=0.5, seed=111),
         dict(name="union/depth 1.0", mode=1, scale=1.0, seed=111)]


def full_size_keys() -> dict:
    out = {}
    for types in (6, 8):
        with torch.device("meta"):
            net = ControlNetUnionModel(**FULL, num_control_type=types)
        out[str(types)] = {k: list(v.shape) for k, v in net.state_dict().items()}
    return out


def tiny_union(unet, types: int = TYPES) -> ControlNetUnionModel:
    c = unet.config
    ch = c.block_out_channels[0]
    net = ControlNetUnionModel(
        in_channels=4, conditioning_channels=3, down_block_types=c.down_block_types, block_out_channels=c.block_out_channels,
        layers_per_block=c.layers_per_block, cross_attention_dim=c.cross_attention_dim,
        transformer_layers_per_block=c.transformer_layers_per_block, attention_head_dim=c.attention_head_dim,
        use_linear_projection=c.use_linear_projection, addition_embed_type="text_time",
        addition_time_embed_dim=c.addition_time_embed_dim, norm_num_groups=c.norm_num_groups,
        projection_class_embeddings_input_dim=c.projection_class_embeddings_input_dim,
        conditioning_embedding_out_channels=(8, 8, 8, 8), num_control_type=types, num_trans_channel=ch,
        num_trans_head=2, num_trans_layer=1, num_proj_channel=ch).eval()
    g = torch.Generator().manual_seed(77)
    with torch.no_grad():  # every tensor drawn (the zero convolutions and spatial_ch_projs start at zero)
        for name, p in net.named_parameters():
            gain = C.COND_GAIN if name.startswith("controlnet_cond_embedding.conv_out") else 1.0
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g) / p[0].numel() ** 0.5 * gain)
            elif name.endswith(("norm.weight", "ln_1.weight", "ln_2.weight", "norm1.weight", "norm2.weight",
                                "norm3.weight")):
                p.copy_(1 + torch.randn(p.shape, generator=g) * 0.05)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05 * gain)
    return net


def _export_graph(net, args: tuple, names: list[str], path: Path) -> None:
    """The net exported by torch's dynamo exporter with its own parameter names (its class's forward replaced, as
    scripts/make_shipped_graphs.py exports the shipped graph), written weight-free."""
    import copy

    import onnx

    m = copy.deepcopy(net)
    base = type(m)

    def forward(self, sample, timestep, encoder_hidden_states, controlnet_cond, conditioning_scale, text_embeds,
                time_ids, control_type, control_type_idx):
        down, mid = base.forward(self, sample, timestep, encoder_hidden_states, [controlnet_cond], control_type,
                                 control_type_idx, [conditioning_scale],
                                 added_cond_kwargs={"text_embeds": text_embeds, "time_ids": time_ids},
                                 return_dict=False)
        return (*down, mid)

    m.__class__ = type("Export" + base.__name__, (base,), {"forward": forward})
    x = dict(zip(names, args))
    bt = torch.export.Dim("batch", min=1, max=64)
    dyn = {k: ({0: bt} if k not in ("timestep", "conditioning_scale", "control_type_idx") else None) for k in names}
    dyn["encoder_hidden_states"] = {0: bt, 1: torch.export.Dim("text", min=1, max=77 * 8)}
    with torch.no_grad():
        outs = m(**x)
        out_names = [f"down_block_res_samples_{i}" for i in range(len(outs) - 1)] + ["mid_block_res_sample"]
        prog = torch.onnx.export(m, (), kwargs=x, dynamo=True, input_names=names, output_names=out_names,
                                 dynamic_shapes=dyn, opset_version=18, optimize=False, verbose=False)
    # written weight-free exactly as scripts/make_shipped_graphs.py writes the shipped graphs (folded with the weights
    # unknown, every initializer a typed external reference named by its parameter)
    sys.path.insert(0, str(Path(__file__).resolve().parent / "_tvblock"))
    from make_shipped_graphs import weight_free

    proto, _ = weight_free(prog, "tiny_union_controlnet", "scripts/gen_union_refs.py tiny ControlNetUnionModel")
    onnx.save_model(proto, str(path))


def run_case(pipe, net, case: dict, image: np.ndarray) -> np.ndarray:
    comps = {k: v for k, v in pipe.components.items() if k != "controlnet"}
    sched = EulerDiscreteScheduler.from_config(pipe.scheduler.config)
    p = StableDiffusionXLControlNetUnionPipeline(**{**comps, "scheduler": sched}, controlnet=net)
    p.set_progress_bar_config(disable=True)
    r = p(prompt=G.PROMPT, negative_prompt=G.NEGATIVE, control_image=[Image.fromarray(image)], control_mode=[case["mode"]],
          num_inference_steps=8, guidance_scale=7.0, height=G.SIZE, width=G.SIZE,
          generator=torch.Generator("cpu").manual_seed(case["seed"]), controlnet_conditioning_scale=case["scale"],
          output_type="np")
    return (r.images * 255).round().astype(np.uint8)


def main() -> None:
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    keys = full_size_keys()
    (OUT / "full_size_keys.json").write_text(json.dumps(keys, sort_keys=True) + "\n")
    print("full size:", {k: len(v) for k, v in keys.items()}, "task_embedding", keys["8"]["task_embedding"])

    pipe = G.build("sdxl")
    folder = G.OUT / "tiny-sdxl-controlnet"
    with np.load(folder / "parts.npz") as z:  # the rebuilt pipeline is the folder's
        feeds = {k[5:]: torch.from_numpy(z[k]) for k in z.files if k.startswith("feed/")}
        with torch.no_grad():
            plain = pipe.unet(feeds["sample"], feeds["timestep"], feeds["encoder_hidden_states"], return_dict=False,
                              added_cond_kwargs={"text_embeds": feeds["text_embeds"], "time_ids": feeds["time_ids"]})[0]
        assert plain.shape == z["unet/out_sample"].shape
    net = tiny_union(pipe.unet)
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, OUT / "diffusion_pytorch_model.safetensors")
    net.save_config(OUT)
    # the weight-free graph
    n = 2
    lat = G.SIZE // 8
    g = torch.Generator().manual_seed(5)
    args = (torch.randn(n, 4, lat, lat, generator=g), torch.tensor(500.0), torch.randn(n, 77, net.config.cross_attention_dim, generator=g),
            torch.rand(n, 3, G.SIZE, G.SIZE, generator=g), torch.tensor(0.8), torch.randn(n, feeds["text_embeds"].shape[1], generator=g),
            feeds["time_ids"][:1].repeat(n, 1), torch.zeros(n, TYPES).index_fill_(1, torch.tensor([3]), 1.0),
            torch.tensor([3]))
    names = ["sample", "timestep", "encoder_hidden_states", "controlnet_cond", "conditioning_scale", "text_embeds",
             "time_ids", "control_type", "control_type_idx"]
    with torch.no_grad():
        outs = net(args[0], args[1], args[2], [args[3]], args[7], args[8], [args[4]],
                   added_cond_kwargs={"text_embeds": args[5], "time_ids": args[6]}, return_dict=False)
        outs = (*outs[0], outs[1])
    out_names = [f"down_block_res_samples_{i}" for i in range(len(outs) - 1)] + ["mid_block_res_sample"]
    _export_graph(net, args, names, OUT / "model.onnx")
    parts = {f"feed/{k}": a.numpy() for k, a in zip(names, args)}
    parts.update({f"out/{k}": o.numpy() for k, o in zip(out_names, outs)})
    np.savez_compressed(OUT / "parts.npz", **parts)

    edges = C.control_edges()
    refs = {"edges": edges}
    for case in CASES:
        refs[case["name"]] = run_case(pipe, net, case, edges)
        print(case["name"], "std", round(float(refs[case["name"]].std()), 1))
    d = lambda a, b: int(np.abs(refs[a].astype(int) - refs[b].astype(int)).max())  # noqa: E731
    print("canny 1.0 vs 0.5:", d(CASES[0]["name"], CASES[1]["name"]), "canny vs depth:", d(CASES[0]["name"], CASES[2]["name"]))
    assert d(CASES[0]["name"], CASES[2]["name"]) > 5, "the control type does not move the image"
    (OUT / "refs.json").write_text(json.dumps(CASES, indent=1) + "\n")
    np.savez_compressed(OUT / "refs.npz", **refs)
    print("size", sum(f.stat().st_size for f in OUT.iterdir()))


def six_types() -> None:
    """3. The tiny net at 6 control types (xinsir's first release's count; the types are the promax file's first six):
    ``six/diffusion_pytorch_model.safetensors`` and ``six/parts.npz``, diffusers' residuals for ``parts.npz``'s feeds
    with a 6-wide ``control_type`` (type 5, segment: the last row), for the graph sdrt derives from the 8-type one."""
    pipe = G.build("sdxl")
    net = tiny_union(pipe.unet, 6)
    (OUT / "six").mkdir(exist_ok=True)
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, OUT / "six" / "diffusion_pytorch_model.safetensors")
    with np.load(OUT / "parts.npz") as z:
        feeds = {k[5:]: torch.from_numpy(z[k]) for k in z.files if k.startswith("feed/")}
    n = feeds["sample"].shape[0]
    kind = torch.zeros(n, 6).index_fill_(1, torch.tensor([5]), 1.0)
    with torch.no_grad():
        down, mid = net(feeds["sample"], feeds["timestep"], feeds["encoder_hidden_states"], [feeds["controlnet_cond"]],
                        kind, torch.tensor([5]), [feeds["conditioning_scale"]],
                        added_cond_kwargs={"text_embeds": feeds["text_embeds"], "time_ids": feeds["time_ids"]},
                        return_dict=False)
    outs = (*down, mid)
    names = [f"down_block_res_samples_{i}" for i in range(len(outs) - 1)] + ["mid_block_res_sample"]
    np.savez_compressed(OUT / "six" / "parts.npz", **{f"out/{k}": o.numpy() for k, o in zip(names, outs)},
                        **{"feed/control_type": kind.numpy(), "feed/control_type_idx": np.array([5])})
    print("six types:", {k: tuple(o.shape) for k, o in zip(names, outs)})


if __name__ == "__main__":
    six_types() if sys.argv[1:] == ["six"] else main()
