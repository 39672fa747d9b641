"""Time ``sdrt serve``'s VAE / text-encoder folder listing on a models folder of 5000 VAE files (docs/serve.md).

Makes a temporary models folder (``VAE/`` with ``--files`` empty ``.safetensors`` files, ``text_encoder/`` with 20
subfolders of one file each), then times ``sdrt.serve.modules.listing`` and ``resolve`` (what a request naming a
file runs), the median and the least of 20 calls, with the folders unchanged, and a listing read again (as after a
change); then checks that a file added and removed shows at once. Run it with ``PYTHONPATH`` on another checkout to time older code.

    flock /work/bench.lock python scripts/serve_listing_bench.py
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=5000)
    args = ap.parse_args()
    from sdrt.serve import modules

    with tempfile.TemporaryDirectory(prefix="sdrt-listing-") as tmp:
        root = Path(tmp)
        (root / "VAE").mkdir()
        for i in range(args.files):
            (root / "VAE" / f"vae_{i:05d}.safetensors").touch()
        for i in range(20):
            (root / "text_encoder" / f"sub{i}").mkdir(parents=True)
            (root / "text_encoder" / f"sub{i}" / f"te_{i}.safetensors").touch()

        class Reg:  # what listing() reads of a Registry
            models_dir, vae_dir, text_encoder_dir = root, None, None

        reg = Reg()
        time.sleep(2.5)  # a folder changed within 2 s is read again on purpose (coarse mtimes)
        modules.listing(reg)

        def timed(f):
            xs = []
            for _ in range(20):
                t = time.perf_counter()
                f()
                xs.append(time.perf_counter() - t)
            return f"{statistics.median(xs) * 1e3:.2f} / {min(xs) * 1e3:.2f} ms"

        print("files", len(modules.listing(reg)))
        print("listing, median / least:", timed(lambda: modules.listing(reg)))
        print("resolve, median / least:", timed(lambda: modules.resolve(reg, f"vae_{args.files - 1:05d}", "sd_vae",
                                                                        vae_only=True)))
        if hasattr(modules, "forget"):  # a changed folder: read again
            print("read again, median / least:", timed(lambda: (modules.forget(), modules.listing(reg))))
        new = root / "VAE" / "new_one.safetensors"
        new.touch()
        seen = "new_one.safetensors" in modules.listing(reg)
        new.unlink()
        print("a new file is seen at once:", seen, "; a removed one is gone:",
              "new_one.safetensors" not in modules.listing(reg))


if __name__ == "__main__":
    main()
