"""Several IP-Adapters a run, and each adapter's step window: diffusers' references.

diffusers' ``load_ip_adapter`` with lists (``tests/data/ipadapter``'s tiny base adapter and tiny Plus adapter, one
image encoder for both) on the tiny SD 1.x and SDXL pipelines of ``gen_pipeline_refs.build``, each adapter with its
own picture (``ip_adapter_image=[a, b]``) and scale (``set_ip_adapter_scale([..])``). A window is diffusers' own
way of switching an adapter on and off between steps: ``callback_on_step_end`` sets the next step's scales, 0 for an
adapter whose window does not hold that step. Which steps a window holds is written out here, for each rule, as its
source states it:

- ``diffusers``: the ControlNet pipelines' ``controlnet_keep``: step ``i`` of ``n`` is on unless ``i / n < start``
  or ``(i + 1) / n > end``;
- ``a1111``: sd-webui-controlnet's ``guidance_schedule_handler`` (``current_sampling_percent = sampling_step /
  total_sampling_steps``) and its IP-Adapter attention patch (``plugable_ipadapter.py``: nothing added when that
  percent is below ``p_start`` or above ``p_end``): on while ``start <= i / n <= end``.

Writes ``multi_refs.npz`` (the images, the second picture) and ``multi_refs.json`` (the cases, each with the scales
every step ran at).

    PYTHONPATH=scripts/_tvblock:scripts:core/src /work/refvenv/bin/python scripts/gen_ipadapter_multi_refs.py
"""

from __future__ import annotations

import json
import sys

sys.modules["torchvision"] = None  # type: ignore[assignment]

import gen_ipadapter_refs as gi  # noqa: E402
import gen_pipeline_refs as gp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

OUT = gi.OUT
BASE, PLUS = "ip-adapter_tiny.safetensors", "ip-adapter-plus_tiny.safetensors"
XL_BASE, XL_PLUS = "ip-adapter_tiny_sdxl.safetensors", "ip-adapter-plus_tiny_sdxl.safetensors"
#: each case: the adapters (file, picture: "a" the first tests' picture, "b" the second, scale, start, end), the rule
CASES = [
    dict(name="multi/sd15/base+plus", family="sd15", steps=4, cfg=7.0, seed=51, window="diffusers",
         adapters=[(BASE, "a", 0.6, 0.0, 1.0), (PLUS, "b", 0.8, 0.0, 1.0)]),
    dict(name="multi/sd15/same-picture", family="sd15", steps=3, cfg=6.0, seed=52, window="diffusers",
         adapters=[(BASE, "a", 0.5, 0.0, 1.0), (PLUS, "a", 0.7, 0.0, 1.0)]),
    dict(name="multi/sd15/window/diffusers", family="sd15", steps=4, cfg=7.0, seed=53, window="diffusers",
         adapters=[(BASE, "a", 0.9, 0.0, 0.5), (PLUS, "b", 0.8, 0.5, 1.0)]),
    # 5 steps: at end 0.5, the extension's rule keeps step 2 (2/5 <= 0.5), diffusers' does not (3/5 > 0.5)
    dict(name="multi/sd15/window/a1111", family="sd15", steps=5, cfg=7.0, seed=54, window="a1111",
         adapters=[(BASE, "a", 0.9, 0.0, 0.5), (PLUS, "b", 0.8, 0.3, 1.0)]),
    dict(name="single/sd15/window/diffusers", family="sd15", steps=4, cfg=7.0, seed=55, window="diffusers",
         adapters=[(BASE, "a", 1.0, 0.25, 0.75)]),
    dict(name="multi/sdxl/window/diffusers", family="sdxl", steps=3, cfg=6.0, seed=56, window="diffusers",
         adapters=[(XL_BASE, "a", 0.7, 0.0, 0.67), (XL_PLUS, "b", 0.8, 0.3, 1.0)]),
]


def picture_b() -> np.ndarray:
    """A second picture, taller than wide (36 x 56), of another pattern than ``gi.ip_image``'s."""
    y, x = np.mgrid[0:56, 0:36]
    r = (y * 9 + 40) % 256
    g = ((x * y) // 3) % 256
    b = (255 - x * 6) % 256
    return np.stack([r, g, b], -1).astype(np.uint8)


def on(rule: str, start: float, end: float, i: int, n: int) -> bool:
    if rule == "a1111":
        return start <= i / n <= end
    return not (i / n < start or (i + 1) / n > end)


def main() -> None:
    from PIL import Image

    torch.set_num_threads(1)
    pictures = {"a": gi.ip_image(), "b": picture_b()}
    refs: dict[str, np.ndarray] = {"picture_b": pictures["b"]}
    built: dict[str, object] = {}
    for case in CASES:
        fam = case["family"]
        if fam not in built:
            built[fam] = gp.build(fam)
        pipe = built[fam]
        if getattr(pipe, "image_encoder", None) is not None:
            pipe.unload_ip_adapter()
        files = [a[0] for a in case["adapters"]]
        pipe.load_ip_adapter([str(OUT)] * len(files), subfolder=[""] * len(files), weight_name=files,
                             image_encoder_folder=str(OUT / "image_encoder"), low_cpu_mem_usage=False)
        n = case["steps"]
        table = [[a[2] if on(case["window"], a[3], a[4], i, n) else 0.0 for a in case["adapters"]] for i in range(n)]
        case["scales_per_step"] = table

        def scales(i: int, table: list[list[float]] = table) -> list[float] | float:
            return table[i] if len(table[i]) > 1 else table[i][0]

        def step_end(p, i, t, kw, n: int = n):  # noqa: ANN001
            if i + 1 < n:  # the next step's scales (diffusers calls this after step i)
                p.set_ip_adapter_scale(scales(i + 1))
            return kw

        pipe.set_ip_adapter_scale(scales(0))
        sched = gp.SCHEDULERS["Euler"](pipe.scheduler.config)
        p = type(pipe)(**{**pipe.components, "scheduler": sched})
        p.set_progress_bar_config(disable=True)
        images = [Image.fromarray(pictures[a[1]]) for a in case["adapters"]]
        out = p(prompt="a photo of a red cat", negative_prompt="blurry",
                ip_adapter_image=images if len(images) > 1 else images[0], num_inference_steps=n,
                guidance_scale=case["cfg"], height=64, width=64, callback_on_step_end=step_end,
                generator=torch.Generator("cpu").manual_seed(case["seed"]), output_type="np")
        refs[case["name"]] = (out.images * 255).round().astype(np.uint8)
        print(case["name"], table, float(refs[case["name"]].std()))
    np.savez_compressed(OUT / "multi_refs.npz", **refs)
    (OUT / "multi_refs.json").write_text(json.dumps(CASES, indent=1) + "\n")


if __name__ == "__main__":
    main()
