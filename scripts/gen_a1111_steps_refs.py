"""Write tests/pipelines/data/a1111_steps.json from AUTOMATIC1111's own functions (no torch needed).

A1111's source is read, never copied: pass the ``modules`` folder of a stable-diffusion-webui checkout (read-only,
never committed)::

    git clone --depth 1 https://github.com/AUTOMATIC1111/stable-diffusion-webui /tmp/a1111
    python scripts/gen_a1111_steps_refs.py --a1111 /tmp/a1111 --out tests/pipelines/data/a1111_steps.json

The functions are taken out of the files with ``ast`` and run as A1111 runs them, on stand-ins for its
``opts``/``p``/``cfg_denoiser`` objects:

- ``img2img``: ``sd_samplers_common.setup_img2img_steps`` (``img2img_fix_steps`` off and on) and the cut
  ``KDiffusionSampler.sample_img2img`` makes of the sigmas (its ``sigma_sched = sigmas[...]`` expression, evaluated
  on the indices of a schedule of the length it asked for): for each (steps, strength, fix) the schedule length, the
  index of the first sigma and the number of steps run (``len(sigma_sched) - 1``).
- ``hires``: the same with the steps given, as ``processing.py``'s hires pass calls ``sample_img2img(...,
  steps=hr_second_pass_steps or steps)``.
- with ``--resize-out``, an ``.npz`` of ``images.resize_image`` with A1111's ``upscaler_for_img2img`` set to
  ``None``, ``Lanczos`` and ``Nearest`` (``upscaler.py``'s ``Upscaler.upscale`` and the two upscalers' ``do_upscale``
  run on Pillow), resize modes 0 to 2, on a 16x20 picture enlarged to 40x48 and 48x32 and shrunk to 8x8: key
  ``{upscaler}/{mode}/{width}x{height}``, and ``picture``. Needs Pillow.
- ``refiner_by_steps``: ``sd_samplers_common.apply_refiner`` with ``refiner_switch_by_sample_steps`` on, and
  ``SamplerData.total_steps`` with each k-diffusion label's options (``samplers_k_diffusion`` of
  ``sd_samplers_kdiffusion.py``): for each (label, steps, switch_at) the index of the denoiser call that loads the
  refiner (the calls counted from 0 as ``CFGDenoiser.step`` counts them), or None when none does.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
from pathlib import Path
from types import SimpleNamespace

STEPS = (1, 2, 3, 5, 7, 10, 20, 25, 30, 50, 150)
STRENGTHS = (0.01, 0.05, 0.1, 0.2, 0.25, 0.3, 0.33, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.9, 0.95, 0.999, 1.0)
HIRES = ((10, 0.7), (20, 0.5), (15, 0.3), (4, 0.45), (30, 1.0), (7, 0.999))
REFINER_STEPS = (1, 4, 10, 20, 25, 30)
SWITCHES = (0.1, 0.25, 0.5, 0.8, 0.95, 1.0)
LABELS = ("Euler", "Euler a", "LMS", "Heun", "DPM2", "DPM2 a", "DPM++ 2S a", "DPM++ 2M", "DPM++ SDE",
          "DPM++ 2M SDE", "DPM++ 3M SDE")


def _function(tree: ast.Module, name: str, cls: str | None = None) -> ast.FunctionDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and cls is not None and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
        if cls is None and isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise SystemExit(f"{name} not found in A1111's source")


def _compile(fn: ast.FunctionDef, env: dict) -> object:
    module = ast.Module(body=[fn], type_ignores=[])
    exec(compile(ast.fix_missing_locations(module), "<a1111>", "exec"), env)
    return env[fn.name]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--a1111", type=Path, required=True, help="a stable-diffusion-webui checkout")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--resize-out", type=Path, default=None, help="also write resize_image's outputs here (.npz)")
    args = ap.parse_args()
    if args.resize_out is not None:
        _resize_refs(args.a1111, args.resize_out)
    common = ast.parse((args.a1111 / "modules" / "sd_samplers_common.py").read_text())
    kdiff = ast.parse((args.a1111 / "modules" / "sd_samplers_kdiffusion.py").read_text())

    opts = SimpleNamespace(img2img_fix_steps=False, refiner_switch_by_sample_steps=True)
    setup = _compile(_function(common, "setup_img2img_steps"), {"opts": opts})
    # sample_img2img's cut: the subscript assigned to sigma_sched
    img2img = _function(kdiff, "sample_img2img", "KDiffusionSampler")
    cut = next(n.value for n in ast.walk(img2img) if isinstance(n, ast.Assign)
               and getattr(n.targets[0], "id", None) == "sigma_sched")
    cut_code = compile(ast.Expression(cut), "<a1111 sigma_sched>", "eval")

    def run(steps: int, strength: float, fix: bool, given: int | None = None) -> dict:
        opts.img2img_fix_steps = fix
        length, t_enc = setup(SimpleNamespace(steps=steps, denoising_strength=strength), given)
        sched = eval(cut_code, {}, {"sigmas": list(range(length + 1)), "steps": length, "t_enc": t_enc})
        return {"steps": steps, "strength": strength, "fix_steps": fix, "length": length, "t_enc": t_enc,
                "first": sched[0], "runs": len(sched) - 1}

    out: dict = {"img2img": [run(n, d, fix) for fix in (False, True) for n in STEPS for d in STRENGTHS],
                 "hires": [{**run(first, d, False, given=n), "hires_steps": n} for n, d in HIRES
                           for first in (20,)]}

    # the refiner: SamplerData.total_steps, apply_refiner by sampling steps
    table = next(n.value for n in kdiff.body if isinstance(n, ast.Assign)
                 and getattr(n.targets[0], "id", None) == "samplers_k_diffusion")
    labels = {}
    for item in table.elts:
        label, _func, _aliases, options = item.elts
        labels[ast.literal_eval(label)] = ast.literal_eval(options)
    total_steps = _compile(_function(common, "total_steps", "SamplerData"), {})
    swapped: list[bool] = []
    env = {"opts": opts, "torch": None, "devices": SimpleNamespace(torch_gc=lambda: None),
           "sd_models": SimpleNamespace(SkipWritingToConfig=contextlib.nullcontext,
                                        reload_model_weights=lambda info: swapped.append(True)),
           "shared": SimpleNamespace(sd_model=SimpleNamespace(sd_checkpoint_info="base"))}
    apply_refiner = _compile(_function(common, "apply_refiner"), env)
    rows = []
    for label in LABELS:
        data = SimpleNamespace(options=labels[label])
        for steps in REFINER_STEPS:
            total = total_steps(data, steps)
            for switch in SWITCHES:
                p = SimpleNamespace(refiner_switch_at=switch, refiner_checkpoint_info=SimpleNamespace(short_title="r"),
                                    extra_generation_params={}, setup_conds=lambda: None)
                den = SimpleNamespace(p=p, step=0, total_steps=total, update_inner_model=lambda: None)
                at = None
                for call in range(total + 1):
                    den.step = call
                    if apply_refiner(den, sigma=1.0):
                        at = call
                        break
                rows.append({"label": label, "steps": steps, "switch_at": switch, "total_steps": total,
                             "switch_call": at, "infotext": p.extra_generation_params.get(
                                 "Refiner switch by sampling steps")})
    out["refiner_by_steps"] = rows
    out["second_order"] = sorted(k for k, v in labels.items() if v.get("second_order"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=0, separators=(",", ":")) + "\n")
    print(f"wrote {args.out}: {len(out['img2img'])} img2img, {len(out['hires'])} hires, {len(rows)} refiner rows")


def _resize_refs(root: Path, out: Path) -> None:
    import numpy as np
    from PIL import Image

    images = ast.parse((root / "modules" / "images.py").read_text())
    upscaler = ast.parse((root / "modules" / "upscaler.py").read_text())
    lanczos, nearest = Image.Resampling.LANCZOS, Image.Resampling.NEAREST
    base = {"LANCZOS": lanczos, "NEAREST": nearest, "shared": SimpleNamespace(state=SimpleNamespace(interrupted=False))}
    upscale = _compile(_function(upscaler, "upscale", "Upscaler"), dict(base))
    scalers = []
    for cls, name in (("UpscalerNone", "None"), ("UpscalerLanczos", "Lanczos"), ("UpscalerNearest", "Nearest")):
        kind = type(cls, (), {"upscale": upscale, "do_upscale": _compile(_function(upscaler, "do_upscale", cls),
                                                                        dict(base)), "scale": 1})
        scalers.append(SimpleNamespace(name=name, scaler=kind(), data_path=None))
    opts = SimpleNamespace(upscaler_for_img2img=None)
    resize_image = _compile(_function(images, "resize_image"), {
        **base, "Image": Image, "opts": opts, "shared": SimpleNamespace(sd_upscalers=scalers)})
    rng = np.random.default_rng(7)
    yy, xx = np.mgrid[0:20, 0:16]
    smooth = np.stack([xx * 15, yy * 12, (xx + yy) * 7], axis=-1)
    picture = np.clip(smooth + rng.integers(-40, 40, smooth.shape), 0, 255).astype(np.uint8)
    data = {"picture": picture}
    for name in ("None", "Lanczos", "Nearest"):
        opts.upscaler_for_img2img = name
        for mode in (0, 1, 2):
            for w, h in ((40, 48), (48, 32), (8, 8)):
                got = resize_image(mode, Image.fromarray(picture), w, h)
                data[f"{name}/{mode}/{w}x{h}"] = np.asarray(got.convert("RGB"), dtype=np.uint8)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, **data)
    print(f"wrote {out}: {len(data) - 1} resized pictures")


if __name__ == "__main__":
    main()
