"""``sdrt generate`` options for the memory budget: ``--memory SIZE``, ``--quantize``, ``--share-blocks``, and
where parts run beside an accelerator: ``--text-encoders-on-cpu`` (``--clip-on-cpu``, as stable-diffusion.cpp
spells it) and ``--vae-on-cpu``.

The size is checked before any model loads (an unreadable one is a one-line error naming ``--memory``);
the pipeline's plan places each part under it (``sdrt.pipelines.budget``). ``--dry-run`` prints the
placements and the predicted peak; after a run, ``-v`` (or ``--memory``) prints the measured peak RSS of
each stage beside the prediction.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("memory")
    g.add_argument("--memory", default=None, metavar="SIZE",
                   help="memory budget, e.g. 8GB, 6GiB, 512MB: parts that do not fit together are released after "
                        "use, and a denoiser larger than the budget runs as block groups loaded in turn (default: "
                        "the memory the device reports; on a CPU, 90%% of what the OS has available)")
    g.add_argument("--quantize", default=None, metavar="SCHEME",
                   help="store the denoiser's, text encoders' and ControlNets' matmul and conv weights as int8, int4 "
                        "(blocks of 32; int4-16, int4-64, int4-128 for others) or fp8 (the VAE stays float): less "
                        "memory, slightly different images; quantized once and cached (docs/quantization.md)")
    g.add_argument("--share-blocks", action="store_true",
                   help="with a streamed denoiser, compile identical blocks once and swap their weights in")
    g.add_argument("--text-encoders-on-cpu", "--clip-on-cpu", action="store_true", dest="text_on_cpu",
                   help="run the text encoders on a CPU device beside the GPU (default: when the parts do not fit "
                        "the GPU's budget together)")
    g.add_argument("--vae-on-cpu", action="store_true",
                   help="run the VAE on a CPU device beside the GPU (default: when the denoiser and the VAE do not "
                        "fit the GPU's budget together)")


def options(args: argparse.Namespace) -> dict[str, Any]:
    """The pipeline's keyword arguments; raises ``InputError`` naming ``--memory`` for a bad size."""
    from ..pipelines.budget import parse_memory

    out: dict[str, Any] = {}
    if args.memory is not None:
        out["memory"] = parse_memory(args.memory, "--memory")
    if args.share_blocks:
        out["share_blocks"] = True
    if getattr(args, "quantize", None) is not None:  # (a caller's namespace may lack the newer flags)
        out["quantize"] = quantize_option(args.quantize)
    placement = {k: "cpu" for k, on in (("text", getattr(args, "text_on_cpu", False)),
                                        ("vae", getattr(args, "vae_on_cpu", False))) if on}
    if placement:
        out["placement"] = placement
    return out


def quantize_option(value: str) -> str:
    """``--quantize``'s value, checked before any model loads (an unknown scheme is one line naming the flag)."""
    from ..errors import InputError, SdrtError
    from ..quantization import parse

    try:
        parse(value, "--quantize")
    except SdrtError as exc:
        raise InputError(exc.what, where="--quantize", fix="pass --quantize int8, int4 (int4-16, int4-64, int4-128: "
                                                            "other block sizes) or fp8") from None
    return value


def report(args: argparse.Namespace, gen: Any) -> None:
    """The plan and the measured peaks, on standard error, with ``-v`` or ``--memory``."""
    if gen.memory is not None and (getattr(args, "verbose", 0) or args.memory is not None):
        print(gen.memory.format(), file=sys.stderr)
