"""The family contract: each part's declared inputs and outputs against what its family feeds and reads.

Checked once, before a part first runs, so a graph of the wrong kind (a VAE decoder in ``unet/``) or of
another family (a 9-channel UNet with 16-channel latents) fails with one line that names the part and
says what it looks like, instead of a KeyError or a shape error deep in a backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ...errors import ModelError
from ..fluxtools import TOOLS as _TOOLS

TOOL_WIDTHS = tuple(_TOOLS)

if TYPE_CHECKING:  # pragma: no cover
    from ...backend import TensorInfo
    from ..parts import Part
    from .base import Family


def looks_like(inputs: Mapping[str, TensorInfo], outputs: Mapping[str, TensorInfo]) -> str:
    """A guess at what a graph is, from its input and output names (for the error message)."""
    names = set(inputs)
    if "latent_sample" in names:
        return "a VAE decoder"
    if "input_ids" in names:
        return "a text encoder"
    if names == {"sample"} and any(n.startswith("latent") for n in outputs):
        return "a VAE encoder"
    if {"sample", "timestep"} <= names:
        return "a UNet"
    if {"hidden_states", "timestep"} <= names:
        return "a diffusion transformer"
    return "a graph of another kind"


def _signature(part: Part) -> str:
    def show(infos: Mapping[str, TensorInfo]) -> str:
        return ", ".join(f"{n} {list(i.shape)}" for n, i in infos.items())

    return f"inputs {show(part.inputs)}; outputs {show(part.outputs)}"


def _fail(family: Family, part: Part, role: str, wanted: str) -> ModelError:
    kind = looks_like(part.inputs, part.outputs)
    return ModelError(f"the {part.name} part is not a {role} for {family.label}: it looks like {kind} "
                      f"({_signature(part)}); {wanted}", where=str(part.path),
                      fix=f"put the {role}'s model.onnx in {part.name}/ (diffusers/Optimum export names)")


def _static(value: object) -> int | None:
    return value if isinstance(value, int) and value > 0 else None


def check_family(family: Family, parts: Mapping[str, Part]) -> None:
    """Raise ``ModelError`` on the first part that does not fit ``family``."""
    for name, part in parts.items():
        role = family.parts.get(name)
        if role == "text":
            if "input_ids" not in part.inputs or not any(
                    o == "last_hidden_state" or o.startswith("hidden_states.") for o in part.outputs):
                raise _fail(family, part, "text encoder", "a text encoder takes input_ids and gives last_hidden_state")
            pooled = next((e.pooled for e in family.encoders if e.part == name and e.pooled), None)
            if pooled and pooled not in part.outputs:
                raise ModelError(f"{family.label} needs the pooled {pooled} output of {name}, and the graph has "
                                 f"outputs {', '.join(part.outputs)}", where=str(part.path),
                                 fix=f"export {name} with its {pooled} output (CLIPTextModelWithProjection)")
        elif role == "denoiser":
            _check_denoiser(family, part)
        elif role == "vae_decoder":
            shape = part.inputs["latent_sample"].shape if "latent_sample" in part.inputs else None
            if shape is None or len(shape) != 4 or not part.outputs:
                raise _fail(family, part, "VAE decoder", "a VAE decoder takes latent_sample [batch, channels, h, w]")
            if _static(shape[1]) not in (None, family.latent_channels):
                raise ModelError(f"the vae_decoder takes {shape[1]}-channel latents and {family.label} makes "
                                 f"{family.latent_channels}", where=str(part.path),
                                 fix="use the VAE that belongs to this model")
        elif role == "vae_encoder":
            shape = part.inputs["sample"].shape if "sample" in part.inputs else None
            if shape is None or len(shape) != 4 or len(part.inputs) != 1 or not part.outputs:
                raise _fail(family, part, "VAE encoder", "a VAE encoder takes one image input, sample [batch, 3, H, W]")


def _check_denoiser(family: Family, part: Part) -> None:
    inputs = part.inputs
    missing = [n for n in family.model_inputs if n not in inputs]
    if missing:
        raise _fail(family, part, "UNet" if part.name == "unet" else "denoiser",
                    f"it must take {', '.join(family.model_inputs)} (missing: {', '.join(missing)})")
    for n, rank in {**family.model_inputs, **{k: v for k, v in family.optional_inputs.items() if k in inputs}}.items():
        got = len(inputs[n].shape)
        if got != rank and not (n == "timestep" and got == 0):
            raise ModelError(f"the {part.name} input {n} has rank {got} and {family.label} feeds rank {rank}",
                             where=str(part.path), fix="export the model with the diffusers input shapes")
    shape = inputs[family.sample_input].shape
    if family.packed:  # [batch, tokens, 4 C]: 2x2 patches of C channels
        width = _static(shape[2])
        channels = width // 4 if width is not None and width % 4 == 0 else width
        if family.name == "flux" and width in TOOL_WIDTHS:  # FLUX.1 Fill (384) and Canny/Depth (128)
            return
        if channels is not None and channels != family.latent_channels:
            raise ModelError(f"the {part.name} takes {width}-wide latent tokens and a {family.label} model packs "
                             f"{4 * family.latent_channels}", where=str(part.path),
                             fix="use a model folder of one family (this transformer belongs to another)")
        return
    channels = _static(shape[1])
    allowed = (family.latent_channels, family.latent_channels + family.inpaint_channels)
    edit = family.latent_channels + family.edit_channels if family.edit_channels else None
    if channels is not None and channels not in allowed and channels != edit:
        raise ModelError(f"the {part.name} takes {channels}-channel samples and a {family.label} model feeds "
                         f"{allowed[0]} (or {allowed[1]} for inpainting)", where=str(part.path),
                         fix="use a model folder of one family (this UNet belongs to another)")
