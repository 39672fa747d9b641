"""IP-Adapter FaceID references: InsightFace and diffusers on the same files as sdrt's tests.

1. ``make_face_standins.py``'s stand-ins for ``buffalo_l`` (``det_10g.onnx``, ``w600k_r50.onnx``) run through
   insightface's own ``FaceAnalysis`` (``allowed_modules`` detection and recognition, ``det_size=(640, 640)``, on
   onnxruntime) on ``faceid_fixtures.face_picture()`` turned to BGR, as h94's examples (``cv2.imread``) hand it:
   every face's box, score and points, ``faces[0].normed_embedding``, ``face_align.norm_crop`` of the RGB picture
   at 224 (FaceID Plus's CLIP input) and of the BGR one at 112 (ArcFace's), and ``cv2.resize`` to the detector's
   canvas;
2. diffusers' ``load_ip_adapter`` with ``faceid_fixtures``' tiny FaceID / FaceID Plus v2 adapters on tiny-sd15 and
   tiny-sdxl, fed ``ip_adapter_image_embeds`` = [zeros, that embedding] (and for Plus the projection's
   ``clip_embeds`` from ``prepare_ip_adapter_image_embeds`` of the 224 crop, ``shortcut`` True, ``shortcut_scale``
   as the case says), as diffusers' IP-Adapter docs do; and the projections' own outputs.

    PYTHONPATH=scripts:core/src:tests/pipelines /work/refvenv/bin/python scripts/gen_faceid_refs.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.modules["torchvision"] = None  # type: ignore[assignment]

import faceid_fixtures as ff  # noqa: E402
import gen_ipadapter_refs as gi  # noqa: E402
import gen_pipeline_refs as gp  # noqa: E402
import make_face_standins  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

OUT = gi.ROOT / "tests" / "data" / "faces"
CASES = [
    dict(name="faceid/sd15/0.8", base="sd15", plus=False, prompt="a photo of a person", negative_prompt="blurry",
         steps=3, cfg=6.0, seed=51, scale=0.8, sampler="Euler"),
    dict(name="faceid-plusv2/sd15/1.0", base="sd15", plus=True, s_scale=1.0, prompt="a photo of a person",
         negative_prompt="", steps=3, cfg=5.0, seed=52, scale=1.0, sampler="Euler"),
    dict(name="faceid-plusv2/sd15/0.7/s0.5", base="sd15", plus=True, s_scale=0.5, prompt="a portrait",
         negative_prompt="blurry", steps=3, cfg=6.0, seed=53, scale=0.7, sampler="Euler"),
    dict(name="faceid/sdxl/0.9", base="sdxl", plus=False, prompt="a photo of a person", negative_prompt="blurry",
         steps=3, cfg=6.0, seed=54, scale=0.9, sampler="Euler"),
    dict(name="faceid-plusv2/sdxl/1.0", base="sdxl", plus=True, s_scale=1.0, prompt="a photo of a person",
         negative_prompt="blurry", steps=3, cfg=6.0, seed=55, scale=1.0, sampler="Euler"),
]


def insightface_refs(refs: dict) -> None:
    import cv2
    from insightface.app import FaceAnalysis
    from insightface.utils import face_align

    folder = make_face_standins.OUT
    app = FaceAnalysis(name=str(folder), allowed_modules=["detection", "recognition"],
                       providers=["CPUExecutionProvider"])
    app.prepare(ctx_id=-1, det_size=(640, 640))
    rgb = ff.face_picture()
    bgr = np.ascontiguousarray(rgb[..., ::-1])
    faces = app.get(bgr)
    print("faces", len(faces), [round(float(f.det_score), 4) for f in faces])
    assert len(faces) >= 2
    refs["bboxes"] = np.stack([f.bbox for f in faces]).astype(np.float32)
    refs["scores"] = np.array([f.det_score for f in faces], np.float32)
    refs["kps"] = np.stack([f.kps for f in faces]).astype(np.float32)
    refs["embedding"] = faces[0].normed_embedding.astype(np.float32)
    refs["crop224"] = face_align.norm_crop(rgb, landmark=faces[0].kps, image_size=224)
    refs["crop112_bgr"] = face_align.norm_crop(bgr, landmark=faces[0].kps, image_size=112)
    refs["resized"] = cv2.resize(bgr, (640, 512))[120:300, 150:390]  # around the faces (the whole: 1 MB)
    refs["estimate_norm"] = face_align.estimate_norm(faces[0].kps, 224).astype(np.float64)
    assert app.get(np.ascontiguousarray(ff.no_face_picture()[..., ::-1])) == []


def diffusers_refs(refs: dict, hashes: dict) -> None:
    from PIL import Image

    tmp = Path(tempfile.mkdtemp())
    emb = torch.from_numpy(refs["embedding"])[None, None]  # [batch, images, 512]
    id_embeds = torch.cat([torch.zeros_like(emb), emb])
    pipes = {}
    for case in CASES:
        base, plus = case["base"], case["plus"]
        path, digest = ff.write(tmp, base, plus)
        hashes[path.name] = digest
        if base not in pipes:
            pipes[base] = gp.build(base)
        pipe = pipes[base]
        pipe.register_modules(feature_extractor=None)  # made anew from the encoder (its 32x32 size)
        pipe.load_ip_adapter(str(tmp), subfolder="", weight_name=path.name,
                             image_encoder_folder=str(gi.OUT / "image_encoder") if plus else None)
        pipe.set_ip_adapter_scale(case["scale"])
        proj = pipe.unet.encoder_hid_proj.image_projection_layers[0]
        if plus:
            clip = pipe.prepare_ip_adapter_image_embeds([Image.fromarray(refs["crop224"])], None, "cpu", 1, True)[0]
            proj.clip_embeds = clip.to(torch.float32)
            proj.shortcut = True
            proj.shortcut_scale = case["s_scale"]
        with torch.no_grad():
            refs[f"tokens/{case['name']}"] = proj(id_embeds.to(torch.float32)).numpy()
        sched = gp.SCHEDULERS[case["sampler"]](pipe.scheduler.config)
        p = type(pipe)(**{**pipe.components, "scheduler": sched})
        p.set_progress_bar_config(disable=True)
        out = p(prompt=case["prompt"], negative_prompt=case["negative_prompt"] or None,
                ip_adapter_image_embeds=[id_embeds], num_inference_steps=case["steps"], guidance_scale=case["cfg"],
                height=64, width=64, generator=torch.Generator("cpu").manual_seed(case["seed"]), output_type="np")
        refs[case["name"]] = (out.images * 255).round().astype(np.uint8)
        print(case["name"], float(refs[case["name"]].std()))
        pipe.unload_ip_adapter()


def main() -> None:
    torch.set_num_threads(1)
    make_face_standins.main()
    refs: dict[str, np.ndarray] = {}
    insightface_refs(refs)
    hashes: dict[str, str] = {}
    if "--faces-only" not in sys.argv:
        diffusers_refs(refs, hashes)
    np.savez_compressed(OUT / "faceid_refs.npz", **refs)
    (OUT / "faceid_refs.json").write_text(json.dumps({"cases": CASES, "sha256": hashes}, indent=1) + "\n")


if __name__ == "__main__":
    main()
