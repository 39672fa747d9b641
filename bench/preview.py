"""``python -m bench.preview``: the cost of a live preview against one UNet step.

Times, interleaved: one step of the bench UNet (``sdrt.testing.models``' SD 1.x UNet at its bench size:
64 base channels, sample 1x4x32x32), or of ``--unet FILE``, on each sdrt backend, and
``sdrt.pipelines.preview.project`` on latents of real sizes (SD 1.x 512x512: 4x64x64; SDXL 1024x1024:
4x128x128; Flux 1024x1024: 16x128x128), plus ``upscale=8`` for SD 1.x. Prints medians and the preview's
share of a step. The bench UNet is 5x narrower, runs at a quarter of the real latent area and batch 1, so
its step is far cheaper than a real one.

    python -m bench.preview [--backends openvino] [--size bench] [--rounds 30] [--taesd FILE]
                            [--taesd-sizes 256,full] [--unet FILE] [--quality]

``--taesd FILE`` also times a TAESD-family decoder (``TaesdPreview``) on a 4x64x64 latent on each backend,
at each of ``--taesd-sizes`` (``preview_size``: 256 by default, ``full`` = 512x512);
``scripts/make_taesd_bench.py`` exports one with TAESD's real widths (random weights).
``--unet FILE`` times that UNet ONNX (e.g. a full-size SD 1.5 UNet: ``sample`` 2x4x64x64, 512x512 at
batch 2) instead of the bench one. Every session runs at its backend's default precision.
``--quality`` prints instead how far a reduced TAESD preview is from the full-size decode area-downscaled
to the same size (PSNR in dB, uint8): for ``--taesd FILE`` on white-noise and 1/f-spectrum latents, and for
the tiny decoders of ``tests/data/preview`` against diffusers' own full-size decode (``refs.npz``).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from . import harness

LATENTS = [("sd1 4x64x64", "sd1", (4, 64, 64), 1), ("sd1 4x64x64 upscale 8", "sd1", (4, 64, 64), 8),
           ("sdxl 4x128x128", "sdxl", (4, 128, 128), 1), ("flux 16x128x128", "flux", (16, 128, 128), 1)]
DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "preview"


def unet_feeds(path: Path, batch: int = 2, latent: int = 64, tokens: int = 77) -> tuple[dict, list[str]]:
    """Inputs for one step of a UNet ONNX at ``batch`` x 4 x ``latent`` x ``latent`` (and its output names)."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    rng = np.random.default_rng(0)
    feeds = {}
    for i in proto.graph.input:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
        dims = [d.dim_value for d in i.type.tensor_type.shape.dim]
        if i.name == "sample":
            feeds[i.name] = rng.standard_normal((batch, dims[1], latent, latent)).astype(dtype)
        elif i.name == "timestep":
            feeds[i.name] = np.full((batch,) if dims else (), 500, dtype)
        elif i.name == "encoder_hidden_states":
            feeds[i.name] = rng.standard_normal((batch, tokens, dims[2])).astype(dtype)
        else:
            raise SystemExit(f"{path}: input {i.name} is not a plain UNet's (sample, timestep, encoder_hidden_states)")
    return feeds, [o.name for o in proto.graph.output]


def unet_runner(path: Path, feeds: dict, backend: str):
    """A session of the UNet at ``path`` with its inputs pinned to ``feeds``' shapes (ggml needs static ones)."""
    import sdrt

    graph = sdrt.Graph.load(path)
    from bench.harness import load_for_timing

    session = load_for_timing(graph.with_shapes({k: v.shape for k, v in feeds.items()}), backend=backend)
    return lambda f: session.run(f)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def reduced_vs_full(prev, latent: np.ndarray, full: np.ndarray | None = None) -> str:
    """The PSNR of ``prev(latent)`` against the full-size decode (``full``, floats (3, H, W) in [-1, 1];
    default: ``prev`` at full size) area-downscaled to the preview's size; beside it, the PSNR of a flat
    image of that reference's mean colour (what a preview with no detail would score) and its spread."""
    from sdrt.pipelines.preview import area_resize, to_uint8

    small = prev(latent)
    if full is None:
        size, prev.preview_size = prev.preview_size, None
        full = prev(latent).astype(np.float32).transpose(2, 0, 1) / 127.5 - 1  # uint8 back to [-1, 1]
        prev.preview_size = size
    want = to_uint8(area_resize(full, small.shape[0], small.shape[1]).transpose(1, 2, 0))
    flat = np.broadcast_to(want.reshape(-1, 3).mean(axis=0), want.shape)
    return (f"{small.shape[1]:>3}x{small.shape[0]:<3} {psnr(small, want):6.2f} dB (flat {psnr(flat, want):5.2f} dB, "
            f"reference std {want.std():5.1f} levels)")


def quality(taesd: Path | None, backend: str, sizes: list[int | None]) -> None:
    from sdrt.pipelines.preview import TaesdPreview

    rng = np.random.default_rng(1)
    print(f"reduced TAESD preview against the full-size decode area-downscaled to its size, PSNR (dB), {backend}:")
    if taesd is not None:
        white = rng.standard_normal((4, 64, 64)).astype(np.float32)
        # a natural image's spectrum: amplitude falling as 1/f (SD latents are small images, roughly)
        f = np.hypot(*np.meshgrid(np.fft.fftfreq(64), np.fft.fftfreq(64), indexing="ij"))
        natural = np.fft.ifft2(np.fft.fft2(white) / np.maximum(f, 1 / 64)).real
        natural = (natural / natural.std()).astype(np.float32)
        with TaesdPreview(taesd, backend=backend) as prev:
            for name, z in (("white-noise latent 4x64x64", white), ("1/f-spectrum latent 4x64x64", natural)):
                for size in sizes:
                    prev.preview_size = size
                    print(f"  {taesd.name} {name:<28} preview_size {size}: {reduced_vs_full(prev, z)}")
    for folder in ("tiny-taesd", "tiny-taesd-16ch"):
        refs = np.load(DATA / folder / "refs.npz")
        with TaesdPreview(DATA / folder / "vae_decoder", backend=backend) as prev:
            for i in (0, 1):
                latent = refs[f"latent_{i}"]
                longest = 8 * max(latent.shape[2:])
                for size in (longest // 2, longest // 4):
                    prev.preview_size = size
                    got = reduced_vs_full(prev, latent, refs[f"float_{i}"][0])
                    print(f"  {folder} latent {'x'.join(map(str, latent.shape[1:]))} vs diffusers' full decode,"
                          f" preview_size {size}: {got}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default=None, help="comma-separated sdrt backends (default: every installed one)")
    ap.add_argument("--size", default="bench", choices=["tiny", "bench", "full"])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--taesd", type=Path, default=None, help="a TAESD decoder ONNX file to time as well")
    ap.add_argument("--taesd-sizes", default="256,full", help="preview_size values to time TAESD at (full: None)")
    ap.add_argument("--unet", type=Path, default=None, help="time this UNet ONNX (batch 2, 4x64x64) instead")
    ap.add_argument("--quality", action="store_true", help="print the reduced previews' PSNR instead of timing")
    args = ap.parse_args(argv)

    from sdrt.pipelines.preview import project

    sizes = [None if v.strip() == "full" else int(v) for v in args.taesd_sizes.split(",")]
    backends = harness.sdrt_backends(only=args.backends.split(",") if args.backends else None)
    if args.quality:
        quality(args.taesd, backends[0], [v for v in sizes if v is not None] + [128])
        return
    if args.unet is not None:
        path = args.unet
        feeds, outputs = unet_feeds(path)
        unet_name = f"{path.parent.name}/{path.name}"
    else:
        workdir = args.workdir or Path(tempfile.gettempdir()) / "sdrt-bench-models"
        workdir.mkdir(parents=True, exist_ok=True)
        path, feeds, outputs = harness.model_file("unet", args.size, workdir)
        unet_name = f"bench UNet ({args.size})"
    runners = {b: harness.sdrt_runner(path, outputs, b, {}) if args.unet is None else unet_runner(path, feeds, b)
               for b in backends}
    rng = np.random.default_rng(0)
    latents = {label: rng.standard_normal(shape).astype(np.float32) for label, _, shape, _ in LATENTS}
    times: dict[str, list[float]] = {f"unet step ({b})": [] for b in backends}
    times.update({f"preview {label}": [] for label, *_ in LATENTS})
    taesd = {}
    if args.taesd is not None:
        from sdrt.pipelines.preview import TaesdPreview

        taesd = {b: TaesdPreview(args.taesd, backend=b) for b in backends}
        times.update({f"taesd {size or 'full'} ({b})": [] for b in backends for size in sizes})
    for run in runners.values():
        run(feeds)  # warm up
    for prev in taesd.values():
        for size in sizes:  # compiles once per shape
            prev.preview_size = size
            prev(latents[LATENTS[0][0]])
    for _ in range(args.rounds):
        for b, run in runners.items():
            t = time.perf_counter()
            run(feeds)
            times[f"unet step ({b})"].append(time.perf_counter() - t)
        for label, fmt, _, up in LATENTS:
            t = time.perf_counter()
            project(latents[label], fmt, upscale=up)
            times[f"preview {label}"].append(time.perf_counter() - t)
        for b, prev in taesd.items():
            for size in sizes:
                prev.preview_size = size
                t = time.perf_counter()
                prev(latents[LATENTS[0][0]])
                times[f"taesd {size or 'full'} ({b})"].append(time.perf_counter() - t)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    shape = "x".join(str(d) for d in feeds["sample"].shape)
    print(f"{unet_name}, sample {shape}, {args.rounds} interleaved rounds, medians:")
    for k, v in med.items():
        print(f"  {k:<34} {v:9.3f} ms")
    for b in backends:
        step = med[f"unet step ({b})"]
        for label, *_ in LATENTS:
            print(f"  preview {label:<26} / step ({b}): {100 * med[f'preview {label}'] / step:6.2f} %")
        for size in sizes if taesd else []:
            name = f"taesd {size or 'full'} ({b})"
            print(f"  {name + ' 4x64x64':<34} / step ({b}): {100 * med[name] / step:6.2f} %")


if __name__ == "__main__":
    main()
