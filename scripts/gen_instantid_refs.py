"""InstantID references: insightface, OpenCV and diffusers on the same files as sdrt's tests.

1. insightface's ``FaceAnalysis`` (detection + recognition, ``det_size`` 640, onnxruntime) on the antelopev2 stand-ins
   (``instantid_fixtures.antelopev2``: the buffalo_l stand-ins of ``make_face_standins.py`` under antelopev2's file
   names) and ``faceid_fixtures.face_picture()`` turned to BGR: the largest face by box area (InstantX's examples,
   sd-webui-controlnet's ``pick_largest_face``), its raw ``embedding`` and ``kps``;
2. InstantID's keypoint map of those points drawn with OpenCV (``ellipse2Poly`` + ``fillConvexPoly`` limbs to the
   nose times 0.6, ``circle`` of radius 10 per point), at the picture's size and, the points scaled, at 64x64 (the
   hint the pipeline cases read);
3. diffusers' ``StableDiffusionXLControlNetPipeline`` on tiny-sdxl with ``gen_controlnet_refs``' first ControlNet
   (the one exported as ``tiny-sdxl-controlnet/controlnet``) and ``load_ip_adapter`` of the tiny InstantID adapter
   (``instantid_fixtures``; an IP-Adapter Plus projection reading the embedding as one 512-wide token), fed
   ``ip_adapter_image_embeds`` = [zeros, embedding]; the ControlNet's ``encoder_hidden_states`` replaced by the
   projected face tokens of each CFG row (``[uncond, cond]``), as the community InstantID pipeline
   (``controlnet(..., encoder_hidden_states=prompt_image_emb)``) feeds it;
4. once: full-size files, their key names and shapes: InstantX's ``ip-adapter.bin`` (a torch pickle of nested dicts
   ``image_proj`` / ``ip_adapter``, InstantID's Resampler 1280 wide, 20 heads, 16 queries, 2048 out; 70 SDXL
   layers), its tensors zero-strided views of one value so the file stays small, and the ControlNet's
   ``diffusion_pytorch_model.safetensors`` (InstantID's config, a header whose data is a sparse hole): opened by sdrt.

    PYTHONPATH=scripts:core/src:tests/pipelines /work/refvenv/bin/python scripts/gen_instantid_refs.py
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path

sys.modules["torchvision"] = None  # type: ignore[assignment]

import faceid_fixtures as ff  # noqa: E402
import gen_controlnet_refs as gc  # noqa: E402
import gen_pipeline_refs as gp  # noqa: E402
import instantid_fixtures as fx  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

OUT = fx.FACES
CASES = [
    dict(name="instantid/ip0.8/cn1.0", prompt="a photo of a person", negative_prompt="blurry", steps=3, cfg=5.0,
         seed=71, scale=0.8, cn_scale=1.0, sampler="Euler"),
    dict(name="instantid/ip0.5/cn0.7", prompt="a portrait", negative_prompt="", steps=3, cfg=6.0, seed=72, scale=0.5,
         cn_scale=0.7, sampler="Euler"),
]


def draw_kps_cv2(h: int, w: int, kps: np.ndarray) -> np.ndarray:
    """InstantID's keypoint map, with OpenCV's primitives (RGB order: the colours as InstantID lists them)."""
    import cv2

    colors = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (255, 0, 255)]
    canvas = np.zeros((h, w, 3))
    for a, b in ((0, 2), (1, 2), (3, 2), (4, 2)):
        xs, ys = kps[[a, b], 0], kps[[a, b], 1]
        half = math.hypot(xs[0] - xs[1], ys[0] - ys[1]) / 2
        angle = math.degrees(math.atan2(ys[0] - ys[1], xs[0] - xs[1]))
        poly = cv2.ellipse2Poly((int(np.mean(xs)), int(np.mean(ys))), (int(half), 4), int(angle), 0, 360, 1)
        canvas = cv2.fillConvexPoly(canvas.copy(), poly, colors[a])
    canvas = (canvas * 0.6).astype(np.uint8)
    for (x, y), color in zip(kps, colors):
        canvas = cv2.circle(canvas.copy(), (int(x), int(y)), 10, color, -1)
    return canvas.astype(np.uint8)


def insightface_refs(refs: dict, tmp: Path) -> None:
    from insightface.app import FaceAnalysis

    folder = fx.antelopev2(tmp)
    app = FaceAnalysis(name=str(folder), allowed_modules=["detection", "recognition"],
                       providers=["CPUExecutionProvider"])
    app.prepare(ctx_id=-1, det_size=(640, 640))
    rgb = ff.face_picture()
    faces = app.get(np.ascontiguousarray(rgb[..., ::-1]))
    face = sorted(faces, key=lambda f: (f["bbox"][2] - f["bbox"][0]) * (f["bbox"][3] - f["bbox"][1]))[-1]
    best = int(np.argmax([f.det_score for f in faces]))
    print("faces", len(faces), "largest is", faces.index(face), "best score is", best)
    refs["embedding"] = np.asarray(face["embedding"], np.float32)
    refs["kps"] = np.asarray(face["kps"], np.float32)
    print("raw embedding norm", float(np.linalg.norm(refs["embedding"])))
    h, w = rgb.shape[:2]
    refs["kps_map"] = draw_kps_cv2(h, w, refs["kps"])
    refs["hint64"] = draw_kps_cv2(64, 64, refs["kps"] * np.array([64 / w, 64 / h], np.float32))


def diffusers_refs(refs: dict, tmp: Path) -> str:
    from diffusers import StableDiffusionXLControlNetPipeline
    from PIL import Image

    path, digest = fx.write(tmp)
    base = gp.build("sdxl")
    net = gc.make_controlnet(base.unet, 40)
    pipe = StableDiffusionXLControlNetPipeline(**base.components, controlnet=net)
    pipe.set_progress_bar_config(disable=True)
    pipe.register_modules(feature_extractor=None, image_encoder=None)
    pipe.load_ip_adapter(str(tmp), subfolder="", weight_name=path.name, image_encoder_folder=None)
    proj = pipe.unet.encoder_hid_proj.image_projection_layers[0]
    emb = torch.from_numpy(refs["embedding"]).reshape(1, 1, 1, 512)
    id_embeds = torch.cat([torch.zeros_like(emb), emb])  # [uncond, cond]
    with torch.no_grad():
        tokens = proj(id_embeds[:, 0]).to(torch.float32)  # [2, 16, 64]
    refs["tokens"] = tokens.numpy()
    forward = net.forward

    def with_face_tokens(sample, timestep, encoder_hidden_states, *args, **kw):
        rows = sample.shape[0]
        assert rows == 2, rows  # CFG's [uncond, cond] rows, one image
        return forward(sample, timestep, tokens.to(encoder_hidden_states.dtype), *args, **kw)

    hint = Image.fromarray(refs["hint64"])
    for case in CASES:
        pipe.set_ip_adapter_scale(case["scale"])
        sched = gp.SCHEDULERS[case["sampler"]](pipe.scheduler.config)
        p = type(pipe)(**{**pipe.components, "scheduler": sched})
        p.set_progress_bar_config(disable=True)

        def run(face: bool, p=p, case=case) -> np.ndarray:
            net.forward = with_face_tokens if face else forward
            try:
                out = p(prompt=case["prompt"], negative_prompt=case["negative_prompt"] or None, image=hint,
                        ip_adapter_image_embeds=[id_embeds], controlnet_conditioning_scale=case["cn_scale"],
                        num_inference_steps=case["steps"], guidance_scale=case["cfg"], height=64, width=64,
                        generator=torch.Generator("cpu").manual_seed(case["seed"]), output_type="np")
            finally:
                net.forward = forward
            return (out.images * 255).round().astype(np.uint8)

        refs[case["name"]] = run(True)
        prompt_text = run(False)  # the same with the prompt as the ControlNet's text: a test must tell them apart
        print(case["name"], "std", float(refs[case["name"]].std()), "| face tokens vs prompt as the net's text: max",
              int(np.abs(refs[case["name"]].astype(int) - prompt_text).max()))
    return digest


def full_size_check(tmp: Path) -> None:
    """InstantX's files at full size (names and shapes; values not written) open in sdrt as InstantID's."""
    from diffusers import ControlNetModel

    from sdrt.checkpoint.controlnet import open_controlnet
    from sdrt.checkpoint.ipadapter import open_ip_adapter

    one = torch.zeros(1, dtype=torch.float16)

    def t(*shape: int) -> torch.Tensor:
        return one.expand(*shape)  # a zero-strided view: saved as its one-value storage

    proj = {"latents": t(1, 16, 1280), "proj_in.weight": t(1280, 512), "proj_in.bias": t(1280),
            "proj_out.weight": t(2048, 1280), "proj_out.bias": t(2048), "norm_out.weight": t(2048),
            "norm_out.bias": t(2048)}
    for n in range(4):
        a, f = f"layers.{n}.0", f"layers.{n}.1"
        proj.update({f"{a}.norm1.weight": t(1280), f"{a}.norm1.bias": t(1280), f"{a}.norm2.weight": t(1280),
                     f"{a}.norm2.bias": t(1280), f"{a}.to_q.weight": t(1280, 1280), f"{a}.to_kv.weight": t(2560, 1280),
                     f"{a}.to_out.weight": t(1280, 1280), f"{f}.0.weight": t(1280), f"{f}.0.bias": t(1280),
                     f"{f}.1.weight": t(5120, 1280), f"{f}.3.weight": t(1280, 5120)})
    # SDXL's attention processors in diffusers' order (attn1 / attn2 of each transformer layer; down blocks 2 x 2 and
    # 2 x 10 layers, up blocks 3 x 10 and 3 x 2, the mid block 10): the 70 cross-attentions at the odd places
    widths = [640] * 8 + [1280] * 40 + [1280] * 60 + [640] * 12 + [1280] * 20
    ip = {}
    for k, width in enumerate(widths):
        if k % 2:
            ip[f"{k}.to_k_ip.weight"] = t(width, 2048)
            ip[f"{k}.to_v_ip.weight"] = t(width, 2048)
    path = tmp / "ip-adapter.bin"
    torch.save({"image_proj": proj, "ip_adapter": ip}, path)
    ad = open_ip_adapter(path, base="sdxl", text_width=2048)
    print("ip-adapter.bin", path.stat().st_size, "bytes:", ad.label, ad.kind, ad.tokens, "tokens,", len(ad.layers),
          "layers")
    assert ad.kind == "instantid" and ad.tokens == 16 and ad.cross == 2048 and len(ad.layers) == 70
    out = ad.project(np.ones((1, 512), np.float32))
    assert out.shape == (1, 16, 2048)

    config = dict(addition_embed_type="text_time", addition_time_embed_dim=256, attention_head_dim=[5, 10, 20],
                  block_out_channels=[320, 640, 1280], conditioning_embedding_out_channels=[16, 32, 96, 256],
                  cross_attention_dim=2048, down_block_types=["DownBlock2D", "CrossAttnDownBlock2D",
                                                              "CrossAttnDownBlock2D"],
                  projection_class_embeddings_input_dim=2816, transformer_layers_per_block=[1, 2, 10],
                  use_linear_projection=True, in_channels=4, layers_per_block=2)
    with torch.device("meta"):
        net = ControlNetModel(**config)
    header, offset = {}, 0
    for name, p in net.state_dict().items():
        size = p.numel() * 2
        header[name] = {"dtype": "F16", "shape": list(p.shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    folder = tmp / "ControlNetModel"
    folder.mkdir()
    st = folder / "diffusion_pytorch_model.safetensors"
    with open(st, "wb") as fh:
        fh.write(len(blob).to_bytes(8, "little") + blob)
        fh.truncate(8 + len(blob) + offset)  # a hole: the values are never read here
    opened = open_controlnet(st, base="sdxl")
    print("ControlNetModel:", len(header), "tensors bound onto", Path(str(opened.graph)).name)


def main() -> None:
    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp())
    refs: dict[str, np.ndarray] = {}
    insightface_refs(refs, tmp)
    digest = diffusers_refs(refs, tmp)
    full_size_check(tmp)
    np.savez_compressed(OUT / "instantid_refs.npz", **refs)
    (OUT / "instantid_refs.json").write_text(json.dumps({"cases": CASES, "sha256": {fx.NAME: digest}}, indent=1)
                                             + "\n")


if __name__ == "__main__":
    main()
