"""The ControlNet preprocessors that need no model: their names, sliders, resolutions, and the one call that runs them.

Names and sliders are sd-webui-controlnet's (``low`` is its ``threshold_a``, ``high`` its ``threshold_b``):

======================  ===========================================  ==================  ==========
preprocessor            low / high                                   at a resolution     module
======================  ===========================================  ==================  ==========
none                    -                                            -                   -
canny                   Canny low 100 / high 200 (>= 0)              padded to 64        controlmaps
scribble, threshold     level 127 (0 to 255)                         padded to 64        controlmaps
invert                  -                                            -                   controlmaps
tile_resample           Down Sampling Rate 1 (>= 0; < 1.1: as is)    -                   tilemaps
blur_gaussian           Sigma 9 (above 0, up to 256)                 scaled, no padding  tilemaps
lineart_standard        -                                            padded to 64        linemaps
scribble_xdog           XDoG Threshold 32 (>= 0)                     padded to 64        linemaps
shuffle                 - (seeded: :mod:`shufflemap`)                scaled, no padding  shufflemap
color                   -                                            its own (area)      colormaps
recolor_luminance       Gamma Correction 1 (0 to 256)                -                   colormaps
recolor_intensity       Gamma Correction 1 (0 to 256)                -                   colormaps
dw_openpose_full        - (DWPose's two ONNX files: ``models``)      padded to 64        posedetect, posemaps
animal_openpose         - (YOLOX and RTMPose AP10K ONNX: ``models``) padded to 64        animalpose, posedetect
openpose                - (``body_pose_model.pth``: ``models``)      padded to 64        openposebody, posemaps
lineart_realistic       - (``sk_model.pth``: ``models``)             padded to 64        lineartnets
lineart_coarse          - (``sk_model2.pth``: ``models``)            padded to 64        lineartnets
lineart_anime           - (``netG.pth``: ``models``)                 padded to 64        lineartnets
lineart_anime_denoise   - (``erika.pth``: ``models``)                padded to 64        lineartnets
mlsd                    MLSD Value 0.1 / Distance 0.1 (>= 0)         padded to 64        mlsdmaps
                        (``mlsd_large_512_fp32.pth``: ``models``)
depth_midas             - (``dpt_hybrid-midas-501f0c75.pt``)        padded to 64        midasdepth
normal_midas            Normal Background Threshold 0.4 (0 to 1)    padded to 64        midasdepth
softedge_hed            - (``ControlNetHED.pth``: ``models``)        padded to 64        hedmaps
softedge_hedsafe        - (``ControlNetHED.pth``: ``models``)        padded to 64        hedmaps
scribble_hed            - (``ControlNetHED.pth``: ``models``)        padded to 64        hedmaps
softedge_pidinet        - (``table5_pidinet.pth``: ``models``)       padded to 64        pidimaps, hedmaps
softedge_pidisafe       - (``table5_pidinet.pth``: ``models``)       padded to 64        pidimaps, hedmaps
scribble_pidinet        - (``table5_pidinet.pth``: ``models``)       padded to 64        pidimaps, hedmaps
t2ia_sketch_pidi        - (``table5_pidinet.pth``: ``models``)       padded to 64        pidimaps, hedmaps
softedge_teed           Safe Steps 2, 0 to 10 (``7_model.pth``)      padded to 64        teedmaps
softedge_anyline        Safe Steps 2, 0 to 10 (``MTEED.pth``)        padded to 64        anylinemaps, teedmaps
normal_bae              - (``scannet.pt``: ``models``)               padded to 64        normalbae
depth_anything          - (V1 ``.pth``: ``models``)                  padded to 64        depthanything
depth_anything_v2       - (V2 ``.safetensors``/``.pth``: ``models``) padded to 64        depthanything
inpaint, inpaint_only   - (the picture and its mask: RGBA)           -                   inpaintcn
inpaint_only+lama       - (RGBA; ``ControlNetLama.pth``: ``models``)  its own (256)       lamafill, inpaintcn
tile_colorfix           Variation 8 (whole, 0 to 256)                -                   colorfix
tile_colorfix+sharp     Variation 8 / Sharpness 1 (0 to 100)         -                   colorfix
openpose_hand           - (body and ``hand_pose_model.pth``)         padded to 64        openposehand, openposeparts
openpose_face           - (body and ``facenet.pth``)                 padded to 64        openposeface, openposeparts
openpose_faceonly       - (body and ``facenet.pth``; face drawn)     padded to 64        openposeface, openposeparts
openpose_full           - (body, hand and face ``.pth`` files)       padded to 64        openposeparts
depth_leres             Remove Near % 0 / Remove Background % 0      padded to 64        leresdepth
                        (0 to 100; ``res101.pth``: ``models``)
depth_leres++           as depth_leres (and ``latest_net_G.pth``)    padded to 64        leresboost, leresdepth
depth_zoe               - (``ZoeD_M12_N.pt``: ``models``)            padded to 64        zoedepth
seg_ufade20k            - (``upernet_global_small.pth``: ``models``) padded to 64        uniformerseg, segpalette
seg_anime_face          - (``UNet.pth``: ``models``)                 padded to 64        animeface
reference_only          Style Fidelity 0.5 (0 to 1; the picture)     -                   refattn
reference_adain         Style Fidelity 0.5 (0 to 1; the picture)     -                   refattn
reference_adain+attn    Style Fidelity 0.5 (0 to 1; the picture)     -                   refattn
revision_clipvision     Noise Augmentation 0 (0 to 1; ViT-bigG/14)   -                   revision
revision_ignore_prompt  Noise Augmentation 0 (0 to 1; ViT-bigG/14)   -                   revision
t2ia_style_clipvision   - (CLIP ViT-L/14 ``clip_vitl.pth``: models)  -                   styleadapter
======================  ===========================================  ==================  ==========

"At a resolution": with a processor resolution the image's shorter side is scaled to it first, as the
extension's ``resize_image_with_pad`` does; "padded to 64" maps are made on the image padded with its edges to
multiples of 64 and cropped back (the padding can change a map that looks at whole-image statistics, as
lineart_standard's median does, exactly as in the extension); without a resolution (None) the map is made at
the image's own size. ``tile_colorfix`` / ``tile_colorfix+sharp``'s map is the image as it is (the extension's
``identity``); their sliders are read while sampling, by the colour fix of :mod:`sdrt.pipelines.colorfix`.
``instant_id_face_keypoints`` (no sliders; ``models``: InsightFace antelopev2's ``scrfd_10g_bnkps.onnx``) is
InstantID's ``draw_kps`` of the largest face's 5 points on black, padded to 64 (:mod:`sdrt.pipelines.faces`).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from .annotators import ANNOTATORS
from .colormaps import MAX_GAMMA
from .controlmaps import finite_number

#: LaMa's fill before the inpaint hint (sdrt.pipelines.lamafill)
LAMA = "inpaint_only+lama"
__all__ = ["LAMA", "lama", "lama_fill", "MAX_NET_PIXELS", "NAMES", "held", "keep_preprocessors", "kept_detectors", "release", "Detector", "detector", "kind_of", "SPECS", "WITH_MODELS", "check_net_pixels", "map_size", "model_files", "SOFTEDGE", "softedge_map", "softedge_net", "depth_anything", "dwpose", "lineart", "midas", "mlsd", "normal_bae", "openpose_body", "openpose_parts", "pose_detect", "pose_map", "Slider", "Spec", "check_thresholds", "preprocess", "threshold_fields", "leres", "leres_boost", "zoe", "seg_ufade20k", "seg_anime_face"]


@dataclass(frozen=True)
class Slider:
    """A threshold a preprocessor reads: its default and the values the pipeline takes (``above``: the lower
    bound is excluded)."""

    default: float
    low: float
    high: float = math.inf
    above: bool = False
    whole: bool = False


@dataclass(frozen=True)
class Spec:
    #: "pad" (scaled and padded to 64, cropped after), "scale" (scaled only), "own" (the map scales itself), None
    resolution: str | None
    low: Slider | None = None
    high: Slider | None = None
    seeded: bool = False
    #: made by a model whose files the caller names (``models=``; :mod:`sdrt.pipelines.annotators` says which)
    models: bool = False


SPECS: dict[str, Spec] = {
    "none": Spec(None),
    "canny": Spec("pad", Slider(100, 0), Slider(200, 0)),
    "scribble": Spec("pad", Slider(127, 0, 255, whole=True)),
    "threshold": Spec("pad", Slider(127, 0, 255)),
    "invert": Spec(None),
    "tile_resample": Spec(None, Slider(1.0, 0)),
    "lineart_standard": Spec("pad"),
    "scribble_xdog": Spec("pad", Slider(32, 0)),
    "shuffle": Spec("scale", seeded=True),
    "color": Spec("own"),
    "blur_gaussian": Spec("scale", Slider(9.0, 0, 256, above=True)),
    "recolor_luminance": Spec(None, Slider(1.0, 0, MAX_GAMMA)),
    "recolor_intensity": Spec(None, Slider(1.0, 0, MAX_GAMMA)),
    "dw_openpose_full": Spec("pad", models=True),
    "animal_openpose": Spec("pad", models=True),
    "openpose": Spec("pad", models=True),
    "lineart_realistic": Spec("pad", models=True),
    "lineart_coarse": Spec("pad", models=True),
    "lineart_anime": Spec("pad", models=True),
    "lineart_anime_denoise": Spec("pad", models=True),
    "mlsd": Spec("pad", Slider(0.1, 0), Slider(0.1, 0), models=True),
    "depth_midas": Spec("pad", models=True),
    "normal_midas": Spec("pad", Slider(0.4, 0, 1), models=True),
    **{n: Spec("pad", models=True) for n in ("softedge_hed", "softedge_hedsafe", "scribble_hed", "softedge_pidinet",
                                              "softedge_pidisafe", "scribble_pidinet", "t2ia_sketch_pidi")},
    "softedge_teed": Spec("pad", Slider(2, 0, 10, whole=True), models=True),
    "softedge_anyline": Spec("pad", Slider(2, 0, 10, whole=True), models=True),
    "normal_bae": Spec("pad", models=True),
    "depth_anything": Spec("pad", models=True),
    "depth_anything_v2": Spec("pad", models=True),
    # the picture and its mask as the inpaint ControlNet's hint (made by sdrt.pipelines.inpaintcn, not here)
    "inpaint": Spec(None),
    "inpaint_only": Spec(None),
    # the same, LaMa's fill first (sdrt.pipelines.lamafill: at 256 on the shorter side, whatever the resolution)
    "inpaint_only+lama": Spec(None, models=True),
    # the image as it is; the sliders are the colour fix's while sampling (sdrt.pipelines.colorfix)
    "tile_colorfix": Spec(None, Slider(8.0, 0, 256, whole=True)),
    "tile_colorfix+sharp": Spec(None, Slider(8.0, 0, 256, whole=True), Slider(1.0, 0, 100)),
    "openpose_hand": Spec("pad", models=True),
    "openpose_face": Spec("pad", models=True),
    "openpose_faceonly": Spec("pad", models=True),
    "openpose_full": Spec("pad", models=True),
    "depth_leres": Spec("pad", Slider(0, 0, 100), Slider(0, 0, 100), models=True),
    "depth_leres++": Spec("pad", Slider(0, 0, 100), Slider(0, 0, 100), models=True),
    # InstantID's ControlNet hint: the largest face's 5 points (InsightFace antelopev2's detector; sdrt.pipelines.faces)
    "instant_id_face_keypoints": Spec("pad", models=True),
    "depth_zoe": Spec("pad", models=True),
    "seg_ufade20k": Spec("pad", models=True),
    "seg_anime_face": Spec("pad", models=True),
    # the picture as it is: its latent guides the UNet's attention (sdrt.pipelines.refattn); low: style fidelity
    **{n: Spec(None, Slider(0.5, 0, 1)) for n in ("reference_only", "reference_adain", "reference_adain+attn")},
    # no map: the picture's CLIP embedding replaces SDXL's pooled text vector (sdrt.pipelines.revision); low: the
    # noise augmentation; the model: OpenCLIP ViT-bigG/14
    **{n: Spec(None, Slider(0.0, 0, 1), models=True) for n in ("revision_clipvision", "revision_ignore_prompt")},
    # no map: the T2I-Adapter style adapter's tokens of the picture's CLIP ViT-L/14 tokens join the text context
    # (sdrt.pipelines.styleadapter); the net is the adapter, the model the encoder
    "t2ia_style_clipvision": Spec(None, models=True),
}
#: the soft-edge preprocessors: (network, map kind) (:func:`sdrt.pipelines.hedmaps.detect`)
SOFTEDGE = {"softedge_hed": ("hed", "soft"), "softedge_hedsafe": ("hed", "safe"), "scribble_hed": ("hed", "scribble"),
            "softedge_pidinet": ("pidinet", "soft"), "softedge_pidisafe": ("pidinet", "safe"),
            "scribble_pidinet": ("pidinet", "scribble"), "t2ia_sketch_pidi": ("pidinet", "sketch"), "softedge_teed": ("teed", "safe"),
            "softedge_anyline": ("mteed", "anyline")}
NAMES = tuple(SPECS)
#: the preprocessors that read a processor resolution
AT_RESOLUTION = tuple(n for n, s in SPECS.items() if s.resolution is not None)
#: sd-webui-controlnet's default resolution slider, where a preprocessor's is not 512 (PreprocessorAnyline: 1280)
DEFAULT_RESOLUTION = {"softedge_anyline": 1280}


def default_resolution(name: str | None) -> int:
    """The extension's default processor resolution for preprocessor ``name`` (512 but where it sets another)."""
    return DEFAULT_RESOLUTION.get(name or "none", 512)
#: the OpenPose modules that run the hand or face model beside the body's
OPENPOSE_PARTS = ("openpose_hand", "openpose_face", "openpose_faceonly", "openpose_full")
#: the preprocessors that run a model (their files given as ``models``)
WITH_MODELS = tuple(n for n, s in SPECS.items() if s.models)
#: the most pixels a processor resolution may make of an image a network reads (2048 x 8192: 4:1 at the extension's
#: largest resolution): a 16x128 strip at 2048 would be 2048x16384, ~19 GB of HED activations
MAX_NET_PIXELS = 2048 * 8192
#: the model-backed preprocessors whose network reads the image at a size of its own (DWPose's 640 and 384 boxes,
#: OpenPose's 368, Depth Anything's 518 with its own 4:1 limit), not at the processor resolution
_OWN_SIZE = ("dw_openpose_full", "openpose", "depth_anything", "depth_anything_v2", "animal_openpose",
             "inpaint_only+lama", "instant_id_face_keypoints")
#: the preprocessors whose network reads a whole image given at its own size (padded to 64): bounded by
#: :data:`MAX_NET_PIXELS` there too, as at a processor resolution (HED on a 6000x4000 photo took ~13 GB;
#: depth_leres++'s numpy steps run at the image's size); every model-backed one but those that resize it themselves
#: (the OpenPose parts read the image at OpenPose's own scales, and crops of it)
_PADDED_OWN = tuple(n for n, s in SPECS.items() if s.models and n not in _OWN_SIZE and not n.startswith("openpose"))
_DWPOSE: dict[tuple, Any] = {}
_DWPOSE_LOCK = threading.Lock()


def check_thresholds(name: str, low: Any, high: Any, where: str,
                     names: tuple[str, str] | None = None) -> tuple[float | None, float | None]:
    """``(low, high)`` as floats, checked against the preprocessor's sliders (every unit's, in
    ``controlnet.parse_units``); an ``InputError`` naming ``{where} low`` / ``high`` (or ``names``, the
    caller's words for the two) for a value it cannot use, or for a threshold the preprocessor does not read."""
    spec = SPECS[name]
    out: list[float | None] = []
    for k, (arg, value, slider) in enumerate((("low", low, spec.low), ("high", high, spec.high))):
        if value is None:
            out.append(None)
            continue
        field = names[k] if names else f"{where} {arg}"
        if slider is None:
            what = names[k] if names else f"{arg} threshold"
            raise InputError(f"{field}: the {name} preprocessor reads no {what}", where=field,
                             fix=f"leave {names[k] if names else arg} out for {name}")
        if not finite_number(value):
            raise InputError(f"{field}, {_what(name, k)}, must be a finite number, got {value!r:.40}", where=field,
                             fix=_fix(names[k] + " " if names else arg + "=", slider))
        v = float(value)
        bad = v <= slider.low if slider.above else v < slider.low
        if bad or v > slider.high or (slider.whole and not v.is_integer()):
            raise InputError(f"{field}, {_what(name, k)}, must be {_range(slider)}, got {v:g}", where=field,
                             fix=_fix(names[k] + " " if names else arg + "=", slider))
        out.append(v)
    return out[0], out[1]


def _what(name: str, k: int = 0) -> str:
    if name == "mlsd":
        return ("the MLSD value threshold", "the MLSD distance threshold")[k]
    if name in ("depth_leres", "depth_leres++"):
        return ("the remove near %", "the remove background %")[k]
    return {"tile_resample": "the down sampling rate", "scribble_xdog": "the XDoG threshold",
            "blur_gaussian": "the blur's sigma", "canny": "a canny threshold", "scribble": "the scribble level",
            "threshold": "the threshold level", "normal_midas": "the normal background threshold",
            "softedge_teed": "TEED's safe steps", "softedge_anyline": "Anyline's safe steps",
            "tile_colorfix": "the colour fix's variation",
            "tile_colorfix+sharp": ("the colour fix's variation", "the sharpness")[k], "reference_only": "the style fidelity",
            "reference_adain": "the style fidelity", "reference_adain+attn": "the style fidelity",
            "revision_clipvision": "the noise augmentation", "revision_ignore_prompt": "the noise augmentation"}.get(name, "the gamma correction")


def _range(s: Slider) -> str:
    kind = "a whole number" if s.whole else "a number"
    if math.isinf(s.high):
        return f"{kind} >= {s.low:g}"
    if s.above:
        return f"{kind} above {s.low:g}, up to {s.high:g}"
    return f"{kind} from {s.low:g} to {s.high:g}"


def _fix(arg: str, slider: Slider) -> str:
    return f"pass e.g. {arg}{slider.default:g} (the extension's default)"


def threshold_fields(name: str, low: float | None, high: float | None) -> list[tuple[str, str]]:
    """The infotext's ``Threshold A`` / ``Threshold B`` of a preprocessor that reads them (defaults filled in)."""
    spec = SPECS.get(name, SPECS["none"])
    items = []
    for label, value, slider in (("Threshold A", low, spec.low), ("Threshold B", high, spec.high)):
        if slider is not None:
            v = slider.default if value is None else value
            items.append((label, str(int(v)) if float(v).is_integer() else f"{float(v):g}"))
    return items


def dwpose(models: Any, backend: str = "auto", device: Any = None, where: str = "models") -> Any:
    """The :class:`sdrt.pipelines.posedetect.DWPose` of ``models`` (a folder holding ``yolox_l.onnx`` and
    ``dw-ll_ucoco_384.onnx``, or one of the extension's / ComfyUI's layouts under it, or the two files), compiled
    once per files (of one version), backend and device, and kept (one a backend and device)."""
    from .posedetect import DWPose

    files = model_files("dw_openpose_full", models, where)
    return _kept("dw_openpose_full", files, backend, device, lambda be, dev: DWPose(files[0], files[1], backend=be,
                                                                                   device=dev))


#: how many idle compiled detectors each backend and device keeps after use (:func:`keep_preprocessors`)
_KEEP = [1]
_USERS: dict[tuple, int] = {}  # key -> threads using that detector now
_USED: dict[tuple, int] = {}  # key -> when it was last asked for (a count)
_STALE: set[tuple] = set()  # a detector of files written anew or read from elsewhere: closed once idle
_HOLDING = threading.local()  # the keys this thread uses inside ``held()``
_TICK = [0]


def keep_preprocessors(n: int | None = None) -> int:
    """How many compiled model-backed preprocessors (DWPose, MiDaS, ...) stay loaded per backend and device once
    no job uses them, the most recently used first (default 1: the last one; 0: each is closed after its maps are
    made); ``n`` sets it (None: reads it). Returns the value before. One in use is never closed: it goes once idle."""
    before = _KEEP[0]
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InputError(f"keep_preprocessors must be a whole number >= 0, got {n!r:.40}", where="keep_preprocessors",
                             fix="pass e.g. 1 (the last used one stays loaded) or 0 (none)")
        with _DWPOSE_LOCK:
            _KEEP[0] = n
            _trim()
    return before


class held:
    """``with held(): ...``: the detectors this thread asks for inside are in use until the block ends (no other
    thread's trim closes them); then the idle ones beyond :func:`keep_preprocessors` per backend and device go."""

    def __enter__(self) -> held:
        self.outer = getattr(_HOLDING, "keys", None)
        _HOLDING.keys = [] if self.outer is None else self.outer
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.outer is not None:
            return
        keys, _HOLDING.keys = _HOLDING.keys, None
        with _DWPOSE_LOCK:
            # one use: the networks a preprocessor ran together (openpose_full's body, hand and face) share the
            # time of the last one asked for, so they are kept or let go together
            tick = max((_USED.get(k, 0) for k in keys), default=0)
            for key in keys:
                _USERS[key] -= 1
                if not _USERS[key]:
                    del _USERS[key]
                if key in _DWPOSE:
                    _USED[key] = tick
            _trim()


def _trim(protect: tuple | None = None) -> None:
    """Close the idle detectors beyond the bound on each backend and device, the least recently used first, and
    stale ones; never one in use (nor ``protect``, the one just handed out). Under the lock."""
    groups: dict[tuple, list[tuple]] = {}
    for key in _DWPOSE:
        groups.setdefault(key[1:3], []).append(key)
    for keys in groups.values():
        fresh = [k for k in keys if k not in _STALE]
        last = sorted({_USED.get(k, 0) for k in fresh}, reverse=True)[:_KEEP[0]]  # the last uses (a use's nets share
        drop = [k for k in keys if k in _STALE] + [k for k in fresh if _USED.get(k, 0) not in last]  # its tick)
        for key in drop:
            if key == protect or _USERS.get(key):
                continue
            _STALE.discard(key)
            _USED.pop(key, None)
            _DWPOSE.pop(key).close()


def release(kind: str | None = None, files: Any = None) -> int:
    """Close the idle kept detectors (of ``kind`` and ``files`` where given): the memory plan's release of a
    preprocessor once its maps are made. Returns how many were closed; one in use stays."""
    names = None if files is None else {str(f) for f in files}
    if kind in OPENPOSE_PARTS or kind == "depth_leres++":  # its networks are kept under their own kinds: by files
        kind = None
    closed = 0
    with _DWPOSE_LOCK:
        for key in list(_DWPOSE):
            own = key[3:3 + (len(key) - 3) // 2]  # (kind, backend, device, *files, *their stamps)
            if (kind is not None and key[0] != kind) or (names is not None and not set(own) <= names):
                continue
            if _USERS.get(key):
                continue
            _STALE.discard(key)
            _USED.pop(key, None)
            _DWPOSE.pop(key).close()
            closed += 1
    return closed


def kept_detectors() -> list[tuple[str, str, str, bool]]:
    """``(kind, backend, device, in use)`` of each compiled detector kept now, the most recently used first."""
    with _DWPOSE_LOCK:
        return [(k[0], k[1], k[2], bool(_USERS.get(k))) for k in sorted(_DWPOSE, key=lambda k: -_USED.get(k, 0))]


def _kept(kind: str, files: tuple[Any, ...], backend: str, device: Any, make: Any) -> Any:
    """The pose detector ``make(backend, device)`` of ``files``, kept: one per kind, backend and device (serve runs
    a job per device at once, and /controlnet/detect beside them), keyed on the files' versions (a file written anew
    at its path is another detector: the kept one would refuse its changed file); that kind's older one on the
    same backend and device is closed, never a graph another device's job is running. Of the idle ones, only
    :func:`keep_preprocessors` per backend and device stay (the most recently used); inside :class:`held` the
    detector is in use, and no other thread closes it until the block ends."""
    if backend != "auto":  # keyed as they resolve: a job's (the pipeline's device) and serve's detect's (None) are one
        from ..runtime import select

        be, dev = select(backend, device)
        backend, device = be.name, dev
    from ..stamps import file_stamp

    key = (kind, backend, str(device), *(str(f) for f in files), *(file_stamp(f) for f in files))
    holding = getattr(_HOLDING, "keys", None)
    with _DWPOSE_LOCK:
        _TICK[0] += 1
        _USED[key] = _TICK[0]
        if key not in _DWPOSE:
            _STALE.update(k for k in _DWPOSE if k[:3] == key[:3])
            try:
                _DWPOSE[key] = make(backend, device)
            except BaseException:
                _USED.pop(key, None)
                raise
        if holding is not None:  # the trim waits for the use's end (its other networks are asked for next)
            holding.append(key)
            _USERS[key] = _USERS.get(key, 0) + 1
        else:
            _trim(protect=key)
        return _DWPOSE[key]


def check_net_pixels(height: int, width: int, resolution: int | None) -> None:
    """A ``ControlImageError`` when an image a preprocessor's network reads, ``height x width`` at processor
    resolution ``resolution`` (None: the image's own size), is above :data:`MAX_NET_PIXELS` (its activations would
    take tens of gigabytes)."""
    from .controlmaps import ControlImageError

    if height * width > MAX_NET_PIXELS:
        at = "at its own size" if resolution is None else f"at processor resolution {resolution}"
        err = ControlImageError(f"the control image {at} would be {width}x{height} "
                                f"for the preprocessor's network, above {MAX_NET_PIXELS} pixels (2048x8192)",
                                where="sdrt.pipelines.preprocessors.processor_res",
                                fix="pass a smaller processor resolution, or crop the image to nearer a square"
                                if resolution is not None else "pass a processor resolution (e.g. 512), or a "
                                "smaller image")
        err.threshold = "processor_res"  # type: ignore[attr-defined]  # a unit's error names its resolution
        raise err


def _check_read(name: str, height: int, width: int, resolution: int | None) -> None:
    """The refusals of the networks that resize the padded ``height x width`` image themselves: seg_anime_face's
    (512 on its shorter side, bounded by :data:`MAX_NET_PIXELS` there), seg_ufade20k's (at least 32 on each side)."""
    if name == "seg_anime_face":
        from .animeface import check_size
    elif name == "seg_ufade20k":
        from .uniformerseg import check_size
    else:
        return
    check_size(height, width, resolution)


def map_size(name: str, height: int, width: int, resolution: int | None) -> tuple[int, int]:
    """``(height, width)`` of the map model-backed preprocessor ``name`` makes of a ``height x width`` image at
    ``resolution`` (None: the image's own size), worked out without running its network (a run plan's: the map is
    resized to the output size anyway), with the refusals that making it gives first: a side above ``MAX_SIDE`` on
    the way, or a network's image above :data:`MAX_NET_PIXELS`."""
    from .controlmaps import processor_size

    spec = SPECS[name]
    if resolution is None and name in _PADDED_OWN:  # the network reads the whole image, padded to 64
        check_net_pixels(height + -height % 64, width + -width % 64, None)
        _check_read(name, height + -height % 64, width + -width % 64, None)
    if resolution is None or spec.resolution not in ("pad", "scale"):
        return height, width
    th, tw = processor_size(height, width, resolution)
    if name in WITH_MODELS and name not in _OWN_SIZE:  # the network reads the image padded to 64, as _made pads it
        check_net_pixels(th + -th % 64 if spec.resolution == "pad" else th,
                         tw + -tw % 64 if spec.resolution == "pad" else tw, resolution)
        _check_read(name, th + -th % 64, tw + -tw % 64, resolution)
    return th, tw


def kind_of(name: str) -> str:
    """The kept detector model-backed preprocessor ``name`` runs (``depth_midas`` and ``normal_midas``: ``midas``;
    the three HED ones: ``hed``), as :func:`kept_detectors` and the memory plan name it."""
    if name in ("depth_midas", "normal_midas"):
        return "midas"
    return SOFTEDGE[name][0] if name in SOFTEDGE else name


@dataclass(frozen=True)
class Detector:
    """A model-backed preprocessor's detector as a job's memory plan counts it (an extra part of role
    ``preprocessor``): its kind (:func:`kind_of`) and files; ``path``: the first (the plan's identity)."""

    kind: str
    files: tuple[Path, ...]

    @property
    def path(self) -> Path:
        return self.files[0]

    def weight_bytes(self) -> int:
        """Bytes of its weights as it runs them: a ``.pth`` / ``.safetensors`` file's tensors as float32 (the
        networks are rebuilt in float32), an ONNX file's size (DWPose's graphs as they are). Headers only."""
        from ..weights import Weights

        total = 0
        for f in self.files:
            if Path(f).suffix.lower() == ".onnx":
                total += Path(f).stat().st_size
            else:
                total += sum(4 * math.prod(shape) for shape in Weights.open(f).shapes().values())
        return total


def detector(name: str, models: Any, where: str = "models") -> Detector:
    """The :class:`Detector` model-backed preprocessor ``name`` runs from ``models``."""
    return Detector(kind_of(name), model_files(name, models, where))


def model_files(name: str, models: Any, where: str) -> tuple[Path, ...]:
    """The files model-backed preprocessor ``name`` reads, found in ``models`` (the file, the files, or a folder in
    the extension's / ComfyUI's layout: :mod:`sdrt.pipelines.annotators`); an ``InputError`` naming ``where``."""
    from .annotators import ANNOTATORS, find, need

    files = find(name, models, where)
    own = {*ANNOTATORS[name].names, *ANNOTATORS[name].alternatives, *(n for o in ANNOTATORS[name].apart for n in o)}
    for f in files:  # a file given by path under another preprocessor's name: the same shapes would run unnoticed
        other = next((n for n, a in ANNOTATORS.items() if f.name not in own and f.name in (
            *a.names, *a.alternatives, *(m for o in a.apart for m in o))), None)  # (lineart_coarse's sk_model2.pth as lineart_realistic; Depth Anything V1's as V2)
        if other is not None:
            raise InputError(f"{where}: {f} is the {other} preprocessor's file, and {name} needs {need(name)}",
                             where=where, fix=f"pass {need(name)}, or use preprocessor {other}")
    return files


def animal_pose(models: Any, backend: str = "auto", device: Any = None, where: str = "models") -> Any:
    """The :class:`sdrt.pipelines.animalpose.AnimalPose` of ``models`` (``yolox_l.onnx`` and the AP10K model, a
    folder holding them in the extension's or ComfyUI's layout, or the two files), kept as :func:`dwpose`'s are."""
    from .animalpose import AnimalPose

    files = model_files("animal_openpose", models, where)
    return _kept("animal_openpose", files, backend, device,
                 lambda be, dev: AnimalPose(files[0], files[1], backend=be, device=dev))


def openpose_body(models: Any, backend: str = "auto", device: Any = None, where: str = "models") -> Any:
    """The :class:`sdrt.pipelines.openposebody.OpenPoseBody` of ``models`` (``body_pose_model.pth`` or a folder
    holding it in the extension's layout), kept as :func:`dwpose`'s are."""
    from .openposebody import OpenPoseBody

    (path,) = model_files("openpose", models, where)
    return _kept("openpose", (path,), backend, device, lambda be, dev: OpenPoseBody(path, backend=be, device=dev))


def lineart(name: str, models: Any, backend: str = "auto", device: Any = None, where: str = "models") -> Any:
    """The :mod:`sdrt.pipelines.lineartnets` detector of model-backed lineart preprocessor ``name`` from ``models``
    (its file, or a folder holding it in the extension's or ComfyUI's layout), kept as :func:`dwpose`'s are."""
    from .lineartnets import DETECTORS

    (path,) = model_files(name, models, where)
    return _kept(name, (path,), backend, device, lambda be, dev: DETECTORS[name](path, backend=be, device=dev))


def face_detector(models: Any, backend: str = "auto", device: Any = None, where: str = "models") -> Any:
    """InsightFace antelopev2's SCRFD detector (``scrfd_10g_bnkps.onnx`` or a folder holding it in the extension's or
    ComfyUI's layout) as a :class:`sdrt.pipelines.faces.FaceModels` that detects only, kept as :func:`dwpose`'s are."""
    from .faces import FaceModels

    (path,) = model_files("instant_id_face_keypoints", models, where)
    return _kept("instant_id_face_keypoints", (path,), backend, device,
                 lambda be, dev: FaceModels.detector_only(path, backend=be, device=dev))


def face_keypoints(rgb: np.ndarray, detector: Any, where: str = "image") -> np.ndarray:
    """sd-webui-controlnet's ``instant_id_face_keypoints`` map of an image (already at its resolution, padded):
    InstantID's ``draw_kps`` of the largest face's 5 points; InputError on ``where`` when there is no face."""
    from .controlmaps import ControlImageError
    from .faces import draw_kps, largest

    faces = detector.detect(rgb)
    if not faces:  # a control image error: a unit's says the unit (serve's field, the CLI's flag), not "image"
        raise ControlImageError(f"InsightFace's detector finds no face in the picture ({rgb.shape[1]}x{rgb.shape[0]}), "
                                "whose keypoints instant_id_face_keypoints draws", where=where,
                                fix="pass a picture with a face in it, large enough to see, or a keypoint map made "
                                    "elsewhere, without this preprocessor")
    return draw_kps(rgb.shape[0], rgb.shape[1], largest(faces).kps)


def mlsd(models: Any, backend: str = "auto", device: Any = None, where: str = "models") -> Any:
    """The :class:`sdrt.pipelines.mlsdmaps.MLSD` of ``models`` (``mlsd_large_512_fp32.pth`` or a folder holding it
    in the extension's or ComfyUI's layout), kept as :func:`dwpose`'s are."""
    from .mlsdmaps import MLSD

    (path,) = model_files("mlsd", models, where)
    return _kept("mlsd", (path,), backend, device, lambda be, dev: MLSD(path, backend=be, device=dev))


def midas(models: Any, backend: str = "auto", device: Any = None, where: str = "models") -> Any:
    """The :class:`sdrt.pipelines.midasdepth.MidasDepth` of ``models`` (``dpt_hybrid-midas-501f0c75.pt`` or a
    folder holding it in the extension's / ComfyUI's layout), kept as :func:`dwpose`'s are (one for both
    ``depth_midas`` and ``normal_midas``)."""
    from .midasdepth import MidasDepth

    (path,) = model_files("depth_midas", models, where)
    return _kept("midas", (path,), backend, device, lambda be, dev: MidasDepth(path, backend=be, device=dev))
def softedge_net(name: str, models: Any, backend: str = "auto", device: Any = None, where: str = "models") -> Any:
    """The soft-edge network preprocessor ``name`` runs (:class:`sdrt.pipelines.hedmaps.HED`,
    :class:`sdrt.pipelines.pidimaps.PiDiNet` :class:`sdrt.pipelines.teedmaps.TEED` or :class:`sdrt.pipelines.anylinemaps.MTEED`) from ``models``, kept as
    :func:`dwpose`'s are (one per network, backend and device: the three HED preprocessors share one)."""
    net = SOFTEDGE[name][0]
    (path,) = model_files(name, models, where)

    def make(be: str, dev: Any) -> Any:
        if net == "hed":
            from .hedmaps import HED

            return HED(path, backend=be, device=dev)
        if net == "pidinet":
            from .pidimaps import PiDiNet

            return PiDiNet(path, backend=be, device=dev)
        if net == "mteed":
            from .anylinemaps import MTEED

            return MTEED(path, backend=be, device=dev)
        from .teedmaps import TEED

        return TEED(path, backend=be, device=dev)

    return _kept(net, (path,), backend, device, make)


def softedge_map(rgb: np.ndarray, name: str, net: Any, size: tuple[int, int] | None, safe_steps: float | None = None
                 ) -> np.ndarray:
    """The map of soft-edge preprocessor ``name`` by ``net`` (:func:`softedge_net`) of an image padded to 64
    (``size``: its unpadded ``(h, w)``; None: padded here), cropped to that size; ``safe_steps``: TEED's slider."""
    from . import controlmaps as cm

    rgb = cm.checked_rgb(rgb, "sdrt.pipelines." + {"hed": "hedmaps", "pidinet": "pidimaps", "teed": "teedmaps",
                                                   "mteed": "anylinemaps"}[SOFTEDGE[name][0]])
    if name == "softedge_anyline":
        from .anylinemaps import detect as anyline_detect

        return anyline_detect(rgb, net, 2 if safe_steps is None else int(safe_steps), size)
    if name == "softedge_teed":
        from .teedmaps import detect as teed_detect

        return teed_detect(rgb, net, 2 if safe_steps is None else int(safe_steps), size)
    from .hedmaps import detect

    return detect(rgb, net, SOFTEDGE[name][1], size)


def normal_bae(models: Any, backend: str = "auto", device: Any = None, where: str = "models") -> Any:
    """The :class:`sdrt.pipelines.normalbae.NormalBae` of ``models`` (``scannet.pt`` or a folder holding it in the
    extension's or ComfyUI's layout), kept as :func:`dwpose`'s are."""
    from .normalbae import NormalBae

    (path,) = model_files("normal_bae", models, where)
    return _kept("normal_bae", (path,), backend, device, lambda be, dev: NormalBae(path, backend=be, device=dev))


def seg_ufade20k(models: Any, backend: str = "auto", device: Any = None, where: str = "models") -> Any:
    """The :class:`sdrt.pipelines.uniformerseg.UniformerSeg` of ``models`` (``upernet_global_small.pth`` or a folder
    holding it in the extension's or ComfyUI's layout), kept as :func:`dwpose`'s are."""
    from .uniformerseg import UniformerSeg

    (path,) = model_files("seg_ufade20k", models, where)
    return _kept("seg_ufade20k", (path,), backend, device, lambda be, dev: UniformerSeg(path, backend=be, device=dev))


def seg_anime_face(models: Any, backend: str = "auto", device: Any = None, where: str = "models") -> Any:
    """The :class:`sdrt.pipelines.animeface.AnimeFaceSeg` of ``models`` (``UNet.pth`` or a folder holding it in the
    extension's or ComfyUI's layout), kept as :func:`dwpose`'s are."""
    from .animeface import AnimeFaceSeg

    (path,) = model_files("seg_anime_face", models, where)
    return _kept("seg_anime_face", (path,), backend, device, lambda be, dev: AnimeFaceSeg(path, backend=be, device=dev))


def depth_anything(models: Any, name: str = "depth_anything", backend: str = "auto", device: Any = None,
                   where: str = "models") -> Any:
    """The :class:`sdrt.pipelines.depthanything.DepthAnything` of ``models`` for ``name`` (``depth_anything``: V1,
    ``depth_anything_v2``: V2; the file or a folder holding it in the extension's, Forge's or ComfyUI's layout),
    kept as :func:`dwpose`'s are."""
    from .depthanything import DepthAnything

    (path,) = model_files(name, models, where)
    version = 2 if name == "depth_anything_v2" else 1
    return _kept(name, (path,), backend, device, lambda be, dev: DepthAnything(path, version, backend=be, device=dev))


def leres(models: Any, backend: str = "auto", device: Any = None, where: str = "models") -> Any:
    """The :class:`sdrt.pipelines.leresdepth.LeresDepth` of ``models`` (``res101.pth`` or a folder holding it in the
    extension's or ComfyUI's layout), kept as :func:`dwpose`'s are."""
    from .leresdepth import LeresDepth

    (path,) = model_files("depth_leres", models, where)
    return _kept("depth_leres", (path,), backend, device, lambda be, dev: LeresDepth(path, backend=be, device=dev))


def zoe(models: Any, backend: str = "auto", device: Any = None, where: str = "models") -> Any:
    """The :class:`sdrt.pipelines.zoedepth.ZoeDepth` of ``models`` (``ZoeD_M12_N.pt`` or a folder holding it in the
    extension's, Forge's or ComfyUI's layout), kept as :func:`dwpose`'s are."""
    from .zoedepth import ZoeDepth

    (path,) = model_files("depth_zoe", models, where)
    return _kept("depth_zoe", (path,), backend, device, lambda be, dev: ZoeDepth(path, backend=be, device=dev))


def leres_boost(models: Any, backend: str = "auto", device: Any = None, where: str = "models") -> Any:
    """The :class:`sdrt.pipelines.leresboost.LeresBoost` of ``models`` (``res101.pth`` and ``latest_net_G.pth``, or a
    folder holding them in the extension's or ComfyUI's layout): LeReS kept as ``depth_leres``' (shared with it), the
    merge network as ``leres_pix2pix``, kept or let go together as :func:`openpose_parts`' networks."""
    from .leresboost import LeresBoost, Pix2PixMerge
    from .leresdepth import LeresDepth

    res101, generator = model_files("depth_leres++", models, where)
    with held():
        leres = _kept("depth_leres", (res101,), backend, device,
                      lambda be, dev: LeresDepth(res101, backend=be, device=dev))
        merge = _kept("leres_pix2pix", (generator,), backend, device,
                      lambda be, dev: Pix2PixMerge(generator, backend=be, device=dev))
    return LeresBoost(leres, merge)


def openpose_parts(name: str, models: Any, backend: str = "auto", device: Any = None, where: str = "models") -> Any:
    """The :class:`sdrt.pipelines.openposeparts.OpenPoseParts` of ``openpose_hand`` / ``openpose_face`` /
    ``openpose_faceonly`` / ``openpose_full``: its files found in ``models`` (:mod:`sdrt.pipelines.annotators`),
    each network kept as :func:`dwpose`'s are (the body's shared with ``openpose``)."""
    from .openposebody import OpenPoseBody
    from .openposeface import FACE_FILE, FaceNet
    from .openposehand import HAND_FILE, HandNet
    from .openposeparts import OpenPoseParts

    files = model_files(name, models, where)  # the body's file first, then the hand's and the face's
    body = files[0]
    with held():  # one use: the body's, hand's and face's networks are kept (or let go) together
        nets = {"body": _kept("openpose", (body,), backend, device,
                              lambda be, dev: OpenPoseBody(body, backend=be, device=dev))}
        kinds = [k for k, f in (("hand", HAND_FILE), ("face", FACE_FILE)) if f in ANNOTATORS[name].names]
        for kind, path in zip(kinds, files[1:]):
            cls = HandNet if kind == "hand" else FaceNet
            nets[kind] = _kept(f"openpose_{kind}_model", (path,), backend, device,
                               lambda be, dev, cls=cls, path=path: cls(path, backend=be, device=dev))
    return OpenPoseParts(name, nets["body"], nets.get("hand"), nets.get("face"))


def lama(models: Any, backend: str = "auto", device: Any = None, where: str = "models") -> Any:
    """The :class:`sdrt.pipelines.lamafill.Lama` of ``models`` (``ControlNetLama.pth`` or a folder holding it in the
    extension's or ComfyUI's layout), kept as :func:`dwpose`'s are."""
    from .lamafill import Lama

    (path,) = model_files(LAMA, models, where)
    return _kept(LAMA, (path,), backend, device, lambda be, dev: Lama(path, backend=be, device=dev))


def lama_fill(rgba: np.ndarray, models: Any, backend: str = "auto", device: Any = None,
              where: str = "models") -> np.ndarray:
    """``inpaint_only+lama``'s map of an RGBA map (the picture and its mask, white = repaint; HxWx4 uint8): LaMa's
    fill under the mask, the mask as alpha (:func:`sdrt.pipelines.lamafill.fill`), the network in use meanwhile."""
    from .lamafill import fill

    with held():
        return fill(rgba, lama(models, backend, device, where))


def pose_map(rgb: np.ndarray, detector: Any) -> np.ndarray:
    """The ``dw_openpose_full`` map of an image as the extension makes it (body, hands and face)."""
    return pose_detect(rgb, detector)[0]


def pose_detect(rgb: np.ndarray, detector: Any) -> tuple[np.ndarray, dict[str, Any]]:
    """``(map, OpenPose JSON)`` of an image (the one the detector reads: at a resolution, already padded): the
    extension's ``dw_openpose_full`` map and the JSON its ``json_pose_callback`` receives (pixels of that image)."""
    from . import animalpose, posemaps

    h, w = rgb.shape[:2]
    if isinstance(detector, animalpose.AnimalPose):  # animal_openpose: the animals' map and JSON
        animals = detector(rgb)
        return animalpose.draw(animals, h, w), animalpose.to_json(animals, h, w)
    if hasattr(detector, "people"):  # OpenPose's torch models: keypoints as fractions of the image
        people = detector.people(rgb)
        body, hands, face = getattr(detector, "drawn", (True, False, False))  # the body model alone: body only
        return posemaps.draw(people, h, w, body=body, hands=hands, face=face), posemaps.to_json(people, h, w)
    people = posemaps.people_from_keypoints(detector(rgb))
    return posemaps.draw(people, h, w), posemaps.to_json(people, h, w)


def preprocess(rgb: np.ndarray, name: str, low: float | None = None, high: float | None = None,
               resolution: int | None = None, seed: int | None = None, *, models: Any = None,
               backend: str = "auto", device: Any = None, where: str = "models") -> np.ndarray:
    """The control map (HxWx3 uint8) of an HxWx3 uint8 image: ``name`` with its thresholds (None: the defaults),
    at ``resolution`` (the shorter side; None: the image's own size); ``seed``: shuffle's numpy seed (None: 0);
    ``models``: the files of a preprocessor that runs a model (``dw_openpose_full``: DWPose's folder or two files;
    the lineart models: their ``.pth`` or a folder holding it),
    compiled on ``backend``/``device`` and in use until the map is made (:class:`held`); ``where``: how the
    caller names ``models`` in errors."""
    with held():
        return _made(rgb, name, low, high, resolution, seed, models, backend, device, where)


def _made(rgb: np.ndarray, name: str, low: float | None, high: float | None, resolution: int | None,
          seed: int | None, models: Any, backend: str, device: Any, where: str) -> np.ndarray:
    from . import controlmaps as cm

    spec = SPECS[name]
    if name in ("softedge_teed", "softedge_anyline"):  # its network's loop count: NaN was a ValueError, -1 or 1e9 a map run as it fell
        check_thresholds(name, low, None, "sdrt.pipelines.preprocessors.preprocess")
    if name in ("depth_leres", "depth_leres++"):  # NaN would make a black map, 1e9 too: refused as units are
        check_thresholds(name, low, high, "sdrt.pipelines.preprocessors.preprocess")
    lo = spec.low.default if spec.low is not None and low is None else low
    hi = spec.high.default if spec.high is not None and high is None else high
    crop = None
    if resolution is not None and spec.resolution in ("pad", "scale"):
        rgb, crop = cm.processor_input(rgb, resolution)
        if spec.resolution == "scale":  # the extension crops its padding off before these maps
            rgb, crop = np.ascontiguousarray(rgb[:crop[0], :crop[1]]), None
        if name in WITH_MODELS and name not in _OWN_SIZE:
            check_net_pixels(rgb.shape[0], rgb.shape[1], resolution)
            _check_read(name, rgb.shape[0], rgb.shape[1], resolution)
    elif name in _PADDED_OWN and np.ndim(rgb) >= 2:  # at its own size the detector pads the whole image to 64
        h, w = np.shape(rgb)[:2]
        check_net_pixels(h + -h % 64, w + -w % 64, None)
        _check_read(name, h + -h % 64, w + -w % 64, None)
    if name == "canny":
        rgb = cm.to_rgb(cm.canny(rgb, lo, hi))
    elif name == "scribble":
        rgb = cm.to_rgb(cm.scribble(rgb, int(lo)))
    elif name == "threshold":
        rgb = cm.threshold(rgb, int(lo))
    elif name == "invert":
        rgb = cm.invert(rgb)
    elif name in ("tile_colorfix", "tile_colorfix+sharp", "reference_only", "reference_adain", "reference_adain+attn"):
        rgb = cm.to_rgb(rgb)  # the extension's identity (sdrt.pipelines.colorfix, sdrt.pipelines.refattn)
        rgb = cm.to_rgb(rgb)
    elif name in ("inpaint", "inpaint_only"):  # the picture as it is (/controlnet/detect's); a run's hint holds its
        rgb = cm.to_rgb(rgb)  # mask too (sdrt.pipelines.inpaintcn)
    elif name == LAMA:  # the picture with its mask as alpha (HxWx4): LaMa's fill, its RGB (/controlnet/detect's)
        if np.ndim(rgb) != 3 or np.shape(rgb)[2] != 4 or np.asarray(rgb).dtype != np.uint8:
            raise InputError(f"{where}: inpaint_only+lama fills a mask, and the image has none (give an RGBA uint8 "
                             "image, the mask as alpha, white = repaint)", where=where,
                             fix="pass the picture with its mask as the alpha channel")
        rgb = np.ascontiguousarray(lama_fill(np.asarray(rgb), models, backend, device, where)[:, :, :3])
    elif name in ("tile_resample", "blur_gaussian"):
        from . import tilemaps

        rgb = tilemaps.tile_resample(rgb, lo) if name == "tile_resample" else tilemaps.blur_gaussian(rgb, lo)
    elif name in ("lineart_standard", "scribble_xdog"):
        from . import linemaps

        rgb = linemaps.lineart_standard(rgb) if name == "lineart_standard" else linemaps.scribble_xdog(rgb, lo)
    elif name == "dw_openpose_full":
        rgb = pose_map(cm.checked_rgb(rgb, "sdrt.pipelines.posedetect"), dwpose(models, backend, device, where))
    elif name == "animal_openpose":
        rgb = pose_map(cm.checked_rgb(rgb, "sdrt.pipelines.animalpose"), animal_pose(models, backend, device, where))
    elif name == "openpose":
        rgb = pose_map(cm.checked_rgb(rgb, "sdrt.pipelines.openposebody"),
                       openpose_body(models, backend, device, where))
    elif name in ("lineart_realistic", "lineart_coarse", "lineart_anime", "lineart_anime_denoise"):
        # without a resolution the detector pads to 64 itself, as resize_image_with_pad at the image's own size
        rgb = cm.to_rgb(lineart(name, models, backend, device, where)(cm.checked_rgb(rgb, "sdrt.pipelines.lineartnets")))
    elif name == "mlsd":
        from .mlsdmaps import line_map

        rgb = line_map(cm.checked_rgb(rgb, "sdrt.pipelines.mlsdmaps"), mlsd(models, backend, device, where), lo, hi)
    elif name in ("depth_midas", "normal_midas"):
        depth, normal = midas(models, backend, device, where).maps(cm.checked_rgb(rgb, "sdrt.pipelines.midasdepth"),
                                                                    0.1 if lo is None else lo)
        rgb = cm.to_rgb(depth) if name == "depth_midas" else normal
    elif name in SOFTEDGE:  # the map is cropped before scribble's post-processing, as the extension crops it
        rgb, crop = softedge_map(rgb, name, softedge_net(name, models, backend, device, where), crop, lo), None
    elif name == "normal_bae":
        from .normalbae import normal_map

        rgb = normal_map(cm.checked_rgb(rgb, "sdrt.pipelines.normalbae"), normal_bae(models, backend, device, where))
    elif name == "seg_ufade20k":  # the detector pads to 64 itself without a resolution
        from .uniformerseg import seg_map

        rgb = seg_map(cm.checked_rgb(rgb, "sdrt.pipelines.uniformerseg"), seg_ufade20k(models, backend, device, where))
    elif name == "seg_anime_face":  # the extension's crop: the map's top-left corner, at 512 whatever the resolution
        from .animeface import face_map

        rgb = face_map(cm.checked_rgb(rgb, "sdrt.pipelines.animeface"), seg_anime_face(models, backend, device, where))
    elif name in ("depth_anything", "depth_anything_v2"):
        det = depth_anything(models, name, backend, device, where)
        rgb = cm.to_rgb(det.map(cm.checked_rgb(rgb, "sdrt.pipelines.depthanything")))
    elif name == "depth_leres":  # the detector pads to 64 itself without a resolution
        det = leres(models, backend, device, where)
        rgb = cm.to_rgb(det(cm.checked_rgb(rgb, "sdrt.pipelines.leresdepth"), lo, hi))
    elif name == "depth_zoe":  # the detector pads to 64 itself without a resolution
        rgb = cm.to_rgb(zoe(models, backend, device, where)(cm.checked_rgb(rgb, "sdrt.pipelines.zoedepth")))
    elif name == "depth_leres++":
        det = leres_boost(models, backend, device, where)
        rgb = cm.to_rgb(det(cm.checked_rgb(rgb, "sdrt.pipelines.leresboost"), lo, hi))
    elif name == "instant_id_face_keypoints":
        rgb = face_keypoints(cm.checked_rgb(rgb, "sdrt.pipelines.faces"), face_detector(models, backend, device, where))
    elif name in OPENPOSE_PARTS:
        rgb = pose_map(cm.checked_rgb(rgb, "sdrt.pipelines.openposeparts"),
                       openpose_parts(name, models, backend, device, where))
    elif name == "shuffle":
        from .shufflemap import content_shuffle

        rgb = content_shuffle(rgb, 0 if seed is None else seed)
    elif name in ("color", "recolor_luminance", "recolor_intensity"):
        from . import colormaps

        rgb = (colormaps.color_grid(rgb, resolution) if name == "color" else
               colormaps.recolor_luminance(rgb, lo) if name == "recolor_luminance" else
               colormaps.recolor_intensity(rgb, lo))
    return rgb if crop is None else np.ascontiguousarray(rgb[:crop[0], :crop[1]])
