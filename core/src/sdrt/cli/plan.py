"""``sdrt plan``: predict each part's time and the peak memory of a model on a device, and the plan
(backend, precision, offload) sdrt would pick there, with the runner-up."""

from __future__ import annotations

import argparse
import json
from typing import Any

#: make_plan's argument names -> this command's flags
API_NAMES = {"backends": "--backend", "precisions": "--precision",
             # files a plan does not take (a single file's missing parts): the run takes them
             "text_encoders": "sdrt generate's --text-encoder", "vae": "sdrt generate's --vae",
             "init_image": "sdrt generate's --init-image"}  # a picture given as MODEL: generate's input


#: options an empty value is meaningful for; every other one given "" is refused (sdrt.cli.check_nonempty)
#: (--precision '' has a message of its own)
EMPTY_OK: frozenset[str] | set[str] = {"precision"}


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("plan", help="predict time per image and peak memory of a model on a device, and the plan "
                                    "(backend, precision, offload) to use")
    p.add_argument("model", nargs="?", help="a model folder (diffusers/Optimum ONNX layout, or a diffusers folder of "
                                            ".safetensors), a single-file checkpoint (.safetensors), or one .onnx file")
    p.add_argument("--device", default=None,
                   help='a device of the library ("RTX 3060 12GB", "Arc A770", "Apple M2"), or "cpu" for this '
                        "machine's CPU; --list-devices lists them (default: the device sdrt would run on here, as "
                        'backend="auto" picks it, where the library holds it; else this CPU)')
    p.add_argument("--backend", action="append", default=[], help="consider only this backend; repeatable")
    p.add_argument("--precision", action="append", default=[],
                   help="consider only this precision (fp32, fp16, bf16, int8, q8_0, q4_0, ...); repeatable")
    p.add_argument("--memory", default=None, metavar="SIZE",
                   help="memory budget, e.g. 8GiB or 8GB (default: 90%% of the device's memory, 70%% if shared)")
    p.add_argument("--width", type=int, default=None,
                   help="image width (default: the model's own size, as sdrt generate takes it; for one .onnx, the "
                        "size its image input is fixed at, else 512)")
    p.add_argument("--height", type=int, default=None, help="image height (default as --width)")
    p.add_argument("--steps", type=int, default=20, help="sampling steps (default 20)")
    p.add_argument("--refiner", default=None, metavar="FILE|DIR",
                   help="a refiner after the model (the SDXL refiner after SDXL): its parts and calls join the plan, "
                        "both models loaded")
    p.add_argument("--refiner-switch-at", type=float, default=None, metavar="F",
                   help="where the refiner takes over (0.8; 1: never)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--list-devices", action="store_true", help="list the device library and exit")
    return p


def run(args: argparse.Namespace) -> int:
    from ..cost import devices
    from ..cost.planner import make_plan, parse_memory
    from ..errors import SdrtError

    if args.list_devices:
        if args.json:
            print(json.dumps([d.to_dict() for d in (devices.this_cpu(), *devices.library())], indent=1))
            return 0
        for d in (devices.this_cpu(), *devices.library()):
            print(f"{d.name:<36} {d.kind:<5} {d.memory_bytes / 2**30:6.0f} GiB  {d.bandwidth_bytes_per_s / 1e9:6.0f} GB/s  "
                  + "  ".join(f"{k} {v / 1e12:.1f}T" for k, v in d.peak_flops.items()))
        return 0
    if args.model is None:  # optional only for --list-devices
        raise SdrtError("no model given", where="sdrt plan MODEL",
                        fix="pass a model folder, a checkpoint file or one .onnx file: sdrt plan MODEL [--device NAME]")
    from ..pipelines.bounds import MAX_SIDE, MAX_STEPS

    for flag, v, high in (("--width", args.width, MAX_SIDE), ("--height", args.height, MAX_SIDE),
                          ("--steps", args.steps, MAX_STEPS)):
        if v is not None and v <= 0:
            raise SdrtError(f"{flag} must be a positive number, got {v}", where=f"sdrt plan {flag}",
                            fix=f"pass e.g. {flag} 512" if flag != "--steps" else "pass e.g. --steps 20")
        if v is not None and v > high:  # the bound of every generation (sdrt.pipelines.validate)
            raise SdrtError(f"{flag} {v} is above the limit of {high}", where=f"sdrt plan {flag}",
                            fix=f"pass {flag} {high} or less")
    precisions = [x.strip() for p in args.precision for x in p.split(",")]
    from ..cost.nodes import PRECISIONS
    if "" in precisions:  # --precision "" or "fp16,": an empty value was dropped, planning every precision
        raise SdrtError(f"--precision {','.join(precisions)!r} names an empty precision", where="sdrt plan --precision",
                        fix=f"name one of: {', '.join(PRECISIONS)}; or leave --precision out to consider them all")
    bad = [p for p in precisions if p not in PRECISIONS]
    if bad:
        raise SdrtError(f"unknown precision {bad[0]!r}", where="sdrt plan --precision",
                        fix=f"use some of: {', '.join(PRECISIONS)}")
    memory = parse_memory(args.memory) if args.memory else None
    device = devices.find(args.device) if args.device else _here()
    # a size not given is the model's own (make_plan: a folder's as generate takes it, a lone graph's fixed size)
    plan = make_plan(args.model, device, backends=args.backend or None, precisions=precisions or None,
                     memory=memory, width=args.width, height=args.height, steps=args.steps, refiner=args.refiner,
                     refiner_switch_at=args.refiner_switch_at)
    print(json.dumps(plan.to_dict(), indent=1) if args.json else plan.format())
    return 0



def _here() -> Any:
    """The device sdrt would run on here (``backend="auto"``'s pick) as a library spec, saying so on stderr where it is
    not this CPU; this CPU where no backend offers another device or the library does not hold it."""
    import sys

    from ..cost import devices
    from ..errors import SdrtError

    try:
        dev = _auto_device()
    except SdrtError:
        return devices.this_cpu()
    if dev.kind == "cpu":
        return devices.this_cpu()
    try:
        spec = devices.for_runtime(dev)
    except SdrtError:
        print(f"note: sdrt would run on {dev} here, which the device library does not hold: planning this CPU "
              "(pass --device to plan another device)", file=sys.stderr)
        return devices.this_cpu()
    print(f"note: planning {spec.name}, the device sdrt would run on here ({dev}); --device cpu plans this CPU",
          file=sys.stderr)
    return spec


def _auto_device() -> Any:
    """The device ``backend="auto"`` picks here (``runtime.select``)."""
    from ..runtime import select

    return select("auto")[1]
