"""A hires-fix PNG of the embedded demo model, and its infotext read back with sd-parsers.

    python scripts/hires_demo.py [-o docs/hires-demo.png] [--backend openvino]

The demo model's UNet and VAE are exported for 64x64 only (their spatial axes are fixed in the
graphs' declared shapes; the layers themselves take any multiple of 8). The script copies the folder to
a temporary one whose unet/vae graphs declare those axes dynamic (onnx, no torch; weights unchanged),
runs ``sdrt generate`` there with ``--hires-scale 2``, then parses the PNG with ``sd_parsers`` when it
is installed (``pip install sd-parsers``) and prints what it read.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import onnx

from sdrt import pipelines


def dynamic_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for part in ("unet", "vae_decoder", "vae_encoder"):
        path = dst / part / "model.onnx"
        model = onnx.load(str(path))
        for kind, values in (("in", model.graph.input), ("out", model.graph.output)):
            for value in values:
                dims = value.type.tensor_type.shape.dim
                if len(dims) == 4:
                    for i, name in ((2, "height"), (3, "width")):
                        dims[i].Clear()
                        dims[i].dim_param = f"{kind}_{name}"
        del model.graph.value_info[:]
        onnx.save(model, str(path))
    return dst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", type=Path, default=Path("docs/hires-demo.png"))
    ap.add_argument("--backend", default="auto")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = dynamic_copy(Path(pipelines.DEMO_MODEL), Path(tmp) / "demo-sd")
        cmd = [sys.executable, "-m", "sdrt", "generate", str(folder), "a red star on a blue background, top left",
               "--steps", "12", "--sampler", "Euler", "--seed", "7", "--hires-scale", "2", "--hires-steps", "8",
               "--hires-denoise", "0.2", "--hires-upscaler", "Lanczos", "--backend", args.backend,
               "-o", str(args.output)]
        print("$", " ".join(cmd))
        subprocess.run(cmd, check=True)
    from sdrt.pipelines.png import read_parameters

    print("parameters chunk:\n" + read_parameters(args.output))
    try:
        from sd_parsers import ParserManager
    except ImportError:
        print("sd-parsers is not installed: pip install sd-parsers")
        return
    info = ParserManager().parse(str(args.output))
    print("sd-parsers:", info.generator if info else None)
    if info is not None:
        print("  prompt:", info.full_prompt, "| negative:", info.full_negative_prompt or "(none)")
        for sampler in info.samplers:
            print("  sampler:", sampler.name, dict(sampler.parameters))
        print("  models:", [(m.name, m.hash) for m in info.models])
        print("  metadata:", dict(info.metadata))


if __name__ == "__main__":
    main()
