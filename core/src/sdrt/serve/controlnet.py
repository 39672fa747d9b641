"""sd-webui-controlnet's API on sdrt's ControlNet: ``alwayson_scripts.controlnet`` units and ``/controlnet/*``.

A unit (the extension's ``ControlNetUnit``, as ``external_code.to_processing_unit`` reads a dict: ``input_image``
for ``image``, ``guidance`` for ``guidance_end``, ``lowvram``/``guessmode`` for ``low_vram``/``guess_mode``,
``mask``/``mask_image`` beside the image; ``control_mode`` 0/1/2 or its names, run as the extension runs them, and
``guess_mode: true`` as "ControlNet is more important", the extension's conversion while it read the field) becomes a :class:`sdrt.pipelines.ControlNet`. Its ``model`` is looked up
in the registry (``ControlNet/`` of the models folder, and the model folder's own ``controlnet*`` parts); its
``module`` is one of the extension's model-free preprocessors sdrt has (``none``, ``canny``, ``invert``,
``threshold``, and ControlNet 1.0's ``scribble``); anything else is a 400 naming the unit's field. What sdrt runs
differently is named in ``info.sdrt_not_honoured``, and a unit's keys that are no ControlNetUnit field in
``info.sdrt_ignored_fields``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import FileChanged, InputError, ModelError, SdrtError, WeightsError
from ..pipelines.controlmaps import RESIZE_MODES as CONTROL_RESIZE_MODES
from ..pipelines.preprocessors import OPENPOSE_PARTS, WITH_MODELS
from . import b64images, kontext
from .errors import ApiError
from .fields import get_bool, get_float
from .registry import ModelEntry, Registry

#: the modules whose detect answers poses too (OpenPose JSON)
POSE_MODULES = ("dw_openpose_full", "openpose", *OPENPOSE_PARTS, "animal_openpose")
#: ``/controlnet/version``: the extension's API version
API_VERSION = 2
#: the most units one request may hold (each distinct net is a model the worker loads)
MAX_UNITS = 8
#: the extension's module names (and its UI alias names) -> sdrt's preprocessor (sdrt.pipelines.preprocessors)
MODULES = {name: name for name in ("none", "canny", "invert", "threshold", "scribble", "tile_resample",
                                   "lineart_standard", "scribble_xdog", "shuffle", "color", "blur_gaussian",
                                   "recolor_luminance", "recolor_intensity", "dw_openpose_full", "openpose",
                                   "mlsd", "normal_bae", "depth_anything", "depth_anything_v2",
                                   "openpose_hand", "openpose_face", "openpose_faceonly", "openpose_full")}
#: the lineart models (sdrt.pipelines.lineartnets): the extension's "lineart" is its UI's lineart_realistic
MODULES.update({"lineart": "lineart_realistic", "lineart_coarse": "lineart_coarse", "lineart_anime": "lineart_anime",
                "lineart_anime_denoise": "lineart_anime_denoise"})
MODULES.update({"depth": "depth_midas", "normal_map": "normal_midas"})  # the extension's names for its MiDaS modules
#: the soft edges: the extension's module names for them (its labels are sdrt's names, its ALIASES below)
MODULES.update({"hed": "softedge_hed", "hed_safe": "softedge_hedsafe", "scribble_hed": "scribble_hed",
                "pidinet": "softedge_pidinet", "pidinet_safe": "softedge_pidisafe",
                "pidinet_scribble": "scribble_pidinet", "softedge_teed": "softedge_teed",
                "softedge_anyline": "softedge_anyline", "pidinet_sketch": "t2ia_sketch_pidi"})
MODULES["animal_openpose"] = "animal_openpose"  # the AP10K animal pose (sdrt.pipelines.animalpose)
MODULES["instant_id_face_keypoints"] = "instant_id_face_keypoints"  # InstantID's hint (sdrt.pipelines.faces)
ALIASES = {"invert": "invert (from white bg & black line)",
           "lineart_standard": "lineart_standard (from white bg & black line)", "color": "t2ia_color_grid",
           "hed": "softedge_hed", "hed_safe": "softedge_hedsafe", "pidinet": "softedge_pidinet",
           "pidinet_safe": "softedge_pidisafe", "pidinet_scribble": "scribble_pidinet",
           "depth": "depth_midas", "normal_map": "normal_midas", "pidinet_sketch": "t2ia_sketch_pidi"}
ALIASES["lineart"] = "lineart_realistic"
#: the extension's inpaint modules (sdrt.pipelines.inpaintcn): "inpaint" is its UI's inpaint_global_harmonious
MODULES.update({"inpaint": "inpaint", "inpaint_only": "inpaint_only"})
MODULES["inpaint_only+lama"] = "inpaint_only+lama"  # LaMa's fill first (sdrt.pipelines.lamafill)
ALIASES["inpaint"] = "inpaint_global_harmonious"
#: the tile net's colour-fix modules (sdrt.pipelines.colorfix)
MODULES.update({"tile_colorfix": "tile_colorfix", "tile_colorfix+sharp": "tile_colorfix+sharp"})
#: LeReS depth (sdrt.pipelines.leresdepth) and with its boost merge (sdrt.pipelines.leresboost)
MODULES.update({"depth_leres": "depth_leres", "depth_leres++": "depth_leres++"})
MODULES["depth_zoe"] = "depth_zoe"  # ZoeDepth (sdrt.pipelines.zoedepth)
#: UniFormer's ADE20K segmentation (sdrt.pipelines.uniformerseg): the extension's module "segmentation", its UI's
#: seg_ufade20k
MODULES["segmentation"] = "seg_ufade20k"
ALIASES["segmentation"] = "seg_ufade20k"
#: the anime face segmentation UNet (sdrt.pipelines.animeface): the extension's module anime_face_segment
MODULES["anime_face_segment"] = "seg_anime_face"
ALIASES["anime_face_segment"] = "seg_anime_face"
#: the extension's reference modules (sdrt.pipelines.refattn): no model, the unit's picture guides the UNet itself
MODEL_FREE = ("reference_only", "reference_adain", "reference_adain+attn")
#: the extension's Revision modules (sdrt.pipelines.revision): no model either; their image encoder (OpenCLIP
#: ViT-bigG/14, the extension's clip_g.pth or ComfyUI's clip_vision_g.safetensors) found as the annotators' files are
REVISION = ("revision_clipvision", "revision_ignore_prompt")
MODEL_FREE += REVISION
MODULES.update({m: m for m in MODEL_FREE})  # the modules the extension lists as model_free (model: "None")
#: the extension's "clip_vision" (its UI's t2ia_style_clipvision): TencentARC's style adapter, the unit's model
#: (t2iadapter_style_sd14v1 in ControlNet/), its CLIP ViT-L/14 found as the annotators' files (sdrt.pipelines.styleadapter)
MODULES["clip_vision"] = "t2ia_style_clipvision"
ALIASES["clip_vision"] = "t2ia_style_clipvision"
_RES = {"name": "Preprocessor Resolution", "value": 512, "min": 64, "max": 2048}
_GAMMA = {"name": "Gamma Correction", "value": 1.0, "min": 0.1, "max": 2.0, "step": 0.001}
#: ``module_detail``'s sliders (processor_res, threshold_a, threshold_b) as the extension's
#: ``preprocessor_sliders_config`` gives them (1.1.4xx), None where the module has no such slider
SLIDERS: dict[str, list[dict[str, Any] | None]] = {
    "none": [], "invert": [],
    "canny": [_RES, {"name": "Canny Low Threshold", "value": 100, "min": 1, "max": 255},
              {"name": "Canny High Threshold", "value": 200, "min": 1, "max": 255}],
    "threshold": [_RES, {"name": "Binarization Threshold", "min": 0, "max": 255, "value": 127}],
    "scribble": [_RES],
    "tile_resample": [None, {"name": "Down Sampling Rate", "value": 1.0, "min": 1.0, "max": 8.0, "step": 0.01}],
    "scribble_xdog": [_RES, {"name": "XDoG Threshold", "min": 1, "max": 64, "value": 32}],
    "blur_gaussian": [_RES, {"name": "Sigma", "min": 0.01, "max": 64.0, "value": 9.0}],
    "color": [_RES],
    "recolor_luminance": [None, _GAMMA], "recolor_intensity": [None, _GAMMA],
    "dw_openpose_full": [{"name": "Resolution", "value": 512, "min": 64, "max": 2048}],
    "instant_id_face_keypoints": [{"name": "Resolution", "value": 512, "min": 64, "max": 2048}],
    "openpose": [{"name": "Resolution", "value": 512, "min": 64, "max": 2048}],
    "animal_openpose": [{"name": "Resolution", "value": 512, "min": 64, "max": 2048}],
    "mlsd": [_RES, {"name": "MLSD Value Threshold", "min": 0.01, "max": 2.0, "value": 0.1, "step": 0.01},
             {"name": "MLSD Distance Threshold", "min": 0.01, "max": 20.0, "value": 0.1, "step": 0.01}],
    "depth": [{"name": "Resolution", "value": 512, "min": 64, "max": 2048}],
    "normal_map": [{"name": "Resolution", "value": 512, "min": 64, "max": 2048},
                   {"name": "Normal Background Threshold", "value": 0.4, "min": 0.0, "max": 1.0, "step": 0.01}],
    **{m: [{"name": "Resolution", "value": 512, "min": 64, "max": 2048}] for m in (
        "hed", "hed_safe", "scribble_hed", "pidinet", "pidinet_safe", "pidinet_scribble")},
    "softedge_teed": [{"name": "Resolution", "value": 512, "min": 64, "max": 2048},
                      {"name": "Safe Steps", "value": 2, "min": 0, "max": 10, "step": 1}],
    # its own resolution slider (default 1280; the new-style preprocessors' api_json names the step)
    "softedge_anyline": [{"name": "Resolution", "value": 1280, "min": 64, "max": 2048, "step": 8},
                         {"name": "Safe Steps", "value": 2, "min": 0, "max": 10, "step": 1}],
    # not in the extension's config (module_detail: no sliders); its UI shows the default resolution slider
    "lineart_standard": [], "shuffle": [], "normal_bae": [],
    "depth_anything": [], "depth_anything_v2": [],
    # the extension's inpaint modules: no sliders (their resolution slider hidden)
    "inpaint": [], "inpaint_only": [], "inpaint_only+lama": [],
    "tile_colorfix": [None, {"name": "Variation", "value": 8.0, "min": 3.0, "max": 32.0, "step": 1.0}],
    "tile_colorfix+sharp": [None, {"name": "Variation", "value": 8.0, "min": 3.0, "max": 32.0, "step": 1.0},
                            {"name": "Sharpness", "value": 1.0, "min": 0.0, "max": 2.0, "step": 0.01}],
    "openpose_full": [{"name": "Resolution", "value": 512, "min": 64, "max": 2048}],
    "openpose_hand": [], "openpose_face": [], "openpose_faceonly": [],
    **{m: [_RES, {"name": "Remove Near %", "min": 0, "max": 100, "value": 0, "step": 0.1},
           {"name": "Remove Background %", "min": 0, "max": 100, "value": 0, "step": 0.1}]
       for m in ("depth_leres", "depth_leres++")},
    **{m: [None, {"name": "Style Fidelity (only for Balanced mode)", "value": 0.5, "min": 0.0, "max": 1.0,
                  "step": 0.01}] for m in ("reference_only", "reference_adain", "reference_adain+attn")},
    **{m: [None, {"name": "Noise Augmentation", "value": 0.0, "min": 0.0, "max": 1.0}] for m in REVISION},
    "clip_vision": [],  # no sliders (its resolution hidden)
}
#: the resolution a module outside the extension's slider config runs at (its UI's default slider)
_UI_RES = {"lineart_standard": _RES, "shuffle": _RES, "normal_bae": _RES, "depth_anything": _RES,
           "depth_anything_v2": _RES, "openpose_hand": _RES, "openpose_face": _RES, "openpose_faceonly": _RES}
# the lineart models are outside it too (1.1.4xx: no sliders in module_detail, the UI's resolution slider)
SLIDERS.update({m: [] for m in ("lineart", "lineart_coarse", "lineart_anime", "lineart_anime_denoise")})
# the T2I-Adapter sketch map (PiDiNet's edge above 0.5): no sliders in the extension's config, the UI's resolution
SLIDERS["pidinet_sketch"], _UI_RES["pidinet_sketch"] = [], _RES
_UI_RES.update({m: _RES for m in ("lineart", "lineart_coarse", "lineart_anime", "lineart_anime_denoise")})
# depth_zoe: no sliders in module_detail (the extension's resolution None), its UI's default resolution slider
SLIDERS["depth_zoe"] = []
_UI_RES["depth_zoe"] = _RES
# "segmentation" is in it with its resolution slider; anime_face_segment is not (module_detail: no sliders; the
# UI's resolution slider, 512)
SLIDERS["segmentation"] = [_RES]
SLIDERS["anime_face_segment"], _UI_RES["anime_face_segment"] = [], _RES
#: the extension's resize modes (sdrt.pipelines.images names them, with its aliases and A1111's img2img names)
RESIZE_MODES = CONTROL_RESIZE_MODES
CONTROL_MODES = ("Balanced", "My prompt is more important", "ControlNet is more important")
HR_OPTIONS = ("Both", "Low res only", "High res only")
#: module families sdrt cannot run, and what they need
_NEEDS = (("ip-adapter", "an IP-Adapter variant sdrt does not build (it runs the base, Plus and Full Face adapters "
                         "with the ViT-H/14 modules, " + ", ".join(("ip-adapter_clip_sd15", "ip-adapter_clip_h")) +
                         ", the ViT-bigG/14 ones with ip-adapter_clip_g, FaceID with ip-adapter_face_id and FaceID "
                         "Plus with ip-adapter_face_id_plus)"),
          ("ip_adapter", "an IP-Adapter variant sdrt does not build (it runs ip-adapter_clip_sd15 / ip-adapter_clip_h "
                         "/ ip-adapter_clip_g)"),
          ("ipadapter", "an IP-Adapter variant sdrt does not build (it runs CLIP-ViT-H (IPAdapter) and "
                        "CLIP-ViT-bigG (IPAdapter))"),
          ("pulid", "PuLID's face models"),
          ("oneformer", "OneFormer (multi-scale deformable attention: not built; module segmentation, the extension's "
                        "seg_ufade20k, makes the ADE20k-coloured map with UniFormer)"),
          ("seg_of", "OneFormer (multi-scale deformable attention: not built; seg_ufade20k, the extension's module "
                     "segmentation, makes the ADE20k-coloured map with UniFormer)"))
#: the extension's (and Forge's) IP-Adapter modules sdrt runs: the CLIP ViT-H/14 image encoder
#: (``ip-adapter_clip_sdxl_plus_vith`` is the extension's name for it with ``ip-adapter_sdxl_vit-h``) and OpenCLIP
#: ViT-bigG/14 (``ip-adapter_clip_g``, ``ip-adapter_clip_sdxl`` before the extension renamed it)
IP_MODULES = ("ip-adapter_clip_sd15", "ip-adapter_clip_h", "ip-adapter_clip_sdxl_plus_vith", "ip-adapter-auto",
              "clip-vit-h (ipadapter)", "ip-adapter_clip_g", "ip-adapter_clip_sdxl", "clip-vit-bigg (ipadapter)",
              "ip-adapter_face_id", "ip-adapter_face_id_plus", "instant_id_face_embedding")
#: the extension's FaceID modules: InsightFace's face embedding (and, for Plus, ViT-H/14 of the aligned face);
#: InstantID's: antelopev2's embedding, read by its IP-Adapter (the unit before its ControlNet unit)
FACE_MODULES = ("ip-adapter_face_id", "ip-adapter_face_id_plus", "instant_id_face_embedding")
#: the encoder an IP-Adapter module names (``ip-adapter-auto``: none, the adapter's own)
IP_MODULE_ENCODERS = {"ip-adapter_clip_sd15": "ViT-H/14", "ip-adapter_clip_h": "ViT-H/14",
                      "ip-adapter_clip_sdxl_plus_vith": "ViT-H/14", "clip-vit-h (ipadapter)": "ViT-H/14",
                      "ip-adapter_clip_g": "ViT-bigG/14", "ip-adapter_clip_sdxl": "ViT-bigG/14",
                      "clip-vit-bigg (ipadapter)": "ViT-bigG/14"}
#: a unit's keys that are the extension's (its UI's and batch state too) and change nothing sdrt makes
_QUIET = frozenset("""enabled image input_image mask mask_image module model weight resize_mode low_vram lowvram
processor_res threshold_a threshold_b guidance_start guidance_end guidance pixel_perfect control_mode guess_mode
guessmode hr_option save_detected_map inpaint_crop_input_image advanced_weighting is_ui input_mode batch_images
output_dir loopback use_preview_as_input generated_image batch_image_dir batch_mask_dir batch_input_gallery
batch_mask_gallery union_control_type""".split())


def module_list(alias_names: bool) -> list[str]:
    return [ALIASES.get(m, m) if alias_names else m for m in MODULES]


def module_detail(alias_names: bool) -> dict[str, Any]:
    return {ALIASES.get(m, m) if alias_names else m: {"model_free": m in MODEL_FREE, "sliders": SLIDERS[m]}
            for m in MODULES}


def module(value: Any, field: str) -> str:
    """sdrt's preprocessor for the extension's ``module`` (or its alias name); 400 naming what it needs otherwise."""
    if value is None:
        return "none"
    if not isinstance(value, str):
        raise ApiError(422, f"{field} must be a string (a name from /controlnet/module_list)", field=field)
    text = value.strip().casefold()
    for name, alias in ALIASES.items():
        if text == alias.casefold():
            text = name
    if text in MODULES:
        return MODULES[text]
    need = next((why for key, why in _NEEDS if key in text), None)
    have = ", ".join(MODULES)
    if need is not None:
        raise ApiError(400, f"{field}: the ControlNet module {value[:80]!r} needs {need}, which sdrt does not have; "
                            f"sdrt runs {have}", field=field)
    raise ApiError(400, f"{field}: the ControlNet preprocessor {value[:80]!r} is not one of sdrt's ({have}); make "
                        "the control map elsewhere and send it with module none", field=field)


def resize_mode(value: Any, field: str) -> str:
    """A unit's resize mode by the extension's name, an alias or A1111's number; 3 (latent upscale), which the
    extension runs as a plain resize, is Just Resize."""
    from ..errors import InputError
    from ..pipelines.images import LATENT_UPSCALE
    from ..pipelines.images import resize_mode as named

    if value is None:
        return "Crop and Resize"  # the extension's ControlNetUnit default (INNER_FIT)
    if isinstance(value, str) and value.strip().lstrip("-").isdecimal():
        value = int(value.strip())
    try:
        mode = named(value, field)
    except InputError:
        raise ApiError(400, f"{field} must be 0, 1, 2 or one of {', '.join(RESIZE_MODES)}, got {str(value)[:40]!r}",
                       field=field) from None
    return RESIZE_MODES[0] if mode == LATENT_UPSCALE else mode


def _choice(value: Any, names: tuple[str, ...], field: str) -> int:
    if isinstance(value, str) and value.strip().isdecimal():
        value = int(value.strip())
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(names):
        return value
    if isinstance(value, str):
        for k, name in enumerate(names):
            if value.strip().casefold() == name.casefold():
                return k
    raise ApiError(400, f"{field} must be 0 to {len(names) - 1} or one of {', '.join(names)}, got "
                        f"{str(value)[:40]!r}", field=field)


def _image(value: Any, field: str, max_pixels: int) -> tuple[Any, Any]:
    """``(image, mask)`` from a unit's image: base64, a ``{"image", "mask"}`` dict, or a list of one."""
    if isinstance(value, list):
        if len(value) > 1:
            raise ApiError(400, f"{field} holds {len(value)} images; sdrt's ControlNet modules take one", field=field)
        value = value[0] if value else None
    mask = None
    if isinstance(value, dict):
        mask = value.get("mask")
        value = value.get("image")
    if value is None or value == "":
        return None, mask
    return b64images.rgb_array(b64images.decode(value, field, max_pixels)), mask


def _sliders(read: Callable[[str, float | None], float], pre: str, names: tuple[str, str, str],
             field: Callable[[str], str], max_res: int,
             notes: list[str] | None = None, pixel_perfect: bool = False
             ) -> tuple[float | None, float | None, float | None]:
    """``(processor_res, threshold_a, threshold_b)`` for preprocessor ``pre``, each read by ``read(name, highest)``
    and named ``field(name)``. The extension's ``bound_check_params`` (its ``ControlNetUnit`` validator, which
    ``/controlnet/detect`` runs too): a value outside the slider's range (-1, the API's "unset", among them) takes the
    slider's default, and ``notes`` names each one that was not -1 (the extension logs it). A module without the
    slider never reads it (None; the extension's own "scribble" has a fixed level, 127); ``shuffle`` runs at 512
    whatever is sent (the extension fixes it there). A processor_res above ``max_res`` (the server's largest side)
    is a 400. With ``pixel_perfect`` the resolution is pixel-perfect's whatever processor_res says (the extension
    sets it after the check): processor_res is not named, nor held to ``max_res``."""
    module_name = next(m for m, p in MODULES.items() if p == pre)
    sliders = SLIDERS[module_name] or ([_UI_RES[module_name]] if module_name in _UI_RES else [])
    out: list[float | None] = []
    for k, name in enumerate(names):
        value = read(name, None)
        s = sliders[k] if len(sliders) > k else None
        if s is None:
            out.append(None)
            continue
        if k == 0 and pixel_perfect:  # not read: pixel_perfect's resolution replaces it
            out.append(float(s["value"]) if not s["min"] <= value <= s["max"] or module_name == "shuffle" else value)
            continue
        if module_name == "shuffle" and k == 0:  # the extension's hidden slider: 0 to 1, default 512
            if value not in (-1, 512) and notes is not None:
                notes.append(f"{field(name)}: shuffle runs at 512 whatever is sent (or pixel_perfect's resolution; "
                             f"the extension fixes it there), so {value:g} was not used")
            out.append(512.0)
            continue
        if not s["min"] <= value <= s["max"]:
            if value != -1 and notes is not None:
                notes.append(f"{field(name)}: {value:g} is outside {s['name']}'s {s['min']:g} to {s['max']:g}, so "
                             f"the default {s['value']:g} ran, as the extension runs it")
            value = float(s["value"])
        out.append(value)
    res, a, b = out
    if res is not None and res > max_res and not pixel_perfect:
        raise ApiError(400, f"{field(names[0])} must be at most {max_res:g} (the server's --max-size), got {res:g}",
                       field=field(names[0]))
    return res, a, b


def script(body: dict[str, Any], notes: list[str] | None = None) -> tuple[str, dict[str, Any]] | None:
    """``(key, value)`` of the ControlNet script in the request's ``alwayson_scripts`` (None: none there), the one
    rule :func:`units` and :func:`ip_adapters` both read it by: the key that reads "controlnet" whatever its case and
    spaces, the last one when several do (A1111's ``init_script_args`` writes each key's args over the script's in
    turn, so the last key's are the ones run); ``notes`` gets the other scripts named, and the earlier ControlNet keys
    as not used. 422 when it is not an object with ``args``, a list."""
    scripts = body.get("alwayson_scripts")
    if scripts is None:
        return None
    if not isinstance(scripts, dict):
        raise ApiError(422, "alwayson_scripts must be an object", field="alwayson_scripts")
    keys = [str(name) for name in scripts if str(name).strip().casefold() == "controlnet"]
    if notes is not None:
        for name in scripts:
            if str(name).strip().casefold() == "controlnet" or kontext.is_title(name):  # Forge Kontext: serve/kontext.py
                continue
            notes.append(f"alwayson_scripts.{str(name)[:60]}: this A1111 extension is not part of sdrt (ControlNet is)")
        notes += [f"alwayson_scripts.{k[:60]}: another key names the ControlNet script after it "
                  f"(alwayson_scripts.{keys[-1][:60]}), whose units ran, as A1111 runs the last" for k in keys[:-1]]
    if not keys:
        return None
    key = keys[-1]
    value = scripts[key]
    if not isinstance(value, dict) or not isinstance(value.get("args", []), list):
        raise ApiError(422, f"alwayson_scripts.{key} must be an object with args, a list of ControlNet units",
                       field=f"alwayson_scripts.{key}")
    return key, value


def units(body: dict[str, Any], registry: Registry, model: ModelEntry, max_pixels: int,
          init_image: Any, hires: bool, max_res: int = 2048) -> tuple[list[Any], list[str], list[str], dict[str, str]]:
    """``(sdrt ControlNet units, not honoured, ignored fields, {pipeline argument: request field})`` of a request's
    ``alwayson_scripts`` (the fields also map the server path of each unit's preprocessor file to its name as the
    admin names it, ``<models>/../extensions/...``: the job's refusal says it so); ``init_image``: img2img's init image as sent (a Pillow image), None for txt2img."""
    from ..pipelines.controlnet import ControlNet

    notes: list[str] = []
    found = script(body, notes)
    if found is None:
        return [], notes, [], {}
    key, value = found
    args = value.get("args") or []
    out: list[Any] = []
    ignored: list[str] = []
    enabled = 0
    fields = {"controlnets": f"alwayson_scripts.{key}"}
    for k, unit in enumerate(args):
        where = f"alwayson_scripts.{key}.args[{k}]"
        if not isinstance(unit, dict):
            raise ApiError(422, f"{where} must be an object (a ControlNet unit); positional script args are not read",
                           field=where)
        if not get_bool({f"{where}.enabled": unit.get("enabled")}, f"{where}.enabled", True):
            continue
        enabled += 1
        if enabled > MAX_UNITS:
            raise ApiError(400, f"alwayson_scripts.{key} enables more than {MAX_UNITS} ControlNet units, this "
                                "server's limit", field=f"alwayson_scripts.{key}")
        ignored += [f"{where}.{str(f)[:60]}" for f in unit if f not in _QUIET]
        if is_ip_module(unit.get("module")):  # an IP-Adapter unit: ip_adapters() reads it
            continue
        fields[f"controlnets[{len(out)}]"] = where
        # the pipeline names a unit's thresholds "controlnets[k] low" / "high": the unit's threshold_a / threshold_b
        fields[f"controlnets[{len(out)}] low"] = f"{where}.threshold_a"
        fields[f"controlnets[{len(out)}] high"] = f"{where}.threshold_b"
        # a file of its preprocessor that is not the model: the module that chose it
        fields[f"controlnets[{len(out)}] preprocessor_models"] = f"{where}.module"
        made, reads = _unit(unit, where, registry, model, max_pixels, init_image, hires, notes, ControlNet, max_res)
        fields[f"controlnets[{len(out)}] control_mask"] = f"{where}.mask"
        # an SDXL ControlNet Union's type the net has not (Tile on the 6-type file): the extension's field that gave it
        fields[f"controlnets[{len(out)}] {{@union_mode}}"] = f"{where}.union_control_type"
        fields[f"controlnets[{len(out)}] union_mode"] = f"{where}.union_control_type"
        # a resolution the pipeline refuses (a network's image too large at it): the slider that gave it
        fields[f"controlnets[{len(out)}] processor_res"] = f"{where}.{'pixel_perfect' if made.pixel_perfect else 'processor_res'}"
        out.append(made)
        if isinstance(made.net, str) and Path(made.net).is_absolute():  # a refusal of the net's file: by its name
            fields[made.net] = Path(made.net).name
        for f in made.preprocessor_models or ():  # a refusal of the file says it as the admin names it
            fields[str(f)] = admin_paths(str(f), registry.models_dir)
        if reads:  # an SD3 inpainting net's mask, as the pipeline's errors name it
            fields.setdefault("control_mask", f"{where}.mask")
    return out, notes, ignored, fields


def check_instantid(nets: list[Any], ips: list[Any], fields: dict[str, str]) -> None:
    """A 400 on the unit of an InstantID ControlNet (told by its model's name, as the extension tells it) in a request
    with no InstantID adapter unit, in the request's words (the pipeline's refusal speaks of its arguments)."""
    from ..pipelines.ipadapter import face_module

    if any(face_module(Path(str(ip.adapter))) == "instant_id_face_embedding" for ip in ips):
        return
    for k, net in enumerate(nets):
        if net.face_tokens:
            where = fields.get(f"controlnets[{k}]", f"controlnets[{k}]")
            raise ApiError(400, f"{where}.model: {Path(str(net.net)).name} is InstantID's ControlNet (its name says "
                                "instant_id): its text is the face tokens of an instant_id_face_embedding unit, and "
                                "the request has none; put an instant_id_face_embedding unit (model: InstantID's "
                                "adapter, e.g. ip-adapter_instant_id_sdxl; image: the face) before it", field=where)


def is_ip_module(value: Any) -> bool:
    return isinstance(value, str) and value.strip().casefold() in IP_MODULES


def ip_adapters(body: dict[str, Any], registry: Registry, model: ModelEntry, max_pixels: int, init_image: Any
                ) -> tuple[list[Any], dict[str, str]]:
    """``([sdrt IPAdapter, ...], {pipeline argument: request field})``: every enabled ControlNet unit with an
    IP-Adapter module (``ip-adapter_clip_sd15`` / ``ip-adapter_clip_h`` for ViT-H/14, ``ip-adapter_clip_g`` for
    ViT-bigG/14, ``ip-adapter-auto``; one naming the other encoder than the adapter reads is a 400) and a ``model``
    naming an adapter in ``ControlNet/``, e.g. ``ip-adapter_sd15``, ``ip-adapter-plus-face_sd15`` or
    ``ip-adapter_sdxl``), in the units' order: its ``weight`` is the scale, its ``guidance_start`` /
    ``guidance_end`` the steps it runs on, by the extension's rule (on while ``start <= i / n <= end``, as for its
    ControlNet units). The image encoder of each is the one that gives what its adapter reads: the ``image_encoder/``
    folder beside it (h94's layout) or in the models folder's ``clip_vision/`` (ComfyUI's files)."""
    from ..pipelines.ipadapter import IPAdapter, field_name

    found_script = script(body)
    if found_script is None:
        return [], {}
    key, value = found_script
    found = [(k, u) for k, u in enumerate(value.get("args") or []) if isinstance(u, dict)
             and is_ip_module(u.get("module"))
             and get_bool({"enabled": u.get("enabled")}, "enabled", True)]
    made: list[Any] = []
    names: dict[str, str] = {}
    n = len(found)
    for j, (k, unit) in enumerate(found):
        where = f"alwayson_scripts.{key}.args[{k}]"
        made.append(_ip_unit(unit, where, registry, model, max_pixels, init_image, IPAdapter))
        image_key = "image" if unit.get("image") not in (None, "") or unit.get("input_image") in (None, "") \
            else "input_image"  # the field the picture came in (A1111's older name too)
        for name, field in (("", "model"), ("image", image_key), ("scale", "weight"), ("start", "guidance_start"),
                            ("end", "guidance_end" if unit.get("guidance_end") is not None or
                             unit.get("guidance") is None else "guidance"), ("image_encoder", "model"),
                            ("face_models", "module")):
            names[field_name(name, j, n)] = f"{where}.{field}"
    if n > 1:  # the adapters as a whole (the pipeline's "leave ip_adapter out"): the first unit's model, as for one
        names.setdefault("ip_adapter", names[field_name("", 0, n)])
    return made, names


def _ip_unit(unit: dict[str, Any], where: str, registry: Registry, model: ModelEntry, max_pixels: int,
             init_image: Any, make: Any) -> Any:
    """One IP-Adapter unit of the extension: ``make(...)``, the pipeline's IPAdapter (the window: the extension's)."""
    entry = registry.controlnet(unit.get("model"), model, f"{where}.model")
    if entry.owner is not None or not entry.path.is_file():
        raise ApiError(400, f"{where}.model: {entry.name} is no IP-Adapter file (an IP-Adapter module reads one, e.g. "
                            "ip-adapter_sd15.safetensors in the ControlNet folder)", field=f"{where}.model")
    from ..checkpoint.ipadapter import check_file
    from ..errors import SdrtError

    try:
        check_file(entry.path, "model")  # what the file is, said on the unit's field (its family: when the model runs)
    except SdrtError as exc:
        text = f"{where}.model: {exc.what}" + (f"; {exc.fix}" if exc.fix else "")
        raise ApiError(400, text.replace("{@model}", f"{where}.model"), field=f"{where}.model") from None
    face = _same_encoder(unit.get("module"), entry.path, f"{where}.module")
    image_key = "image" if unit.get("image") not in (None, "") else "input_image"
    image, _ = _image(unit.get(image_key), f"{where}.{image_key}", max_pixels)
    if image is None:
        if init_image is None:
            raise ApiError(400, f"{where}.image is missing: an IP-Adapter unit needs its picture (base64)",
                           field=f"{where}.image")
        image = b64images.rgb_array(init_image)

    def num(name: str, default: float, low: float, high: float) -> float:
        try:
            return get_float(unit, name, default, low, high)
        except ApiError as exc:  # the field as the request nests it
            raise ApiError(exc.status, exc.message.replace(name, f"{where}.{name}", 1), field=f"{where}.{name}") \
                from None

    weight = num("weight", 1.0, 0.0, 10.0)
    start = num("guidance_start", 0.0, 0.0, 1.0)
    end_key = "guidance_end" if unit.get("guidance_end") is not None else "guidance"
    end = num(end_key, 1.0, 0.0, 1.0)
    if start > end:
        raise ApiError(400, f"{where}.guidance_start {start:g} is after {where}.{end_key} {end:g}",
                       field=f"{where}.guidance_start")
    encoder = None if face in ("ip-adapter_face_id", "instant_id_face_embedding") else str(
        _image_encoder(entry.path, registry, f"{where}.model"))
    pack = "antelopev2" if face == "instant_id_face_embedding" else "buffalo_l"
    faces = str(_face_models(registry, f"{where}.module", pack)) if face is not None else None
    return make(str(entry.path), image=image, scale=weight, image_encoder=encoder, start=start, end=end,
                window="a1111", face_models=faces,  # the extension's step window: start <= i / n <= end, as its
                largest_face=True if face is not None else None)  # ControlNet units'; and the largest face, as its
    # FaceID and InstantID preprocessors (InsightFaceModel.pick_largest_face)


def _face_models(registry: Registry, field: str, pack: str = "buffalo_l") -> Any:
    """InsightFace's buffalo_l folder for a FaceID unit (``pack`` antelopev2 for InstantID's), where the tools keep
    it: the models folder's ``insightface/models/buffalo_l`` (ComfyUI's, Forge's), or sd-webui-controlnet's
    ``extensions/sd-webui-controlnet/annotator/downloads/insightface/models/buffalo_l`` beside it; 400 when none."""
    from ..errors import SdrtError
    from ..pipelines.faces import PACKS, find_face_models

    models = registry.models_dir
    places = [] if models is None else [models, models.parent / "extensions" / "sd-webui-controlnet",
                                        models.parent / "extensions" / "sd-webui-controlnet-main"]
    for place in places:
        try:
            return find_face_models(place, pack=pack)
        except SdrtError:
            continue
    det, rec = PACKS[pack]
    who = "the FaceID modules read" if pack == "buffalo_l" else "instant_id_face_embedding reads"
    raise ApiError(400, f"{field}: {who} InsightFace's {pack} models ({det} and {rec}), found in none of the models "
                        f"folder's insightface/models/{pack} nor sd-webui-controlnet's annotator/downloads/insightface/"
                        f"models/{pack}; put that folder there", field=field)


def _same_encoder(module: Any, adapter: Any, field: str) -> str | None:
    """A 400 when the unit's module names one encoder (ViT-H/14, ViT-bigG/14) and the adapter reads the other's, or
    a FaceID module and another adapter (or the other way round); the FaceID module the adapter takes (None: none)."""
    from ..checkpoint.ipadapter import adapter_reads, kind_for
    from ..pipelines.ipadapter import face_module

    text = str(module).strip().casefold()
    takes = face_module(Path(adapter))
    if takes is not None and text not in (takes, "ip-adapter-auto"):
        raise ApiError(400, f"{field}: {Path(adapter).name} is a face adapter (it reads InsightFace's face "
                            f"embedding), and the module {module} does not give one; send module {takes}", field=field)
    if takes is None and text in FACE_MODULES:
        raise ApiError(400, f"{field}: the module {module} gives InsightFace's face embedding, which "
                            f"{Path(adapter).name} does not read (it is no FaceID adapter); send module "
                            "ip-adapter-auto, or a FaceID adapter (ip-adapter-faceid_sd15, "
                            "ip-adapter-faceid-plusv2_sd15)", field=field)
    if takes is not None:
        return takes
    named = IP_MODULE_ENCODERS.get(text)
    reads = adapter_reads(adapter)
    kind = kind_for(*reads) if reads is not None else None
    if named is not None and kind is not None and kind.label != named:
        use = next(m for m, e in IP_MODULE_ENCODERS.items() if e == kind.label)
        raise ApiError(400, f"{field}: the module {module} runs the {named} image encoder and {Path(adapter).name} "
                            f"reads {kind.label}'s {reads[0]}; send module {use} (or ip-adapter-auto)", field=field)
    return None


def _image_encoder(adapter: Any, registry: Registry, field: str) -> Any:
    """The image encoder for an adapter of the ControlNet folder, the one that gives what it reads (ViT-H/14 or
    ViT-bigG/14, told by config.json or the tensors' header): ``image_encoder/`` beside it (h94's layout, with
    ``models/`` and ``sdxl_models/``), else in the models folder's ``clip_vision/`` (a transformers folder, or one of
    its ``.safetensors``, ComfyUI's); failing that the one there is (its width then refused naming the one to
    pass); 400 when there is none."""
    from ..checkpoint.ipadapter import find_encoder, h94_encoder

    adapter = Path(adapter)
    models = registry.models_dir
    folder = next((p for p in sorted(models.iterdir()) if p.is_dir() and p.name.casefold() == "clip_vision"), None) \
        if models is not None and models.is_dir() else None
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() == ".safetensors") if folder is not None else []
    comfy = ([folder] if folder is not None and (folder / "config.json").is_file() else []) + files
    h94 = h94_encoder(adapter)
    found = find_encoder(adapter, ([h94] if h94 is not None else []) + comfy)
    if found is not None:
        return found
    if h94 is not None:
        return h94
    if comfy and comfy[0] == folder:
        return folder
    vit_h = [p for p in files if any(t in p.name.casefold() for t in ("vit-h", "vit_h", "h-14", "h14", "clip_h"))]
    if len(vit_h) == 1 or len(files) == 1:
        return (vit_h or files)[0]
    raise ApiError(400, f"{field}: no image encoder for the IP-Adapter: put h94/IP-Adapter's models/image_encoder "
                        "folder (CLIP ViT-H/14; sdxl_models/image_encoder, ViT-bigG/14, for ip-adapter_sdxl) beside "
                        "the adapter in the ControlNet folder as image_encoder/, or its model.safetensors in a "
                        "clip_vision folder of the models folder (ComfyUI's CLIP-ViT-H-14-laion2B-s32B-b79K.safetensors "
                        "or CLIP-ViT-bigG-14-laion2B-39B-b160k.safetensors)", field=field)


def _reads_mask(net: Any) -> bool:
    """Whether a unit's net (the registry's entry: a file or folder of the ControlNet folder; a model folder's own
    part is none of alimama's) reads a mask of its picture. The entry, not the unit's net string: a part's name is
    no path, and a file of that name in the server's working folder is not the net."""
    from ..checkpoint.controlnet import reads_mask

    return net.owner is None and net.path.exists() and reads_mask(net.path)


def _unit(unit: dict[str, Any], where: str, registry: Registry, model: ModelEntry, max_pixels: int,
          init_image: Any, hires: bool, notes: list[str], make: Any, max_res: int) -> tuple[Any, bool]:
    """The unit made (``make(...)``: the pipeline's ControlNet), and whether its net reads a mask."""

    def f(name: str) -> str:
        return f"{where}.{name}"

    def num(name: str, default: Any, low: float | None, high: float | None) -> Any:
        try:
            return get_float(unit, name, default, low, high)
        except ApiError as exc:  # the field as the request nests it
            raise ApiError(exc.status, exc.message.replace(name, f(name), 1), field=f(name)) from None

    def flag(name: str, default: Any) -> Any:  # a boolean field, named as the request nests it
        return get_bool({f(name): unit.get(name)}, f(name), default)

    pre = module(unit.get("module"), f("module"))
    if pre in MODEL_FREE:  # the extension runs it without a model, whatever the unit's model says
        if unit.get("model") not in (None, "", "None", "none"):
            notes.append(f"{f('model')}: {pre} uses no ControlNet model; {str(unit.get('model'))[:60]!r} was not "
                         "used (the extension's model \"None\")")
        net = None
    else:
        net = registry.controlnet(unit.get("model"), model, f("model"))
    image_key = "image" if unit.get("image") not in (None, "") else "input_image"
    image, mask = _image(unit.get(image_key), f(image_key), max_pixels)
    mask = mask if mask is not None else unit.get("mask") if unit.get("mask") is not None else unit.get("mask_image")
    inpaint = pre in ("inpaint", "inpaint_only", "inpaint_only+lama")
    if image is None:
        if init_image is None:
            raise ApiError(400, f"{f('image')} is missing: a txt2img ControlNet unit needs its control image "
                                "(base64)", field=f("image"))
        if inpaint and mask not in (None, ""):
            raise ApiError(400, f"{f('mask')} is given without {f('image')}: the mask is of the unit's picture (a unit "
                                "without one takes the init image and the request's mask)", field=f("mask"))
        # A1111's img2img: a unit without an image reads the init image (an inpaint unit: None, the pipeline gives it
        # the run's init image, mask and resize mode, as the extension's choose_input_image)
        image = None if inpaint else b64images.rgb_array(init_image)
    control_mask, reads = None, net is not None and _reads_mask(net)
    if mask not in (None, ""):
        if reads or inpaint:  # alimama's SD3 inpainting net, the inpaint modules' map: white = repaint
            control_mask = b64images.mask_array(b64images.decode(mask, f("mask"), max_pixels))
        else:
            notes.append(f"{f('mask')}: only inpainting ControlNets read a mask (sdrt runs SD3's, alimama's design); "
                         "this unit's net reads none, the mask was not used")
    weight = num("weight", 1.0, 0.0, 10.0)
    start = num("guidance_start", 0.0, 0.0, 1.0)
    end_key = "guidance_end" if unit.get("guidance_end") is not None else "guidance"
    end = num(end_key, 1.0, 0.0, 1.0)
    if start > end:
        raise ApiError(400, f"{f('guidance_start')} {start:g} is after {f(end_key)} {end:g}", field=f("guidance_start"))
    resize = resize_mode(unit.get("resize_mode"), f("resize_mode"))
    perfect = bool(flag("pixel_perfect", False))
    res, a, b = _sliders(lambda name, high: num(name, -1.0, None, high), pre,
                         ("processor_res", "threshold_a", "threshold_b"), f, max_res, notes, perfect)
    mode = _choice(unit.get("control_mode", 0), CONTROL_MODES, f("control_mode"))
    guess_key = "guess_mode" if unit.get("guess_mode") is not None else "guessmode"
    if flag(guess_key, None):  # the extension's own conversion while it read guess_mode (1.1.108-1.1.135)
        if mode not in (0, 2):
            notes.append(f"{f(guess_key)}: true ran as {CONTROL_MODES[2]!r}, as the extension turned guess mode into "
                         f"it; {f('control_mode')} {CONTROL_MODES[mode]!r} was not used")
        mode = 2
    if (pre in REVISION or pre == "t2ia_style_clipvision") and mode != 0:  # the extension's no_control_mode
        notes.append(f"{f('control_mode')}: {pre} has no control mode (the extension reads none); "
                     f"{CONTROL_MODES[mode]!r} was not used")
        mode = 0
    if unit.get("advanced_weighting") not in (None, []):
        notes.append(f"{f('advanced_weighting')}: per-layer weights are not supported; weight ran for every layer")
    # the passes of the hires fix the unit takes part in; without the fix the extension runs every unit as "Both"
    hr = _choice(unit.get("hr_option") if unit.get("hr_option") is not None else 0, HR_OPTIONS, f("hr_option"))
    if pre in REVISION and hr != 0:  # the extension's revision hook runs on both passes whatever hr_option says
        if hires:
            notes.append(f"{f('hr_option')}: {pre} runs on both passes of the hires fix, as the extension runs it; "
                         f"{HR_OPTIONS[hr]!r} was not used")
        hr = 0
    told = _union_control_type(unit.get("union_control_type"), f("union_control_type"))
    union_mode = None
    if net is not None and net.owner is None and net.path.exists():
        from ..checkpoint.controlnet import names_union
        from ..checkpoint.unioncontrolnet import from_preprocessor

        if (told is not None or from_preprocessor(pre) is None) and names_union(net.path):
            if told is None:  # the type is the module's
                raise ApiError(400, f"{f('module')} {pre!r} does not tell which control type the image is, and "
                                    f"{f('model')} {net.name} is an SDXL ControlNet Union; send "
                                    f"{f('union_control_type')} ({', '.join(_UNION_TYPES)}) or the module that made "
                                    "the image (canny, depth_midas, openpose_full, softedge_pidinet, normal_bae, "
                                    "seg_ofade20k, tile_resample, inpaint_only, ...)", field=f("module"))
            union_mode = told  # the extension's field over the module, as its hook feeds it
    extra = {"preprocessor_models": pose_files(registry.models_dir, f("module"), pre)} if pre in WITH_MODELS else {}
    from ..pipelines.controlnet import names_instantid

    made = make(None if net is None else str(net.path) if net.owner is None else net.name, image, weight, start, end, pre, resize, **extra,
                low=a, high=b, processor_res=None if res is None else int(res),
                pixel_perfect=perfect, control_mode=CONTROL_MODES[mode],
                window="a1111", control_mask=control_mask,  # the extension's step window: start <= i / n <= end
                # inpaint_full_res: the control image cut to the area repainted, as the extension (on by default)
                inpaint_crop=bool(flag("inpaint_crop_input_image", True)),
                hr_option=HR_OPTIONS[hr] if hires else HR_OPTIONS[0],
                # InstantID's net by its name alone, as the extension tells the model type (not by the module: an
                # instant_id_face_keypoints map sent to another net leaves that net reading the prompt)
                face_tokens=None if net is None else names_instantid(net.path), union_mode=union_mode)
    return made, reads


#: sd-webui-controlnet's ``union_control_type`` values (its ``ControlNetUnionControlType``, xinsir's order) -> sdrt's
#: control type names; "Unknown" (its default) leaves the type to the unit's module
_UNION_TYPES = {"OpenPose": "openpose", "Depth": "depth", "Soft Edge": "softedge", "Hard Edge": "canny",
                "Normal Map": "normal", "Segmentation": "segment", "Tile": "tile", "Inpaint": "inpaint"}


def _union_control_type(value: Any, field: str) -> str | None:
    """A unit's ``union_control_type`` as sdrt's type name, None when absent or "Unknown"; a 400 for another value."""
    if value in (None, "", "Unknown"):
        return None
    for name, kind in _UNION_TYPES.items():
        if isinstance(value, str) and value.strip().lower() == name.lower():
            return kind
    raise ApiError(400, f"{field} {str(value)[:40]!r} is no control type of a ControlNet Union; send one of: "
                        f"{', '.join(_UNION_TYPES)}, Unknown (the unit's module tells it)", field=field)


def pose_files(models: Path | None, field: str, pre: str = "dw_openpose_full") -> tuple[Path, ...]:
    """The files model-backed preprocessor ``pre`` reads (:data:`sdrt.pipelines.annotators.ANNOTATORS`), found
    under the models folder (or the folder above it, an A1111 or ComfyUI root) in sd-webui-controlnet's or
    ComfyUI's layout; a 400 naming where it looked otherwise (the folders as the admin names them: no server path)."""
    from ..pipelines.annotators import ANNOTATORS, find, layouts, need

    roots = [] if models is None else [Path(models), Path(models).parent]
    for root in roots:
        try:
            return find(pre, root, field)
        except InputError:
            continue
    subs = [s for s in layouts(ANNOTATORS[pre]) if "/downloads/" in s or s.startswith("custom_nodes/")]
    comfy = next(s for s in subs if s.startswith("custom_nodes/"))
    where = " or ".join(f"{r}/{{{', '.join(subs[:2])}, ...}}" for r in ("<models>", "<models>/..")[:len(roots)]) \
        or "no models folder"
    it = "them" if len(ANNOTATORS[pre].names) > 1 else "it"
    raise ApiError(400, f"{field}: {pre} needs {need(pre)}, found in neither {where}; put {it} in <models>/{subs[0]} "
                        f"(the extension's layout) or <models>/{comfy}", field=field)


def render_openpose_json(body: Any) -> dict[str, Any]:
    """``POST /controlnet/render_openpose_json``: each OpenPose JSON (the extension's format) drawn as its
    ``draw_poses`` draws it, base64 PNGs."""
    import base64

    from ..pipelines import posemaps
    from ..pipelines.png import encode_png

    if not isinstance(body, list):
        raise ApiError(422, "the body must be a JSON list of poses ({people, canvas_width, canvas_height})")
    if not body:
        return {"info": "No pose data detected."}
    out = []
    for k, pose in enumerate(body):
        try:
            people, h, w = posemaps.from_json(pose, f"body[{k}]")
        except InputError as exc:
            raise ApiError(422, f"{exc.where}: {getattr(exc, 'what', str(exc))}", field=str(exc.where)) from None
        out.append(base64.b64encode(encode_png(posemaps.draw(people, h, w))).decode("ascii"))
    return {"images": out, "info": "Success"}


def detect(body: Any, max_pixels: int, max_res: int = 2048, models: Path | None = None, backend: str = "auto",
           device: Any = None) -> dict[str, Any]:
    """``POST /controlnet/detect``: each input image's control map at the processor resolution, base64 PNGs
    (``dw_openpose_full``: with the OpenPose JSON of each image as ``poses``, DWPose's files found under
    ``models`` and compiled on ``backend`` / ``device``, the server's, as its units' are)."""
    import base64
    import secrets

    from ..pipelines.png import encode_png
    from ..pipelines.preprocessors import preprocess

    if not isinstance(body, dict):
        raise ApiError(422, "the body must be a JSON object with controlnet_module and controlnet_input_images")
    images = body.get("controlnet_input_images")
    key = "controlnet_input_images"
    if images is None:  # webuiapi's controlnet_detect sends the extension's older name
        images, key = body.get("controlnet_images"), "controlnet_images"
    if images is not None and not isinstance(images, list):
        raise ApiError(422, f"{key} must be a list of base64 images", field=key)
    pre = module(body.get("controlnet_module", "none"), "controlnet_module")
    if pre in REVISION or pre == "t2ia_style_clipvision":  # returns_image False: a CLIP output, no map
        raise ApiError(400, f"controlnet_module: {pre} makes no control map (the picture's CLIP embedding conditions "
                            "the UNet itself); send it in a txt2img/img2img unit", field="controlnet_module")
    if not images:
        raise ApiError(422, "No image selected: controlnet_input_images is empty", field=key)
    res, a, b = _sliders(lambda name, high: get_float(body, name, -1.0, None, high), pre,
                         ("controlnet_processor_res", "controlnet_threshold_a", "controlnet_threshold_b"),
                         lambda name: name, max_res)
    out = []
    poses = []
    masks = body.get("controlnet_masks")
    if pre == "inpaint_only+lama" and (not isinstance(masks, list) or len(masks) != len(images)):
        # the extension's: a preprocessor that requires a mask needs one per image
        raise ApiError(422, f"Preprocessor {pre} requires `controlnet_masks` param: one mask (white = repaint) per "
                            f"image of {key}", field="controlnet_masks")
    files = pose_files(models, "controlnet_module", pre) if pre in WITH_MODELS else None
    for k, text in enumerate(images):
        rgb = b64images.rgb_array(b64images.decode(text, f"{key}[{k}]", max_pixels))
        if pre == "inpaint_only+lama":  # the mask's first channel as alpha, as the extension's detect joins them
            import numpy as np

            mask = b64images.rgb_array(b64images.decode(masks[k], f"controlnet_masks[{k}]", max_pixels))[:, :, 0]
            if mask.shape != rgb.shape[:2]:
                raise ApiError(400, f"controlnet_masks[{k}] is {mask.shape[1]}x{mask.shape[0]} and {key}[{k}] "
                                    f"{rgb.shape[1]}x{rgb.shape[0]}: a mask is of its image's size",
                               field=f"controlnet_masks[{k}]")
            rgb = np.ascontiguousarray(np.concatenate([rgb, mask[:, :, None]], axis=2))
        if files is not None and pre in POSE_MODULES:
            try:
                made, pose = _pose_detect(rgb, files, 512 if res is None else int(res), backend, device, pre)
            except InputError as exc:  # a picture the resolution cannot take (a strip): the request's, a 400
                raise _detect_refusal(exc, key, k) from None
            except (ModelError, WeightsError) as exc:
                raise _file_refusal(exc, files, models, "controlnet_module") from None
            poses.append(pose)
            out.append(base64.b64encode(encode_png(made)).decode("ascii"))
            continue
        # shuffle: the extension's detect draws from numpy's unseeded global generator, a new map each call
        seed = secrets.randbelow(2**32) if pre == "shuffle" else None
        try:
            made = preprocess(rgb, pre, a, b, None if res is None else int(res), seed, models=files, backend=backend,
                              device=device, where="controlnet_module")
        except InputError as exc:  # a slider in range the picture cannot take: the request's, a 400
            raise _detect_refusal(exc, key, k) from None
        except (ModelError, WeightsError) as exc:
            raise _file_refusal(exc, files or (), models, "controlnet_module") from None
        out.append(base64.b64encode(encode_png(made)).decode("ascii"))
    return {"images": out, "poses": poses, "info": "Success"} if poses else {"images": out, "info": "Success"}


def admin_paths(text: str, models: Path | None) -> str:
    """``text`` with the server's paths under the models folder (or the folder above it, where the extension's and
    ComfyUI's layouts are) written as the admin names them, ``<models>/...`` and ``<models>/../...``."""
    if models is None:
        return text
    import os

    for folder, name in ((Path(models), "<models>"), (Path(models).parent, "<models>/..")):
        for sep in {os.sep, "/"}:
            if str(folder).rstrip(sep):  # a folder at the root would take every "/" away
                text = text.replace(str(folder).rstrip(sep) + sep, name + "/")
    return text


def _file_refusal(exc: SdrtError, files: tuple[Path, ...], models: Path | None, field: str) -> ApiError:
    """A preprocessor's file on the server that is not its model (another network, a truncated download): a 400
    naming the request's module field, the file as the admin names it (as a missing one is); an error that is not
    about those files goes on as it was."""
    if isinstance(exc, FileChanged) or str(exc.where) not in {str(f) for f in files}:
        raise exc
    text = exc.what + (f"; {exc.fix}" if exc.fix else "")
    return ApiError(400, f"{field}: {admin_paths(text, models)}", field=field)


def _pose_detect(rgb: Any, files: tuple[Path, ...], res: int, backend: str = "auto", device: Any = None,
                 pre: str = "dw_openpose_full") -> tuple[Any, dict[str, Any]]:
    """The map and OpenPose JSON of one image as the extension's detect makes them (``pre``: dw_openpose_full or
    one of the torch OpenPose modules): at the processor resolution, padded to 64 (the JSON in pixels, or
    fractions for the torch modules, of the padded image, as the extension's callback)."""
    import numpy as np

    from ..pipelines.controlmaps import processor_input
    from ..pipelines.preprocessors import (
        OPENPOSE_PARTS,
        animal_pose,
        dwpose,
        held,
        openpose_body,
        openpose_parts,
        pose_detect,
    )

    padded, (h, w) = processor_input(rgb, res)
    with held():  # in use: a job's trim on another thread leaves it open
        det = (openpose_parts(pre, files, backend, device, where="controlnet_module") if pre in OPENPOSE_PARTS else
               animal_pose(files, backend, device, where="controlnet_module") if pre == "animal_openpose" else
               openpose_body(files[0], backend, device, where="controlnet_module") if len(files) == 1 else
               dwpose(files, backend, device, where="controlnet_module"))
        made, pose = pose_detect(padded, det)
    return np.ascontiguousarray(made[:h, :w]), pose


#: the preprocessor whose refusal (its ``where``'s last name) is about a slider, and that slider's detect field
_REFUSED_SLIDER = {"tile_resample": "controlnet_threshold_a", "color_grid": "controlnet_processor_res",
                   "blur_gaussian": "controlnet_threshold_a", "scribble_xdog": "controlnet_threshold_a",
                   "processor_res": "controlnet_processor_res"}  # a network's image too large at that resolution


def _detect_refusal(exc: InputError, key: str, k: int) -> ApiError:
    """The preprocessor's refusal of one detect image as a 400 naming the slider it is about (else the image)."""
    field = _REFUSED_SLIDER.get(str(getattr(exc, "where", "") or "").rsplit(".", 1)[-1], f"{key}[{k}]")
    fix = getattr(exc, "fix", None)
    what = getattr(exc, "what", str(exc))
    return ApiError(400, f"{field}: {what}" + (f"; {fix}" if fix else ""), field=field)


__all__ = ["API_VERSION", "FACE_MODULES", "IP_MODULES", "MAX_UNITS", "MODULES", "detect", "ip_adapters",
           "module_detail", "module_list", "pose_files", "render_openpose_json", "script", "units"]
