"""``CoreMLSession``: a package loaded by Core ML on one compute unit (macOS only).

``update_weights`` writes the new initializers into a private copy of the
package's weight file and has Core ML load it again: no lowering, no
conversion. Only when an initializer that was folded into another constant
changes (``package.Built.folded``) is the program lowered again.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sdrt import Device, Session, TensorInfo

from . import package
from .errors import CoreMLError, ct, first_line

log = logging.getLogger("sdrt.coreml.session")


def plan_update(built: package.Built, arrays: dict[str, np.ndarray]) -> list[str]:
    """The folded initializers among ``arrays`` whose value differs from the one built in (empty: rewrite in place)."""
    return sorted(n for n, a in arrays.items() if n in built.folded and package.digest(np.asarray(a)) != built.folded[n])


def update_package(pkg: Path, built: package.Built, arrays: dict[str, np.ndarray],
                   rebuild: Callable[[Path], package.Built]) -> tuple[Path, package.Built]:
    """Bring the package at ``pkg`` (a private copy) to the new ``arrays``: in place, or with
    ``rebuild(path)`` (which lowers every current weight again) beside it, then swapped in."""
    changed = plan_update(built, arrays)
    if not changed:
        n = package.rewrite_weights(pkg, built, arrays)
        log.info("rewrote %d bytes of weights in %s", n, pkg)
        return pkg, built
    log.info("lowering again: %d initializers were folded into other constants (%s%s)", len(changed),
             ", ".join(changed[:3]), ", ..." if len(changed) > 3 else "")
    fresh = pkg.with_name(pkg.stem + ".rebuilt.mlpackage")
    shutil.rmtree(fresh, ignore_errors=True)
    new = rebuild(fresh)
    shutil.rmtree(pkg, ignore_errors=True)
    fresh.rename(pkg)
    new.path = pkg
    return pkg, new


class CoreMLSession(Session):
    def __init__(self, graph: Any, built: package.Built, device: Device, *, private_dir: Path | None,
                 arrays: dict[str, np.ndarray], rebuild: Callable[[dict[str, np.ndarray], Path], package.Built]
                 ) -> None:
        inputs = [TensorInfo(n, d, tuple(s)) for n, _, d, s in built.io["inputs"]]
        outputs = [TensorInfo(n, d, tuple(s)) for n, _, d, s in built.io["outputs"]]
        super().__init__(inputs, outputs, graph=graph)
        self._built = built
        self._device = device
        self._private = private_dir  # a folder this session owns (None: the package is the cache's)
        self._arrays = dict(arrays)  # every initializer's current value, for a rebuild
        self._rebuild = rebuild
        self._model = self._load(built.path)

    def _load(self, pkg: Path) -> Any:
        coremltools = ct()
        unit = getattr(coremltools.ComputeUnit, self._device.properties["compute_units"])
        try:
            return coremltools.models.MLModel(str(pkg), compute_units=unit)
        except Exception as exc:  # noqa: BLE001 - Core ML's compiler failing on this Mac
            raise CoreMLError(f"Core ML could not load the package: {first_line(exc)}", where=str(pkg),
                              fix="try device='CPU' or precision='fp32'; report the model's op list") from exc

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        mil_feeds = {}
        for name, mil, dtype, _ in self._built.io["inputs"]:
            arr = feeds[name]
            mil_feeds[mil] = arr.astype(np.int32) if dtype == "int64" else arr
        try:
            out = self._model.predict(mil_feeds)
        except Exception as exc:  # noqa: BLE001 - Core ML's runtime failing
            raise CoreMLError(f"Core ML prediction failed: {first_line(exc)}", where=str(self._built.path),
                              fix="try device='CPU'; run with -vv for Core ML's message") from exc
        return {name: np.asarray(out[mil]).astype(dtype, copy=False)
                for name, mil, dtype, _ in self._built.io["outputs"]}

    def _update_weights(self, arrays: dict[str, np.ndarray]) -> None:
        if self._private is None:  # never write into the cache: take a private copy first
            self._private = Path(tempfile.mkdtemp(prefix="sdrt-coreml-"))
            dst = self._private / self._built.path.name
            shutil.copytree(self._built.path, dst)
            self._built = package.Built(dst, self._built.io, self._built.weights, self._built.folded,
                                        self._built.op_counts)
        self._arrays.update(arrays)
        pkg, self._built = update_package(self._built.path, self._built, arrays,
                                          lambda out: self._rebuild(self._arrays, out))
        self._model = self._load(pkg)

    def close(self) -> None:
        self._model = None
        self._arrays = {}
        if self._private is not None:
            shutil.rmtree(self._private, ignore_errors=True)
            self._private = None
        super().close()
