"""What the toolbox adds to a run, as a mixin of :class:`sdrt.pipelines.pipeline.Pipeline`.

ControlNet parts and hooks (:mod:`.controlnet`), the hires fix's second pass (:mod:`.hires`), live
previews of the denoised estimate (:mod:`.preview`) and A1111's seeds (:mod:`.toolbox`). Kept out of
``pipeline.py`` so that the generic loop reads as it did; the pipeline calls these at four points:
after the settings are checked (``_prepare_extras``), for the run's noise (``_noise``), on the model
call (``_control``), and after the first pass (``_hires_pass``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InputError, ModelError
from . import controlnet as cn

if TYPE_CHECKING:  # pragma: no cover
    from .parts import Part
    from .settings import Settings
    from .toolbox import Toolbox

log = logging.getLogger("sdrt.pipelines")


def _check_ddpm_eps(ms: Any, what: str, fix: str) -> None:
    """The extension's x0 of a UNet call (``inpaint_only``'s restore, ``tile_colorfix``) reads the output as noise at
    a DDPM timestep (``alphas_cumprod``): a v / x0 model, or an EDM-trained one (Playground v2.5: its timestep is
    ``0.25 ln sigma``, it has no ``alphas_cumprod``), is refused in one line."""
    if getattr(ms, "prediction", None) != "eps":
        raise InputError(f"{what} through the UNet's noise prediction, and this model predicts "
                         f"{getattr(ms, 'prediction', 'another quantity')}", where="controlnets", fix=fix)
    if getattr(ms, "kind", None) != "discrete" or getattr(ms, "alphas_cumprod", None) is None:
        raise InputError(f"{what} through the UNet's noise prediction at a DDPM timestep, and this model is not "
                         "DDPM-trained (an EDM model such as Playground v2.5: its timestep is 0.25 ln sigma)",
                         where="controlnets", fix=fix)


class ToolboxMixin:
    """ControlNet, hires fix, previews and A1111's seeds for the generic pipeline."""

    _parts: dict[str, Part]
    _dry: bool
    _current: np.ndarray | None = None
    _denoised: np.ndarray | None = None
    _preview_fn: Any = None
    _silent_units: list[cn.ControlNet] = []  # noqa: RUF012  (set per run)

    # ------------------------------------------------------------------ settings
    def _prepare_extras(self, s: Settings) -> None:
        """Resolve and check the ControlNets, prepare their images, check the hires size."""
        tb: Toolbox = s.toolbox
        assert s.width is not None and s.height is not None
        self._silent_units: list[cn.ControlNet] = []
        self._lama_noise = True  # the job's first batch: inpaint_only+lama's HackedImageRNG (_noise)
        cn.seed_units([*tb.controlnets, *tb.adapters], s.seed, tb.subseed_given)  # the shuffle map's numpy seed, as the
        # extension's (the subseed as given: a drawn one varies the noise only)
        for unit in [*tb.controlnets, *tb.adapters]:  # a preprocessor's graphs (DWPose) compile where the model runs unless told
            if unit.pose_backend is None:
                unit.pose_backend, unit.pose_device = self.backend, self.device  # type: ignore[attr-defined]
        self._unit_regions(s)
        from .singlefile import denoiser_graph

        graph = denoiser_graph(self.folder, bool(tb.controlnets))  # type: ignore[attr-defined]
        if graph is not None:  # a single file: its UNet runs the twin that takes residuals only when needed
            self.denoiser.retarget(graph)  # type: ignore[attr-defined]
        self._prepare_ip_adapter(s)
        self._prepare_adapters(s)
        nets = _transformer_nets(self.family.name)  # type: ignore[attr-defined]
        if nets is not None:  # Flux / SD3 ControlNets: residual inputs on the transformer only while a net is asked
            if tb.controlnets:
                self._no_face_tokens(tb)
                nets.prepare(self, s)
            else:
                nets.use_residuals(self.denoiser, None)  # type: ignore[attr-defined]
        elif not tb.controlnets and cn.residual_inputs(self.denoiser):  # type: ignore[attr-defined]
            self._silent_units = self._zero_residuals(s)
        if tb.controlnets and nets is None:
            unet = self.denoiser  # type: ignore[attr-defined]
            if self.family.name not in ("sd1", "sd2", "sdxl"):  # type: ignore[attr-defined]  # first: Chroma has no nets
                raise InputError(f"ControlNet is not supported for {self.family.label}", where="controlnets",
                                 fix="use an SD 1.x, SDXL, SD3 or Flux.1 dev model")
            if not cn.residual_inputs(unet):
                raise InputError(f"this model's {unet.name} takes no ControlNet residuals", where="controlnets",
                                 fix="use a model folder exported for ControlNet (its UNet takes "
                                     "down_block_additional_residual_*), or leave {@controlnets} out")
            if self.family.name != "sdxl":  # type: ignore[attr-defined]
                self._no_face_tokens(tb)
            for k, unit in enumerate(tb.controlnets):
                k = tb.place(unit, k)  # noqa: PLW2901 - its place among all the units given (reference units too)
                cn.check_no_control_mask(unit, f"controlnets[{k}]", f"a {self.family.label} ControlNet",  # type: ignore[attr-defined]
                                         sd=True)
                unit.part = self._control_part(unit.net, f"controlnets[{k}]")
                if "control_type" in unit.part.inputs:  # an SDXL ControlNet Union: the type of its image
                    from ..checkpoint.unioncontrolnet import type_index

                    unit.union_type = type_index(unit.union_mode, cn.union_types(unit.part), unit.preprocessor,
                                                 f"controlnets[{k}]", "{@union_mode}")
                elif unit.union_mode is not None:  # a union net's control type: no other SD net has one
                    raise InputError(f"controlnets[{k}] has a {{@union_mode}}: an SD ControlNet has no union modes "
                                     "(xinsir's SDXL ControlNet Union and union Flux.1 ControlNets have)",
                                     where=f"controlnets[{k}] {{@union_mode}}", fix="leave {@union_mode} out")
                cn.check_net(unit.part, unet, f"controlnets[{k}]")
                self._inpaint_unit(s, unit, k)
                unit.control = self._control_tensor(unit, s.width, s.height, k)
        if tb.hires is not None:
            if s.mode != "txt2img":
                raise InputError("the hires fix is a txt2img pass followed by img2img", where="hires_scale",
                                 fix="leave {@init_image} and {@mask} out, or {@hires_scale} unset")
            import dataclasses

            tw, th = tb.hires.target(s.width, s.height)
            if self.family.flow and any(tb.hires.resize) and (tw % 16 or th % 16):  # type: ignore[attr-defined]
                raise InputError(f"the hires pass is {tw}x{th}, and {self.family.label} needs multiples of 16 (VAE 8 "  # type: ignore[attr-defined]
                                 "x patch 2)", where="hires_width",
                                 fix="pass {@hires_width} and {@hires_height} that make multiples of 16")
            if self.family.flow and (tw % 16 or th % 16):  # type: ignore[attr-defined]  # said in scales, not sizes
                fits = tb.hires.fitting_scales(s.width, s.height, 16)
                raise InputError(f"the hires pass is {tw}x{th} ({s.width}x{s.height} x {tb.hires.scale:g}), and "
                                 f"{self.family.label} needs multiples of 16 (VAE 8 x patch 2)",  # type: ignore[attr-defined]
                                 where="hires_scale", fix="pass " + " or ".join(
                                     f"{{@hires_scale=}}{sc:g} ({w}x{h})" for sc, w, h in fits) if fits else
                                 "leave {@hires_scale} unset")
            self._check_size(dataclasses.replace(s, width=tw, height=th), "hires_scale")  # type: ignore[attr-defined]
        if tb.preview is not None and not callable(tb.preview) and tb.preview != "approx" and not self._dry:
            from .preview import TaesdPreview

            own = self.__dict__.get("_taesd")
            if own is None or own[0] != tb.preview:  # one decoder per file, its sessions kept between runs
                if own is not None:
                    own[1].close()
                # compiled as the model's VAE is: the backend's default precision unless the pipeline asked
                own = (tb.preview, TaesdPreview(tb.preview, backend=self.backend,  # type: ignore[attr-defined]
                                                device=self.device, **self.options))  # type: ignore[attr-defined]
                self.__dict__["_taesd"] = own
            own[1].preview_size = tb.preview_size
            self._preview_fn = own[1]
        elif callable(tb.preview):
            self._preview_fn = tb.preview
        else:
            self._preview_fn = None

    def _prepare_adapters(self, s: Settings) -> None:
        """The T2I-Adapter units (sdrt.pipelines.t2iadapter): each file opened (kept between runs) and checked against
        the model's family, and its checks as a ControlNet unit's."""
        from .t2iadapter import adapter_file, open_adapter

        tb: Toolbox = s.toolbox
        nets = self.__dict__.setdefault("_t2i_nets", {})
        family = self.family.name  # type: ignore[attr-defined]
        used = set()
        for k, unit in enumerate(tb.adapters):
            k = tb.place(unit, k)  # noqa: PLW2901
            where = f"controlnets[{k}]"
            cn.check_no_control_mask(unit, where, "a T2I-Adapter")
            if unit.union_mode is not None:
                raise InputError(f"{where} has a {{@union_mode}}, and is a T2I-Adapter", where=f"{where} union_mode",
                                 fix="leave {@union_mode} out")
            path = adapter_file(unit.net)
            assert path is not None
            from ..stamps import file_stamp

            key = (str(path.resolve()), file_stamp(path))
            net = nets.get(key)
            if net is None:
                try:
                    net = open_adapter(path, backend=self.backend, device=self.device)  # type: ignore[attr-defined]
                except (InputError, ModelError) as exc:
                    raise type(exc)(exc.what, where=f"{where} ({exc.where})" if exc.where else where,
                                    fix=exc.fix) from None
                nets[key] = net
            used.add(key)
            base = net.layout.base
            if (base == "sdxl") != (family == "sdxl"):
                want = "SDXL" if family == "sdxl" else "SD 1.x / 2.x"
                raise InputError(f"{where}: {path.name} is {net.layout.label}, and the model is {self.family.label}",  # type: ignore[attr-defined]
                                 where=where, fix=f"pass a T2I-Adapter made for {want}")
            unit.adapter = net
            unit.features = {}
            if not self._dry:  # the map made now, as a ControlNet unit's: its detector may go before the UNet loads
                self._control_tensor(unit, s.width, s.height, k)
        if not self._dry:  # an adapter this job does not use (another file, or its path written anew) goes
            for key in [key for key in nets if key not in used]:
                nets.pop(key).close()

    def _adapter_hook(self, s: Settings, call: Any, width: int, height: int, hires: bool,
                      state: cn.ControlState) -> Any:
        """The hook that feeds the UNet's T2I-Adapter inputs: each unit's features (made once per pass size) times its
        scales, summed over the units on at this step; zeros when none is (diffusers adds nothing then)."""
        from .t2iadapter import FEATURE, feature_scales, feature_shapes

        tb: Toolbox = s.toolbox
        unet = self.denoiser  # type: ignore[attr-defined]
        dtype = np.dtype(unet.inputs[f"{FEATURE}0"].dtype)
        units = [u for u in tb.adapters if cn.on_pass(u, state.hires_pass)]
        feats = []
        for k, unit in enumerate(units):
            if (width, height) not in unit.features:
                if self._dry:
                    unit.features[(width, height)] = [np.zeros((1, *sh), np.float32)
                                                      for sh in feature_shapes(unit.adapter.layout, height, width)]
                else:
                    control = self._control_tensor(unit, width, height, tb.place(unit, k))
                    unit.features[(width, height)] = unit.adapter.features(control)
            f = unit.features[(width, height)]
            feats.append((unit, [x * np.float32(c) for x, c in zip(f, feature_scales(unit, hires=hires))]))
        if not self._dry and self._releases_extra("t2i_adapter"):  # type: ignore[attr-defined]
            for unit in units:  # low memory: the adapters' graphs are not held through the denoising
                unit.adapter.close()
        shapes = [sh for sh in feature_shapes(tb.adapters[0].adapter.layout, height, width)]
        batch = call.batch

        def run(feeds: dict[str, np.ndarray]) -> Mapping[str, np.ndarray]:
            rows = np.asarray(feeds[self.family.sample_input]).shape[0]  # type: ignore[attr-defined]
            out = [np.zeros((rows, *sh), np.float32) for sh in shapes]
            for unit, f in feats:
                if not state.on(unit):
                    continue
                start = batch if unit.cond_only and rows == 2 * batch else 0  # cfg injection: the cond rows only
                for o, x in zip(out, f):
                    o[start:] += x
            return {f"{FEATURE}{i}": o.astype(dtype, copy=False) for i, o in enumerate(out)}

        return run

    def _inpaint_unit(self, s: Settings, unit: cn.ControlNet, k: int) -> None:
        """An inpaint unit (sdrt.pipelines.inpaintcn) as the extension's ``choose_input_image`` reads it: without a
        picture, the run's init image with the run's mask (blurred as the run blurs it) and the run's resize mode;
        ``inpaint_only`` restores the picture outside its mask unless the run has a mask of its own."""
        from .images import LATENT_UPSCALE
        from .inpaintcn import LAMA

        if unit.preprocessor not in cn.INPAINT_NAMES:
            return
        if unit.image is None:
            if s.init_image is None:
                raise InputError(f"controlnets[{k}] has no image: an inpaint unit takes the init image and mask of "
                                 "an img2img run, and this one makes an image from the prompt",
                                 where=f"controlnets[{k}]", fix="pass the unit's image (and its control_mask)")
            unit.image = s.init_image
            unit.control_mask = self._mask_gray(s)  # type: ignore[attr-defined]
            unit.resize = "Just Resize" if s.resize_mode == LATENT_UPSCALE else s.resize_mode
        # inpaint_only+lama restores in a run with a mask too: the extension falls back for inpaint_only alone
        unit.restores = (unit.preprocessor == "inpaint_only" and s.mask is None) or unit.preprocessor == LAMA
        unit.origin = {}
        if unit.preprocessor == LAMA and unit.resize == "Resize and Fill" and s.toolbox.hires is not None \
                and s.mode == "txt2img" and unit.detected is None:
            # the outpaint fix fits the picture to the hires pass's size in a hires run (the extension's get_control:
            # hr_y, hr_x), LaMa fills that; the first pass gets the map fitted down, the second pass it as made
            tw, th = s.toolbox.hires.target(s.width, s.height)
            unit.detected = cn.detect(unit, tw, th, f"controlnets[{k}]")

    def _no_face_tokens(self, tb: Toolbox) -> None:
        """InstantID's ControlNet is SDXL's: ``face_tokens=True`` on another family's net is refused, not left aside
        (told by its name or the keypoint preprocessor there, a net reads the prompt: :func:`ipadapter.face_contexts`)."""
        for k, unit in enumerate(tb.controlnets):
            if unit.face_tokens:
                where = f"controlnets[{tb.place(unit, k)}] face_tokens"
                raise InputError(f"{where} is on, and InstantID's ControlNet (which reads the face tokens) is an SDXL "
                                 f"one: a {self.family.label} ControlNet reads the prompt",  # type: ignore[attr-defined]
                                 where=where, fix=f"turn off {where}, or run InstantID on an SDXL model")

    def _prepare_ip_adapter(self, s: Settings) -> None:
        """The UNet with IP attention for the adapters asked for (one more attention a layer each), as its file
        has it otherwise."""
        from . import ipadapter as ipa

        units = s.toolbox.ip_adapter
        self._ip_prepared = None
        family = self.family.name  # type: ignore[attr-defined]
        if units and family not in ipa.FAMILIES:
            raise InputError(f"IP-Adapter is not supported for {self.family.label}",  # type: ignore[attr-defined]
                             where="ip_adapter", fix="use an SD 1.x, SD 2.x or SDXL model, or leave {@ip_adapter} out")
        revs = s.toolbox.revisions
        if revs:  # revision (sdrt.pipelines.revision): SDXL only, said before anything runs
            from . import revision

            slots = {id(u): k for k, u in enumerate(s.toolbox.units)}
            revision.check(self, revs, [f"controlnets[{slots[id(u)]}]" for u in revs])
        styles = s.toolbox.styles
        if styles:  # the T2I-Adapter style adapter (sdrt.pipelines.styleadapter): SD 1.x only
            from . import styleadapter

            slots = {id(u): k for k, u in enumerate(s.toolbox.units)}
            styleadapter.check(self, styles, [f"controlnets[{slots[id(u)]}]" for u in styles])
        refs = s.toolbox.references
        if refs:  # reference_only (sdrt.pipelines.refattn): checked against the model before any graph is edited
            from . import refattn

            slots = {id(u): k for k, u in enumerate(s.toolbox.units)}
            refattn.check(self, refs, [f"controlnets[{slots[id(u)]}]" for u in refs])
        if s.toolbox.adapters and family not in ipa.FAMILIES:
            raise InputError(f"T2I-Adapters are not supported for {self.family.label}",  # type: ignore[attr-defined]
                             where="controlnets", fix="use an SD 1.x or SDXL model")
        if family in ipa.FAMILIES:
            from .refattn import graph_kinds, use_graph

            heads = ipa.heads_for(self.folder.configs, family, self.family.denoiser_part)  # type: ignore[attr-defined]
            t2i = ("sdxl" if family == "sdxl" else "sd") if s.toolbox.adapters else None
            use_graph(self.denoiser, len(units), heads, *graph_kinds(refs), t2i=t2i)  # type: ignore[attr-defined]

    def _ip_conditioning(self, s: Settings, cond: Any, uncond: Any) -> tuple[Any, Any]:
        """The job's conditionings with the IP-Adapters' image inputs (sdrt.pipelines.ipadapter), or as they are."""
        units = s.toolbox.ip_adapter
        self._ip_prepared = None
        self._revision = None
        revs = s.toolbox.revisions
        if revs:  # the pictures' embeds, noised once a job (sdrt.pipelines.revision)
            from . import revision

            slots = {id(u): k for k, u in enumerate(s.toolbox.units)}
            self._revision = revision.prepare(self, revs, [f"controlnets[{slots[id(u)]}]" for u in revs], s.seed,
                                              s.prompt, s.negative_prompt)
        self._styles = None
        if s.toolbox.styles:  # the style adapter's tokens, once a job (sdrt.pipelines.styleadapter)
            from . import styleadapter

            slots = {id(u): k for k, u in enumerate(s.toolbox.units)}
            self._styles = styleadapter.prepare(self, s.toolbox.styles,
                                                [f"controlnets[{slots[id(u)]}]" for u in s.toolbox.styles])
        if not units:
            return cond, uncond
        from . import ipadapter as ipa

        preps = ipa.prepare(self, units)
        self._ip_prepared = preps  # their step windows: _control's hook
        own = getattr(self, "_hires_conds", None)  # the hires fix's own prompts: its second pass reads the images too
        if own is not None:
            self._hires_conds = ipa.conditioning(preps, self.denoiser, *own)  # type: ignore[attr-defined]
        return ipa.conditioning(preps, self.denoiser, cond, uncond)  # type: ignore[attr-defined]

    def _unit_regions(self, s: Settings) -> None:
        """Each unit's control map is made afresh for this run (``detected``, then kept for its passes), cut to the
        area an only-masked run repaints (``region``: the job's paste, sdrt.pipelines.onlymasked.Paste), as
        sd-webui-controlnet cuts a unit's input image with A1111's crop region."""
        from .onlymasked import ONLY_MASKED, Paste

        paste = getattr(self, "_paste", None)
        region = paste if s.inpaint_area == ONLY_MASKED and isinstance(paste, Paste) else None
        units = list(s.toolbox.controlnets) + list(s.toolbox.references) + list(s.toolbox.adapters)
        if isinstance(s.control_image, cn.ControlNet):  # a Flux.1 Canny/Depth model's, from --control-image
            units.append(s.control_image)
        for unit in units:
            unit.detected, unit.region = None, region
        for unit in s.toolbox.references:  # their pictures' latents (sdrt.pipelines.refattn), made anew each run
            unit.origin = {}

    def _zero_residuals(self, s: Settings) -> list[cn.ControlNet]:
        """A UNet exported with ControlNet inputs and no ControlNet asked for: the folder's first net at scale 0,
        which gives the zero residuals of the plain UNet (what diffusers feeds a net that is off)."""
        unet = self.denoiser  # type: ignore[attr-defined]
        nets = sorted(p.name for p in self.folder.path.glob("controlnet*") if (p / "model.onnx").is_file())  # type: ignore[attr-defined]
        if not nets:
            raise InputError(f"this model's {unet.name} takes ControlNet residuals and the folder has no ControlNet",
                             where="controlnets", fix="pass a ControlNet ({@@controlnets})")
        assert s.width is not None and s.height is not None
        unit = cn.ControlNet(nets[0], np.zeros((s.height, s.width, 3), np.uint8), 0.0)
        unit.part = self._control_part(unit.net, "controlnets")
        cn.check_net(unit.part, unet, "controlnets")
        if "control_type" in unit.part.inputs:  # a ControlNet Union: any type (its output is scaled by 0)
            unit.union_type = 0
        unit.control = self._control_tensor(unit, s.width, s.height, 0)
        return [unit]

    def _control_part(self, net: Any, where: str) -> Part:
        from ..checkpoint.controlnet import OpenedControlNet
        from .parts import Part

        if isinstance(net, OpenedControlNet):
            return self._control_file_part(net.path, where, net)
        path = cn.locate(net, self.folder.path)  # type: ignore[attr-defined]
        if cn.is_weights_file(path):
            return self._control_file_part(path, where)
        name = path.parent.name if path.parent.parent == self.folder.path else f"controlnet:{path.parent.name}"  # type: ignore[attr-defined]
        # a dry run (the plan) lists them with the model's parts; a real run keeps them apart, so that a
        # checkpoint, LoRA or low-memory pass over the model's parts never meets a ControlNet
        parts = self._parts if self._dry else self.control_parts
        part = parts.get(name)
        version = _folder_version(path)  # the graph or its external data written anew: a new part reads them
        if part is None or part.path != path or part.source_stamp != version:
            part = Part(name, path, backend=self.backend, device=self.device,  # type: ignore[attr-defined]
                        options=self.options)  # type: ignore[attr-defined]
            if self._dry:
                part = part.dry()
            part.source_stamp = version
            parts[name] = part
        return part

    def _control_file_part(self, path: Path, where: str, opened: Any = None) -> Part:
        """A ControlNet ``.safetensors`` bound onto the shipped weight-free graph of its base (or an
        ``OpenedControlNet`` already bound onto a graph of the caller's), checked against the model's family."""
        from ..checkpoint.controlnet import BASE_LABELS, open_controlnet
        from ..errors import SdrtError
        from ..stamps import file_stamp
        from .parts import Part

        source = path.resolve()
        name = f"controlnet:{path.parent.name if path.name in cn.WEIGHTS_NAMES else path.stem}"
        parts = self._parts if self._dry else self.control_parts
        part = parts.get(name)
        version = file_stamp(source)  # a file written anew since the part was made: a new part of the new weights
        base_id = self._control_lora_base_id()
        if part is not None and part.source_file == source and part.source_stamp == version and (
                opened is None or part.path == opened.graph) and getattr(part, "control_lora_base", base_id) == base_id:
            return part
        family = self.family.name  # type: ignore[attr-defined]
        try:
            if opened is None:
                opened = open_controlnet(path, base=family, unet=self._control_lora_base)
            elif opened.base != family:
                raise InputError(f"{path.name} is {opened.ident.label}, and the model is "
                                 f"{BASE_LABELS.get(family, family)}", where=str(path),
                                 fix=f"pass a ControlNet made for {BASE_LABELS.get(family, family)}")
        except SdrtError as exc:  # in the caller's words: which unit, and the flag
            raise type(exc)(exc.what, where=f"{where} ({exc.where})" if exc.where else where,
                            fix=f"{exc.fix} ({{@@controlnets}})" if exc.fix else None) from exc
        part = Part(name, opened.graph, backend=self.backend, device=self.device,  # type: ignore[attr-defined]
                    options=self.options)  # type: ignore[attr-defined]
        if self._dry:
            part = part.dry()
        part.weights, part.source_file = opened.weights, source
        part.source_stamp = version
        part.flux_layout = opened.flux  # a Flux net's block counts and modes
        part.sd3_layout = opened.sd3  # an SD3 net's block count and width
        if opened.ident.layout == "controllora":  # built from the UNet: made again when a checkpoint replaces it
            part.control_lora_base = base_id
        parts[name] = part
        return part

    def _control_lora_base(self) -> tuple[Any, Any]:
        """``(graph, weights)`` of the UNet a Control-LoRA's ControlNet is built from: the model's, or the checkpoint
        ``load_weights`` bound onto it, with the active LoRAs merged, as ComfyUI's ``ControlLora`` copies the patched
        UNet and the A1111 extension binds the live one (sdrt.checkpoint.controllora)."""
        den = self.denoiser  # type: ignore[attr-defined]
        state = self.__dict__.get("_weight_state")
        if state is None:
            return den.graph, den.own_weights()
        if state.loras and den.weights is not None:  # what the UNet runs now, LoRAs merged: no second merged copy
            return den.graph, den.weights
        merged = state._merge(state.loras).get(den.name, {}) if state.loras else {}
        overrides = {**state.base.get(den.name, {}), **merged}
        return den.graph, (state._weights(den.name, overrides) if overrides else den.own_weights())

    def _control_lora_base_id(self) -> tuple[int, tuple[tuple[int, float, float | None], ...]]:
        """Which checkpoint the UNet has now (0: the model's own) and which LoRAs are active, for a Control-LoRA's
        kept part."""
        state = self.__dict__.get("_weight_state")
        ckpt = getattr(state, "checkpoint", None)
        loras = tuple((id(a.lora), a.scale, a.unet_scale) for a in getattr(state, "loras", ()))
        return 0 if ckpt is None else id(ckpt), loras

    @property
    def control_parts(self) -> dict[str, Part]:
        """The ControlNet parts used so far (compiled sessions kept for the next run), by name."""
        if "_control_parts" not in self.__dict__:
            self.__dict__["_control_parts"] = {}
        return self.__dict__["_control_parts"]

    def _close_extras(self) -> None:
        for part in self.control_parts.values():
            part.close()
        own = self.__dict__.pop("_taesd", None)
        if own is not None:
            own[1].close()
        for net in self.__dict__.pop("_t2i_nets", {}).values():  # the T2I-Adapters' graphs
            net.close()
        for part in self.__dict__.pop("_ip_encoders", {}).values():  # the IP-Adapters' image encoders
            part.close()
        for up in self.__dict__.pop("_upscalers", {}).values():  # the hires fix's model upscaler
            up.close()
        for models in self.__dict__.pop("_face_models", {}).values():  # FaceID's InsightFace graphs
            models.close()
        from .revision import close as close_revision

        close_revision(self)  # revision's image encoders
        from .styleadapter import close as close_style

        close_style(self)

    def _control_tensor(self, unit: cn.ControlNet, width: int, height: int, k: int) -> np.ndarray:
        from .controlmaps import control_tensor

        made = cn.prepare_image(unit, width, height, f"controlnets[{k}]")
        if made.ndim == 3 and made.shape[2] == 4:  # an inpaint map: -1 under its mask (sdrt.pipelines.inpaintcn)
            from .inpaintcn import hint

            unit.prepared = made
            return hint(made)
        if unit.preprocessor in cn.COLORFIX_NAMES:  # its picture latent is encoded from the map (colorfix)
            unit.prepared = made
        return control_tensor(made)

    def _picture_latent(self, unit: cn.ControlNet, width: int, height: int) -> np.ndarray:
        """The VAE encoder's mean of a unit's prepared map at ``width x height`` (its RGB; an inpaint map's mask
        channel left out), the picture latent ``inpaint_only``'s restore and the colour fix read; kept per size."""
        from .reference import MEAN

        if (width, height) not in unit.origin:
            a = unit.prepared
            rgb = a[:, :, :3].astype(np.float32).transpose(2, 0, 1)[None] / np.float32(127.5) - np.float32(1.0)
            unit.origin[(width, height)] = self._encode_image(rgb, MEAN).astype(np.float32)  # type: ignore[attr-defined]
        return unit.origin[(width, height)]

    def _restore_hook(self, units: list[cn.ControlNet], ms: Any, width: int, height: int) -> Any:
        """sd-webui-controlnet's ``inpaint_only`` restore (sdrt.pipelines.inpaintcn.restore_eps) of each such unit,
        on every UNet call of the pass, after the UNet; None when no unit restores."""
        from .inpaintcn import latent_mask, restore_eps

        restoring = [u for u in units if u.restores and u.prepared is not None]
        if not restoring or self._dry:
            return None
        _check_ddpm_eps(ms, "inpaint_only restores the picture", "use the inpaint preprocessor instead on this model")
        c = self.family.latent_channels  # type: ignore[attr-defined]
        name = self.family.sample_input  # type: ignore[attr-defined]
        steps = [(unit, latent_mask(unit.prepared), self._picture_latent(unit, width, height)) for unit in restoring]

        def after(feeds: dict[str, np.ndarray], out: np.ndarray) -> np.ndarray:
            x = np.asarray(feeds[name])[:, :c]
            t = float(np.asarray(feeds["timestep"]).reshape(-1)[0])
            for unit, mask, origin in steps:
                out = restore_eps(out, x, t, ms.alphas_cumprod, mask, origin, unit.scale)
            return out

        return after

    def _colorfix_hook(self, units: list[cn.ControlNet], ms: Any, width: int, height: int, batch: int,
                       hires_pass: bool) -> Any:
        """sd-webui-controlnet's ``tile_colorfix`` / ``+sharp`` colour fix (sdrt.pipelines.colorfix.fix_eps) of each
        such unit, in unit order, on every UNet call of the pass (whatever its window and hr_option), after the UNet
        and before any ``inpaint_only`` restore; ``hires_pass``: the hires fix's second pass, where the blur of a unit that
        takes part in it is twice as wide. None when no unit has it."""
        from . import colorfix

        fixing = [u for u in units if u.preprocessor in colorfix.NAMES and u.prepared is not None]
        if not fixing or self._dry:
            return None
        _check_ddpm_eps(ms, f"{fixing[0].preprocessor} corrects the colours",
                        "use the tile_resample preprocessor instead on this model")
        c = self.family.latent_channels  # type: ignore[attr-defined]
        name = self.family.sample_input  # type: ignore[attr-defined]
        steps = []
        for unit in fixing:
            k = colorfix.radius(unit.low, hires_pass and cn.on_pass(unit, True))
            sharp = (1.0 if unit.high is None else unit.high) if unit.preprocessor == colorfix.SHARP else None
            steps.append((unit, k, sharp, self._picture_latent(unit, width, height)))

        def after(feeds: dict[str, np.ndarray], out: np.ndarray) -> np.ndarray:
            x = np.asarray(feeds[name])[:, :c]
            t = float(np.asarray(feeds["timestep"]).reshape(-1)[0])
            marks = colorfix.cond_marks(out.shape[0], batch)
            for unit, k, sharp, origin in steps:
                out = colorfix.fix_eps(out, x, t, ms.alphas_cumprod, origin, k, unit.scale, sharp, marks)
            return out

        return after

    def _inpaint_blend(self, s: Settings, images: list[np.ndarray]) -> list[np.ndarray]:
        """sd-webui-controlnet's ``inpaint_only`` post-processing of the decoded images (each restoring unit's last
        map, the hires pass's in a hires run), in unit order."""
        from .inpaintcn import blend_pixels

        units = [u for u in s.toolbox.controlnets if u.restores and u.prepared is not None]
        for unit in units:  # (the extension skips a map of another size than the image, with an error in its log)
            images = [blend_pixels(im, unit.prepared) if unit.prepared.shape[:2] == im.shape[:2] else im
                      for im in images]
        return images

    # ------------------------------------------------------------------ noise
    def _noise(self, s: Settings, shape: tuple[int, ...], seed: int, subseed: int | None, first: bool = False) -> Any:
        """The run's noise; ``first``: a first pass's (not the hires pass's). With an ``inpaint_only+lama`` unit the
        first pass of the job's first batch draws noise leaning towards the filled picture's latent, as the
        extension's ``HackedImageRNG`` (sdrt.pipelines.inpaintcn.LeanNoise; the last such unit's, at its size)."""
        from .toolbox import noise_source

        generator = noise_source(s.toolbox, shape, seed, subseed)
        if not first or not self.__dict__.pop("_lama_noise", False) or self._dry:
            return generator
        from .inpaintcn import LAMA, LeanNoise

        units = [u for u in s.toolbox.controlnets if u.preprocessor == LAMA and u.prepared is not None
                 and u.lean_noise]
        if not units or s.width is None or s.height is None:
            return generator
        ms = self.family.model_sampling(s.width, s.height)  # type: ignore[attr-defined]
        _check_ddpm_eps(ms, "inpaint_only+lama starts from noise leaning towards the filled picture",
                        "use the inpaint preprocessor instead on this model")
        return LeanNoise(generator, self._picture_latent(units[-1], s.width, s.height), ms.alphas_cumprod)

    # ------------------------------------------------------------------ a transformer's ControlNets' latents
    def _encode_controls(self, s: Settings, uncond: Any, generator: Any, size: tuple[int, int] | None = None) -> None:
        """Flux / SD3 ControlNets: each unit's control picture VAE-encoded with samples from the run's generator
        before the init image's and the noise are drawn, in txt2img, img2img and inpainting alike (diffusers'
        ControlNet pipelines of the family prepare the control image first); nothing for other families.
        ``size``: the hires fix's second pass, whose pictures are the first pass's control maps resized to its
        (width, height) with each unit's resize mode (sd-webui-controlnet's ``detectmap_proc`` at the hires size; the
        preprocessor is not run again) and encoded before the upscaled image is, the order the ControlNet img2img
        pipeline at that size draws in."""
        tb: Toolbox = s.toolbox
        nets = _transformer_nets(self.family.name)  # type: ignore[attr-defined]
        if nets is None or not tb.controlnets:
            return
        # a unit left out of this pass (its hr_option) is not encoded: the pass draws as it would without it
        hires_pass = None if tb.hires is None else size is not None
        units = [unit for unit in tb.controlnets if cn.on_pass(unit, hires_pass)]
        if not units:
            return
        pictures = None
        if size is not None:  # the units keep the first pass's pictures: the job's next image starts at that size
            from .fluxtools import control_image

            pictures = [control_image(unit, *size) for unit in units]
        guided = uncond is not None and s.cfg != 1.0  # SD3's nets read both CFG halves' rows
        nets.encode_controls(self, units, s.batch, generator, pictures, guided=guided)

    # ------------------------------------------------------------------ ControlNet on the model call
    def _control(self, s: Settings, call: Any, width: int, height: int,
                 second: bool | None = None) -> cn.ControlState | None:
        """The ControlNet hook of a pass at ``width x height`` and the IP-Adapters' step windows (the state the loop
        moves after each step, None when nothing reads it); ``second``: whether it is the hires fix's second pass
        (None: judged by its size), which a unit's hr_option and the hires pass's soft injection of canny read."""
        state = self._control_nets(s, call, width, height, second)
        styles = getattr(self, "_styles", None)
        if styles is not None:  # after revision's change of the context (inserted before it), before the nets
            from .styleadapter import hook as style_hook

            if state is None:
                state = cn.ControlState()
            hires = (width, height) != (s.width, s.height) if second is None else second
            state.hires_pass = hires if s.toolbox.hires is not None else None
            call.hooks.insert(0, style_hook(styles, state, batch=call.batch,
                                            text_input=self.family.text_input))  # type: ignore[attr-defined]
        rev = getattr(self, "_revision", None)
        if rev is not None:  # first: the nets and the reference pass read the text it changes, as the extension's
            from .revision import hook as revision_hook

            if state is None:
                state = cn.ControlState()
            call.hooks.insert(0, revision_hook(rev, state, batch=call.batch,
                                               text_input=self.family.text_input))  # type: ignore[attr-defined]
        preps = getattr(self, "_ip_prepared", None)
        if preps:
            from .ipadapter import window_hook

            if state is None:
                state = cn.ControlState()
            gate = window_hook(preps, self.denoiser, state)  # type: ignore[attr-defined]
            if gate is not None:
                call.hooks.append(gate)
        if s.toolbox.adapters:  # T2I-Adapters: their features, fed to the UNet's intrablock inputs
            hires = (width, height) != (s.width, s.height) if second is None else second
            if state is None:
                state = cn.ControlState()
            state.hires_pass = hires if s.toolbox.hires is not None else None
            call.hooks.append(self._adapter_hook(s, call, width, height, bool(hires), state))
        refs = s.toolbox.references
        if refs:  # reference_only: the write pass, then the banks of the call (sdrt.pipelines.refattn), last
            from .refattn import hook

            hires = (width, height) != (s.width, s.height) if second is None else second
            if state is None:
                state = cn.ControlState()
            state.hires_pass = hires if s.toolbox.hires is not None else None
            call.hooks.append(hook(self, refs, self.denoiser, state,  # type: ignore[attr-defined]
                                   getattr(self, "_ref_generator", None), width=width, height=height,
                                   batch=call.batch, hires=bool(hires),
                                   sample_name=self.family.sample_input,  # type: ignore[attr-defined]
                                   slots=[s.toolbox.place(u, k) for k, u in enumerate(refs)]))
        return state

    def _control_nets(self, s: Settings, call: Any, width: int, height: int,
                      second: bool | None = None) -> cn.ControlState | None:
        """The ControlNet hook of a pass (:meth:`_control`)."""
        tb: Toolbox = s.toolbox
        units = tb.controlnets or self._silent_units
        if not units:
            return None
        hires = (width, height) != (s.width, s.height) if second is None else second
        state = cn.ControlState(hires_pass=hires if tb.hires is not None else None)
        nets = _transformer_nets(self.family.name)  # type: ignore[attr-defined]
        if nets is not None:  # (the control latents: _encode_controls, before the init or upscaled image's)
            call.hooks.append(nets.hook(self, units, state, call))
            return state
        from .ipadapter import face_contexts

        # InstantID's ControlNet reads the face tokens of the run's InstantID IP-Adapter (sdrt.pipelines.ipadapter)
        face_contexts(getattr(self, "_ip_prepared", None), self.denoiser,  # type: ignore[attr-defined]
                      units, [f"controlnets[{tb.place(u, k)}]" for k, u in enumerate(units)],
                      sdxl=self.family.name == "sdxl")  # type: ignore[attr-defined]
        # the hires pass: the first pass's map resized to its size; the next image's first pass at its own again
        for k, unit in enumerate(units):
            if unit.control is None or tuple(unit.control.shape[-2:]) != (height, width):
                unit.control = self._control_tensor(unit, width, height, tb.place(unit, k))
        call.hooks.append(cn.hook(units, self.denoiser, state,  # type: ignore[attr-defined]
                                  latent_channels=self.family.latent_channels,  # type: ignore[attr-defined]
                                  sample_name=self.family.sample_input,  # type: ignore[attr-defined]
                                  batch=call.batch, hires=hires))
        # the extension's order: the colour fix, then the inpaint_only restore
        ms = self.family.model_sampling(width, height)  # type: ignore[attr-defined]
        fix = self._colorfix_hook(list(units), ms, width, height, call.batch, state.hires_pass is True)
        if fix is not None:
            call.after.append(fix)
        restore = self._restore_hook(list(units), ms, width, height)
        if restore is not None:
            call.after.append(restore)
        return state

    def _release_nets(self, s: Settings, hires_next: bool) -> None:
        """After a denoising pass: release the ControlNets whose last pass in this run is over (all of them, or with
        the hires pass still to come those it leaves out: ``hr_option``) when low-memory mode or the memory plan
        releases them (``_releases_extra``), so the VAE decode and the hires upscale do not hold them."""
        if self._dry:
            return
        units = s.toolbox.controlnets or self._silent_units
        done = [u.part for u in units if u.part is not None and not (hires_next and cn.on_pass(u, True))]
        go = [p for p in {id(p): p for p in done}.values() if self._releases_extra(p.name)]  # type: ignore[attr-defined]
        if go:
            from .lowmem import release

            release(go)

    # ------------------------------------------------------------------ previews
    def preview(self, upscale: int = 1) -> np.ndarray | None:
        """From a step callback: the current step's preview (HxWx3 uint8), or None outside a step.

        The denoised estimate of the step, projected with the family's latent-to-RGB factors (``upscale``
        repeats pixels), or decoded by the TAESD-family decoder given as ``preview=`` (its longer side at most
        ``preview_size``, 256 pixels unless asked otherwise)."""
        x = self._current
        if x is None:
            return None
        from .preview import TaesdPreview, project

        if self._preview_fn is not None and not isinstance(self._preview_fn, TaesdPreview):
            return self._preview_fn(x)  # the caller's own function: the latent as the sampler holds it
        # the model whose latents these are: a hires checkpoint's in its pass (sdrt.pipelines.hiresmodel)
        src = getattr(self, "_hires_decoder", None) or self
        # the family's usual latent space (Playground v2.5's normalized latents mapped back to SDXL's)
        x = src.family.preview_latents(x)  # type: ignore[attr-defined]
        if self._preview_fn is not None:
            from .hiresmodel import latent_space

            if src is self or latent_space(src) == latent_space(self):  # type: ignore[arg-type]
                return self._preview_fn(x)  # a TAESD of the first model's latents: not for another space's
        # the family's own factors (sd2 -> sd1, chroma -> flux): SD3, Flux and Chroma got SD 1.x's 4-channel ones
        return project(x, src.family.name, upscale=upscale)  # type: ignore[attr-defined]

    def _step_done(self, loop: Any, latents: np.ndarray, state: cn.ControlState | None, index: int,
                   total: int) -> None:
        """After step ``index`` (0-based): the ControlNet window moves on, the preview latent is set."""
        if state is not None:
            state.step, state.total = index + 1, total
        denoised = getattr(loop, "denoised", None)
        self._denoised = np.asarray(denoised if denoised is not None else latents)  # the batch (Interrupted.partial)
        self._current = self._denoised[0]

    # ------------------------------------------------------------------ hires fix
    def _model_upscaler(self, path: Any) -> Any:
        """The hires fix's model upscaler for ``path``, on this pipeline's backend and device (kept while its file
        is the same version: one written anew at the path is opened anew, as a ControlNet file is)."""
        from ..stamps import file_stamp
        from .upscaler import ModelUpscaler

        cache = self.__dict__.setdefault("_upscalers", {})
        key = (path, file_stamp(path))
        if key not in cache:
            for old in cache.values():
                old.close()
            cache.clear()  # one model upscaler at a time: its sessions hold its weights
            cache[key] = ModelUpscaler(path, backend=self.backend, device=self.device,  # type: ignore[attr-defined]
                                       options=self.options)  # type: ignore[attr-defined]
        return cache[key]

    def _hires_pass(self, s: Settings, x: np.ndarray, seed: int, subseed: int | None, cond: Any, uncond: Any,
                    on_step: Any, offset: int, refiner: Any = None) -> np.ndarray:
        """A1111's second pass: upscale the first pass's latent (or image), then img2img at the target size.
        ``refiner``: the run's :class:`sdrt.pipelines.refiner.Run` (the model the pass calls, the VAE between)."""
        import dataclasses

        from .families import ModelCall
        from .hires import crop_latent, second_pass_steps, upscale_image, upscale_latent
        from .images import to_nchw

        other = getattr(self, "_hires_job", None)
        if other is not None and other is not self:  # A1111's hr_checkpoint_name: the pass runs on another model
            from .hiresmodel import second_pass

            return second_pass(self, other, s, x, seed, subseed, on_step, offset)  # type: ignore[arg-type]
        tb: Toolbox = s.toolbox
        hr = tb.hires
        assert s.width is not None and s.height is not None
        tw, th = hr.target(s.width, s.height)
        uw, uh = hr.upscaled(s.width, s.height)  # the size the picture is upscaled to, then cropped to tw x th
        total_steps, run = second_pass_steps(hr, s.steps)
        # its own sampler and schedule (A1111's hr_sampler_name / hr_scheduler), each the first pass's when unset
        s2 = dataclasses.replace(s, width=tw, height=th, steps=total_steps, choice=hr.choice((s.sampler, s.choice)))
        own = getattr(self, "_hires_conds", None)  # its own prompts' conditioning (A1111's hr_c / hr_uc)
        if own is not None:
            cond, uncond = own
        shape = self.family.latent_shape(s.batch, th, tw)  # type: ignore[attr-defined]
        generator = self._noise(s2, shape, seed, subseed)
        ms = self.family.model_sampling(tw, th)  # type: ignore[attr-defined]
        loop = self._loop(s2, ms, generator, seed, start=total_steps - run)  # type: ignore[attr-defined]
        # the model loaded now decodes and encodes (A1111's sd_model): the refiner's VAE once it has taken over
        vae = refiner.vae if refiner is not None else self
        # a Flux / SD3 net's control maps resized to the target size, their latents drawn before the upscaled
        # image's (the order of the ControlNet img2img pipeline at that size)
        self._encode_controls(s, uncond, generator, (tw, th))
        if hr.latent:
            latents = upscale_latent(x, hr, uh, uw)
        else:
            images = vae._decode(x)
            if hr.model is not None and self._dry:  # the plan: the same sizes, no model compiled or run
                big = [upscale_image(im, uw, uh, "Lanczos") for im in images]
            elif hr.model is not None:
                up = self._model_upscaler(hr.model)
                big = [up.upscale_to(im, uw, uh) for im in images]
                if self._releases_extra("upscaler"):  # type: ignore[attr-defined]  # its last use in the run
                    up.close()
            else:
                big = [upscale_image(im, uw, uh, hr.upscaler) for im in images]
            latents = np.concatenate([vae._encode_image(to_nchw(im), generator) for im in big], axis=0)
        latents = crop_latent(latents, *hr.crop(s.width, s.height))  # both of hires_width and hires_height given
        noise = generator.randn(shape)
        x2 = loop.start(noise, latents)
        call = ModelCall(tw, th, s.batch, s.cfg, cond, uncond, guidance=s.guidance,  # Flux dev: its distilled guidance
                         guidance_rescale=s.guidance_rescale)
        self._ref_generator = generator  # the reference units' noise (sdrt.pipelines.refattn)
        state = self._control(s, call, tw, th, second=True)
        model = self.family.denoiser(self._model_part(), ms, call)  # type: ignore[attr-defined]
        if refiner is not None:
            model = refiner.second_pass(model, ms, tw, th, loop.steps)
        total = loop.steps
        if state is not None:
            state.total = total

        def step(i: int, latents: np.ndarray) -> None:
            self._step_done(loop, latents, state, i, total)
            on_step(offset + i, latents)

        return loop.run(model, x2, callback=step)

    # ------------------------------------------------------------------ infotext
    def _extras_infotext(self, s: Settings, index: int) -> dict[str, object]:
        from .toolbox import seed_fields

        tb: Toolbox = s.toolbox
        info: dict[str, object] = {}
        info.update(seed_fields(tb, index))
        if tb.hires is not None:
            other = getattr(self, "_hires_job", None) if tb.hires_checkpoint is not None else None
            if other is not None:  # A1111's "Hires checkpoint": its short title, whichever model it names
                from .hiresmodel import title

                info.update(tb.hires.infotext((s.sampler, s.choice), s.prompt, s.negative_prompt, title(other)))
            else:
                info.update(tb.hires.infotext((s.sampler, s.choice), s.prompt, s.negative_prompt))
        units = tb.units if tb.references or tb.adapters or tb.revisions or tb.styles else tb.controlnets  # model-free / T2I units where given
        if units:
            info.update(cn.infotext(units, s.width or 0, s.height or 0))
        if tb.ip_adapter:  # the extension's IP-Adapter units, after the ControlNet ones
            from .ipadapter import infotext as ip_infotext

            info.update(ip_infotext(tb.ip_adapter, self.family.name, len(units)))  # type: ignore[attr-defined]
        if tb.refiner is not None:  # after the hires fields, as A1111 adds them when the refiner swaps in
            from .refiner import infotext

            info.update(infotext(self, s))  # type: ignore[arg-type]
        return info


def _folder_version(path: Path) -> Any:
    """The versions (``stamps.file_stamp``) of an ONNX graph's file and the files beside it (its external data,
    which old exports keep one file per tensor): a stat each."""
    from ..stamps import file_stamp

    try:
        files = sorted(p for p in path.parent.iterdir() if p.is_file())
    except OSError:
        files = [path]
    return tuple((p.name, file_stamp(p)) for p in files)


def _transformer_nets(family: str) -> Any:
    """The module that runs this family's ControlNets on its transformer (``prepare``, ``use_residuals``,
    ``hook``: residual inputs added by a graph edit), or None for the UNet families (``sdrt.pipelines.controlnet``)."""
    if family == "flux":
        from . import fluxcontrolnet

        return fluxcontrolnet
    if family == "sd3":
        from . import sd3controlnet

        return sd3controlnet
    return None

