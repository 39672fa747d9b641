"""``sdrt generate`` options for the toolbox: ControlNet, hires fix, live previews, A1111's seeds.

ControlNet flags are grouped by position: the first ``--control-image`` goes with the first
``--controlnet`` (a folder, a ``model.onnx`` or a ControlNet ``.safetensors``; default: the model folder's
``controlnet/``, then ``controlnet_2/``, ...), and so on;
``--control-scale``/``--control-start``/``--control-end``/``--control-preprocessor``/``--control-threshold-a``/
``--control-threshold-b``/``--control-resize``/``--control-mode``/``--control-union-mode``/
``--control-processor-res``/``--control-pixel-perfect`` given once apply to every ControlNet, else once per
ControlNet. Everything is checked before any model loads (``sdrt.pipelines.toolbox.split``).

A preprocessor that reads a resolution runs at ``--control-processor-res`` (default :data:`PROCESSOR_RES`, 512:
sd-webui-controlnet's slider default, which ``sdrt serve`` takes too; ``none``: the image's own size, the API's
``processor_res=None``), or at the extension's pixel-perfect resolution with ``--control-pixel-perfect``.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..pipelines.preprocessors import NAMES as PREPROCESSORS
from ..pipelines.preprocessors import WITH_MODELS
from . import OptionalValue


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("ControlNet (repeat each flag once per ControlNet)")
    g.add_argument("--controlnet", action="append", default=[], metavar="DIR|FILE",
                   help="a ControlNet folder (model.onnx, or diffusers' diffusion_pytorch_model.safetensors), or a "
                        "ControlNet .safetensors as downloaded (control_v11p_sd15_canny.safetensors, SDXL ControlNets "
                        "in diffusers' layout, Stability AI's SDXL Control-LoRAs, Flux.1 dev ControlNets in diffusers' layout such as "
                        "InstantX/FLUX.1-dev-Controlnet-Canny); default: the model folder's controlnet/, controlnet_2/, ...")
    g.add_argument("--control-image", action="append", default=[], metavar="PNG",
                   help="the control image (of a ControlNet; of a FLUX.1 Canny/Depth model itself, with no --controlnet)")
    g.add_argument("--control-mask", action="append", default=[], metavar="PNG",
                   help="the mask (white = repaint) of an SD3 inpainting ControlNet's --control-image, the picture "
                        "to inpaint (alimama's SD3-Controlnet-Inpainting), or of an inpaint / inpaint_only unit's "
                        "(control_v11p_sd15_inpaint; inpaint_only+lama too; a unit whose --control-image is the --init-image takes "
                        "--mask)")
    g.add_argument("--control-scale", action="append", type=float, default=[], metavar="S", help="weight (1)")
    g.add_argument("--control-start", action="append", type=float, default=[], metavar="A",
                   help="first step, as a fraction of the steps (0)")
    g.add_argument("--control-end", action="append", type=float, default=[], metavar="B",
                   help="last step, as a fraction of the steps (1)")
    g.add_argument("--control-preprocessor", action="append", default=[],
                   choices=[*PREPROCESSORS, "inpaint_global_harmonious"],
                   metavar="NAME", help="turn the image into a control map first, with sd-webui-controlnet's "
                   "preprocessors at their default sliders: " + ", ".join(PREPROCESSORS) + " (none); "
                   "the ones that run a model (" + ", ".join(WITH_MODELS) + ") read --control-preprocessor-models; "
                   "reference_only, reference_adain, reference_adain+attn make no map and need no --controlnet: the "
                   "picture guides the UNet itself (--control-threshold-a: the style fidelity); so do SDXL's "
                   "revision_clipvision and revision_ignore_prompt (the picture's CLIP embedding for the pooled "
                   "prompt; --control-preprocessor-models: OpenCLIP ViT-bigG/14, clip_g.pth or "
                   "clip_vision_g.safetensors; --control-threshold-a: the noise augmentation)")
    g.add_argument("--control-preprocessor-models", action="append", default=[], metavar="PATH",
                   help="the model files of a preprocessor that runs one: the folder holding them (dw_openpose_full: "
                        "yolox_l.onnx and dw-ll_ucoco_384.onnx; animal_openpose: yolox_l.onnx and "
                        "rtmpose-m_simcc-ap10k_pt-aic-coco_210e-256x256-7a041aa1_20230206.onnx; openpose: body_pose_model.pth; mlsd: "
                        "mlsd_large_512_fp32.pth; softedge_hed, softedge_hedsafe, scribble_hed: ControlNetHED.pth; "
                        "softedge_pidinet, softedge_pidisafe, scribble_pidinet: table5_pidinet.pth; softedge_teed: "
                        "7_model.pth; softedge_anyline: MTEED.pth; normal_bae: scannet.pt; seg_ufade20k: upernet_global_small.pth; seg_anime_face: UNet.pth; depth_leres: res101.pth (depth_leres++: with "
                        "latest_net_G.pth); depth_zoe: ZoeD_M12_N.pt; openpose_hand, openpose_face(only), openpose_full: body_pose_model.pth with "
                        "hand_pose_model.pth and/or facenet.pth; inpaint_only+lama: ControlNetLama.pth; instant_id_face_keypoints: "
                        "InsightFace antelopev2's scrfd_10g_bnkps.onnx; ...), or an A1111 or "
                        "ComfyUI folder with sd-webui-controlnet's extensions/sd-webui-controlnet/annotator/downloads/"
                        "<name> or controlnet_aux's custom_nodes/comfyui_controlnet_aux/ckpts/<repo> under it, or the "
                        "file of one that reads one (DWPose's two files: their folder); once for all, or per image")
    g.add_argument("--control-pose-models", action="append", default=[], metavar="PATH",
                   help="the older name of --control-preprocessor-models")
    g.add_argument("--control-threshold-a", action="append", type=float, default=[], metavar="A",
                   help="the preprocessor's first slider (the extension's threshold_a): canny's low threshold (100), "
                        "the scribble/threshold level (127), tile_resample's down sampling rate (1), scribble_xdog's "
                        "threshold (32), blur_gaussian's sigma (9), the recolor gamma (1), mlsd's value threshold (0.1), "
                        "normal_midas's background threshold (0.4), softedge_teed's and softedge_anyline's safe steps (2), tile_colorfix's "
                        "variation (8, the colour fix's blur), depth_leres's Remove Near %% (0)")
    g.add_argument("--control-threshold-b", action="append", type=float, default=[], metavar="B",
                   help="the preprocessor's second slider (threshold_b): canny's high threshold (200), mlsd's distance "
                        "threshold (0.1), tile_colorfix+sharp's sharpness (1), depth_leres's Remove "
                        "Background %% (0)")
    g.add_argument("--control-processor-res", action="append", default=[], metavar="N|none",
                   help="the resolution a preprocessor that reads one runs at (sd-webui-controlnet's Preprocessor "
                        "Resolution: the image's shorter side scaled to N pixels, 1 to 8192; default 512 (softedge_anyline 1280), the "
                        "extension's and sdrt serve's; none: the image's own size, as the Python API's default)")
    # its value is taken only when the next word is on or off: a bare flag before the prompt leaves it the prompt
    g.add_argument("--control-pixel-perfect", action=OptionalValue, default=[], const="on", choices=("on", "off"),
                   help="run the preprocessor at the extension's pixel-perfect resolution instead: the image's "
                        "shorter side once scaled to cover the output (to fit in it for Resize and Fill); alone it is "
                        "on for every ControlNet, or on/off once per --control-image; a pixel-perfect unit does not "
                        "read --control-processor-res")
    g.add_argument("--control-face-tokens", action=OptionalValue, default=[], const="on", choices=("on", "off"),
                   help="InstantID's ControlNet: the net reads the face tokens of the --ip-adapter InstantID adapter as "
                        "its text, not the prompt (default: when the net's file or folder name says instant_id / "
                        "InstantID, or its preprocessor is instant_id_face_keypoints); alone it is on for every "
                        "ControlNet, or on/off once per --control-image")
    g.add_argument("--control-resize", action="append", default=[], metavar="MODE",
                   help='how the image meets the output size: "Just Resize", "Crop and Resize" (default), "Resize '
                        'and Fill" (sd-webui-controlnet\'s, with its own resampling; any case, or 0 to 2, as '
                        '--resize-mode takes them)')
    g.add_argument("--control-mode", action="append", default=[], metavar="MODE",
                   help='sd-webui-controlnet\'s control mode: "Balanced" (0, default), "My prompt is more important" '
                        '(1), "ControlNet is more important" (2)')
    g.add_argument("--control-union-mode", action="append", default=[], metavar="N|TYPE",
                   help="a union ControlNet's control type: a union Flux ControlNet's mode number (diffusers' "
                        "control_mode on the net's model card, e.g. 0 canny, 2 depth for InstantX/Shakker-Labs Union); "
                        "xinsir's SDXL ControlNet Union: its number or name (openpose, depth, softedge, canny, normal, "
                        "segment, tile, inpaint; lineart/mlsd = canny, scribble/hed = softedge), default: told by "
                        "--control-preprocessor")
    g.add_argument("--control-inpaint-crop", action="append", default=[], choices=("on", "off"),
                   help="with --inpaint-area only-masked: on (default) cuts the control image to the area repainted "
                        "before its preprocessor, as sd-webui-controlnet's inpaint_crop_input_image; off: the whole "
                        "image")
    g.add_argument("--control-hr-option", action="append", default=[], metavar="PASS",
                   help='with --hires-scale, the passes the ControlNet takes part in (sd-webui-controlnet\'s hr_option): '
                        '"Both" (0, default), "Low res only" (1: the first pass), "High res only" (2: the second)')
    g.add_argument("--guess-mode", action="store_true",
                   help="diffusers' guess mode for every ControlNet (residuals scaled 0.1 to 1, none for the negative "
                        "prompt)")
    i = p.add_argument_group("IP-Adapter (an image prompt; SD 1.x, SD 2.x, SDXL); each flag repeats, paired in order "
                             "with --ip-adapter: one --ip-adapter-image per adapter, the others once for every adapter or once "
                             "per adapter")
    i.add_argument("--ip-adapter", action="append", default=[], metavar="FILE",
                   help="an adapter: h94/IP-Adapter's models/ip-adapter_sd15.safetensors (SD 1.x) or "
                        "sdxl_models/ip-adapter_sdxl_vit-h.safetensors (SDXL), the Plus, Full Face and ViT-bigG/14 ones "
                        "too; repeat it for several (their attentions add up: a style picture and a face, say)")
    i.add_argument("--ip-adapter-image", action="append", default=[], metavar="PNG",
                   help="the picture an adapter reads (one per --ip-adapter)")
    i.add_argument("--ip-adapter-scale", action="append", type=float, default=[], metavar="X",
                   help="how much of the picture (diffusers' set_ip_adapter_scale; default 1, 0.5-0.7 keeps more "
                        "of the prompt)")
    i.add_argument("--ip-adapter-start", action="append", type=float, default=[], metavar="F",
                   help="the fraction of the steps an adapter starts at (default 0; diffusers' ControlNet window rule: "
                        "step i of n is on unless i/n < start or (i+1)/n > end)")
    i.add_argument("--ip-adapter-end", action="append", type=float, default=[], metavar="F",
                   help="the fraction of the steps an adapter ends at (default 1); outside its window it adds nothing")
    i.add_argument("--image-encoder", action="append", default=[], metavar="DIR",
                   help="an adapter's CLIP image encoder (h94/IP-Adapter's models/image_encoder, ViT-H/14, or "
                        "sdxl_models/image_encoder, ViT-bigG/14, for ip-adapter_sdxl; default: of image_encoder/ "
                        "beside the adapter, models/image_encoder and sdxl_models/image_encoder, the one that gives "
                        "what the adapter reads); adapters of one encoder encode their pictures in one call")
    i.add_argument("--face-models", action="append", default=[], metavar="DIR",
                   help="for the FaceID adapters (ip-adapter-faceid_sd15, ip-adapter-faceid-plusv2_sd15, their _sdxl "
                        "ones): InsightFace's buffalo_l folder (det_10g.onnx, w600k_r50.onnx), or the folder holding it "
                        "as sd-webui-controlnet (annotator/downloads/insightface/models/buffalo_l) or ComfyUI "
                        "(models/insightface/models/buffalo_l) keep it; run on the chosen backend. FaceID's LoRA "
                        "(..._lora.safetensors) is passed with --lora. InstantID's adapter (ip-adapter.bin, "
                        "ip-adapter_instant_id_sdxl.bin) reads antelopev2 (scrfd_10g_bnkps.onnx, glintr100.onnx) "
                        "instead, found the same ways; its ControlNet (a --controlnet whose file or folder name says "
                        "instant_id / InstantID, or --control-face-tokens) then reads the face tokens as its text")
    i.add_argument("--ip-adapter-s-scale", action="append", type=float, default=[], metavar="X",
                   help="FaceID Plus v2's s_scale: how much of the face embedding's own tokens are added (default 1)")
    h = p.add_argument_group("hires fix (A1111's)")
    h.add_argument("--hires-scale", type=float, default=None, metavar="X", help="turn it on: upscale by X (e.g. 2)")
    h.add_argument("--hires-steps", type=int, default=None, metavar="N", help="second-pass steps (0: as the first)")
    h.add_argument("--hires-denoise", type=float, default=None, metavar="D", help="second-pass denoising (0.7)")
    h.add_argument("--hires-upscaler", default=None, metavar="NAME",
                   help='"Latent" (default), "Latent (bicubic)", "Latent (nearest)", ..., "Lanczos" (Pillow), or a model upscaler: an ESRGAN-family .safetensors/.pth file or its name in $SDRT_UPSCALERS')
    h.add_argument("--hires-width", type=int, default=None, metavar="W",
                   help="turn it on at this width instead of --hires-scale (A1111's \"Resize width to\"); alone, the "
                        "height follows the aspect ratio; with --hires-height the picture is upscaled to cover "
                        "W x H and cropped at the centre")
    h.add_argument("--hires-height", type=int, default=None, metavar="H",
                   help="turn it on at this height (A1111's \"Resize height to\"); see --hires-width")
    h.add_argument("--hires-sampler", default=None, metavar="NAME", help="the second pass's sampler (the first's)")
    h.add_argument("--hires-schedule", default=None, metavar="NAME",
                   help="the second pass's schedule type (the first's)")
    h.add_argument("--hires-prompt", default=None, metavar="TEXT", help="the second pass's prompt (the first's)")
    h.add_argument("--hires-negative-prompt", default=None, metavar="TEXT",
                   help="the second pass's negative prompt (the first's)")
    h.add_argument("--hires-checkpoint", default=None, metavar="FILE|DIR",
                   help="the second pass's model (A1111's \"Hires checkpoint\"): its text encoders, UNet and VAE run "
                        "the hires pass; with a Latent upscaler it must share the first model's latents (SD 1.x/2.x, "
                        "SDXL, ...), with an image upscaler any SD 1.x/2.x/XL model follows")
    r = p.add_argument_group("refiner (A1111's)")
    r.add_argument("--refiner", default=None, metavar="FILE|DIR",
                   help="a refiner that takes over from the model at --refiner-switch-at: the SDXL refiner "
                        "(sd_xl_refiner_1.0.safetensors, or its ONNX/diffusers folder) after an SDXL model")
    r.add_argument("--refiner-switch-at", type=float, default=None, metavar="F",
                   help="the fraction of the schedule the model runs before the refiner (0.8; 1: never)")
    r.add_argument("--refiner-switch-by-steps", action="store_true", default=None,
                   help="switch at --refiner-switch-at of the sampler's denoiser calls, not of the timesteps (A1111's "
                        "refiner_switch_by_sample_steps option)")
    r.add_argument("--hires-refiner-pass", default=None, metavar="PASS",
                   help='with --hires-scale, where the refiner may take over (A1111\'s hires_fix_refiner_pass): '
                        '"second pass" (default), "first pass" (then it runs all of the hires pass), "both passes"')
    s = p.add_argument_group("seeds (A1111's)")
    s.add_argument("--rng", default="cpu", choices=["cpu", "gpu", "nv"],
                   help="noise source: cpu (diffusers'; default), gpu (A1111's default CUDA noise), nv")
    s.add_argument("--subseed", type=int, default=None, help="variation seed (-1: random)")
    s.add_argument("--subseed-strength", type=float, default=0.0, help="variation strength, 0 to 1")
    v = p.add_argument_group("live previews")
    v.add_argument("--preview-dir", default=None, metavar="DIR", help="write a preview PNG after every step there")
    v.add_argument("--preview-every", default=None, metavar="N",
                   help="with --preview-dir: a preview every N steps only, and after the last (A1111's "
                        "show_progress_every_n_steps; default 1)")
    v.add_argument("--preview-decoder", default=None, metavar="ONNX",
                   help="decode previews with this TAESD/TAESDXL/TAEF1 decoder (default: the linear projection)")
    v.add_argument("--preview-size", default=None, metavar="PX|full",
                   help="the longer side of a decoded preview at most (default 256: the latent is shrunk before "
                        "the decode, a quarter of a 512x512 decode's cost), or full (or None) for the decoder's full size")


def _per_unit(values: list[Any], n: int, flag: str) -> list[Any]:
    if not values:
        return [None] * n
    if len(values) == 1:
        return values * n
    if len(values) != n:
        raise InputError(f"{len(values)} {flag} values for {n} ControlNet(s)", where=flag,
                         fix=f"give {flag} once (for every ControlNet) or once per --control-image")
    return values


#: the IP-Adapter flags besides --ip-adapter, by the field the pipeline's errors name (sdrt.pipelines.ipadapter)
_IP_FLAGS = (("image", "ip_adapter_image"), ("scale", "ip_adapter_scale"), ("start", "ip_adapter_start"),
             ("end", "ip_adapter_end"), ("image_encoder", "image_encoder"), ("face_models", "face_models"),
             ("s_scale", "ip_adapter_s_scale"))


def _ip_adapters(args: argparse.Namespace, opts: dict[str, Any]) -> None:
    """``--ip-adapter`` and its flags, paired in order: the pipeline's ``ip_adapter`` (one, or a list)."""
    files = args.ip_adapter
    if not files:
        for _, key in _IP_FLAGS:
            if getattr(args, key):
                raise InputError(f"{{@{key}}} without --ip-adapter", where=key,
                                 fix="pass --ip-adapter FILE too, or leave {@" + key + "} out")
        return
    n = len(files)
    images = args.ip_adapter_image
    if not images:
        raise InputError("--ip-adapter needs --ip-adapter-image (the picture it reads)", where="--ip-adapter",
                         fix="pass --ip-adapter-image PNG too" + (" (one per --ip-adapter)" if n > 1 else ""))
    if len(images) != n:
        raise InputError(f"{len(images)} --ip-adapter-image for {n} --ip-adapter", where="--ip-adapter-image",
                         fix="give one --ip-adapter-image per --ip-adapter, in the same order")

    def each(key: str) -> list[Any]:
        values = getattr(args, key)
        flag = "--" + key.replace("_", "-")
        if len(values) > 1 and len(values) != n:
            raise InputError(f"{len(values)} {flag} values for {n} --ip-adapter", where=flag,
                             fix=f"give {flag} once (for every adapter) or once per --ip-adapter, in the same order")
        return values * n if len(values) == 1 else values or [None] * n

    from ..pipelines.ipadapter import IPAdapter, field_name

    scales, starts, ends, encoders, faces, s_scales = (
        each(k) for k in ("ip_adapter_scale", "ip_adapter_start", "ip_adapter_end", "image_encoder", "face_models",
                          "ip_adapter_s_scale"))
    units = [IPAdapter(f, image=img, scale=1.0 if sc is None else sc, image_encoder=enc,
                       start=0.0 if st is None else st, end=1.0 if en is None else en, face_models=fm,
                       s_scale=1.0 if ss is None else ss)
             for f, img, sc, st, en, enc, fm, ss in zip(files, images, scales, starts, ends, encoders, faces, s_scales)]
    opts["ip_adapter"] = units[0] if n == 1 else units
    if n > 1:  # the pipeline names adapter j's fields ip_adapter[j] ...: errors say which flag, and which one
        names = {field_name("", j, n): f"the {_ordinal(j + 1)} --ip-adapter" for j in range(n)}
        # a flag given once is every adapter's: said so, not as "the 2nd --image-encoder" the caller never gave
        names.update({field_name(name, j, n): f"--{key.replace('_', '-')} (given once: every adapter's)"
                      if len(getattr(args, key)) == 1 else f"the {_ordinal(j + 1)} --{key.replace('_', '-')}"
                      for j in range(n) for name, key in _IP_FLAGS})
        args._names = {**getattr(args, "_names", {}), **names}


def options(args: argparse.Namespace) -> dict[str, Any]:
    """The pipeline keywords these flags give (checked later, with the rest, by the pipeline)."""
    opts: dict[str, Any] = {}
    images = args.control_image
    if not images:  # every ControlNet flag shapes a control image's unit: without one it would do nothing
        for flag in ("controlnet", "control_mask", "control_scale", "control_start", "control_end",
                     "control_preprocessor", "control_threshold_a", "control_threshold_b", "control_resize",
                     "control_mode", "control_union_mode", "control_inpaint_crop", "control_hr_option",
                     "control_preprocessor_models", "control_pose_models", "guess_mode", "control_processor_res",
                     "control_pixel_perfect", "control_face_tokens"):
            if getattr(args, flag):
                name = "--" + flag.replace("_", "-")
                raise InputError(f"{name} needs a --control-image", where=name,
                                 fix=f"pass --control-image PNG for each ControlNet, or leave {name} out")
    if images:
        n = len(images)
        nets = args.controlnet or []
        if nets and len(nets) != n:
            raise InputError(f"{len(nets)} --controlnet for {n} --control-image", where="--controlnet",
                             fix="give one --controlnet per --control-image (or none: the folder's own)")
        # the pipeline names each unit controlnets[k]: errors say the flag, and which one when there are several
        flag = "--controlnet" if nets else "--control-image"
        # in place: main's caller_words (the words of the run's logged warnings) holds this dict, and a new one
        # left a warning about a unit in the API's words ("controlnets[0] /x/c.gif: ...")
        if not hasattr(args, "_names"):
            args._names = {}
        args._names.update({f"controlnets[{k}]": flag if n == 1 else f"the {_ordinal(k + 1)} {flag}" for k in range(n)})
        args._names.update({
            f"controlnets[{k}] {arg}": name if n == 1 else f"the {_ordinal(k + 1)} {name}" for k in range(n)
            for arg, name in (("low", "--control-threshold-a"), ("high", "--control-threshold-b"),
                              ("hr_option", "--control-hr-option"),
                              ("control_mask", "--control-mask"), ("face_tokens", "--control-face-tokens"))})
        perfect = _per_unit([v == "on" for v in args.control_pixel_perfect], n, "--control-pixel-perfect")
        for k in range(n):  # a resolution the pipeline refuses (a network's image too large at it): the flag that gave it
            name = "--control-pixel-perfect" if perfect[k] else "--control-processor-res"
            once = len(getattr(args, name[2:].replace("-", "_"))) <= 1
            args._names[f"controlnets[{k}] processor_res"] = name if n == 1 else \
                f"{name} (for the {_ordinal(k + 1)} --control-image)" if once else f"the {_ordinal(k + 1)} {name}"
        nets = nets or ["controlnet"] + [f"controlnet_{i + 1}" for i in range(1, n)]
        from ..pipelines.images import _missing

        for path in images:  # missing, a folder, a device or FIFO: said before any model loads (the pipeline reads it)
            if Path(path).is_dir():
                raise InputError(f"the control image {path} is a folder, not an image file",
                                 where=f"--control-image {path}", fix="pass an image file (PNG, JPEG) in that folder")
            if not Path(path).is_file():
                raise _missing(Path(path), "control image", "--control-image")
        from ..pipelines.controlnet import ControlNet, _num, control_mode

        modes = [control_mode(m, "--control-mode") for m in args.control_mode]  # in the flag's words
        from ..pipelines.controlnet import hr_option

        passes = [hr_option(m, "--control-hr-option") for m in args.control_hr_option]
        if any(o != "Both" for o in passes) and all(getattr(args, k, None) is None for k in
                                                    ("hires_scale", "hires_width", "hires_height")):
            raise InputError("--control-hr-option picks a pass of the hires fix, and there is no --hires-scale",
                             where="--control-hr-option", fix="pass --hires-scale too, or leave --control-hr-option out")
        from ..pipelines.controlmaps import RESIZE_MODES
        from ..pipelines.images import resize_mode

        resizes = [resize_mode(m, "--control-resize", RESIZE_MODES) for m in args.control_resize]
        if args.guess_mode and any(m != "Balanced" for m in modes):
            raise InputError("--guess-mode and --control-mode other than Balanced are two ways of scaling the "
                             "residuals", where="--guess-mode", fix="give one of them")

        for flag, values, high in (("--control-scale", args.control_scale, 10.0),
                                   ("--control-start", args.control_start, 1.0),
                                   ("--control-end", args.control_end, 1.0)):
            for value in values:  # in the flags' words: the pipeline speaks of "controlnets[0] start"
                _num(value, flag, 0.0, high)
        for i, value in enumerate(args.control_union_mode):  # the pipeline speaks of "controlnets[0] union_mode"
            text = value.strip()
            if text.lstrip("+-").isdigit():
                if int(text) < 0:
                    raise InputError(f"--control-union-mode must be a mode number (0, 1, ...), got {value}",
                                     where="--control-union-mode",
                                     fix="pass e.g. --control-union-mode 0 (the net's model card lists its modes)")
                args.control_union_mode[i] = int(text)
            elif not text or not text.replace("_", "").replace("-", "").isalpha():
                raise InputError(f"--control-union-mode must be a mode number (0, 1, ...) or a control type's name, "
                                 f"got {value!r:.40}", where="--control-union-mode",
                                 fix="pass e.g. --control-union-mode 3 or --control-union-mode canny")
        if len(args.control_start) == len(args.control_end) == 1 and args.control_start[0] > args.control_end[0]:
            raise InputError(f"--control-start {args.control_start[0]:g} is after --control-end "
                             f"{args.control_end[0]:g}", where="--control-start",
                             fix="pass a start at or before the end (fractions of the steps, 0 to 1)")
        if args.control_inpaint_crop:  # it cuts an only-masked run's control images: elsewhere it would do nothing
            from ..pipelines.onlymasked import ONLY_MASKED, check_area

            area = getattr(args, "inpaint_area", None)
            if area is None or check_area(area) != ONLY_MASKED:
                raise InputError("--control-inpaint-crop says whether an only-masked run cuts its control images, "
                                 "and --inpaint-area is not only-masked", where="--control-inpaint-crop",
                                 fix="pass --inpaint-area only-masked (with --mask), or leave --control-inpaint-crop "
                                     "out")
        pres = _per_unit(args.control_preprocessor, n, "--control-preprocessor")
        if not args.controlnet:  # a reference unit (reference_only, ...) reads no net: the folder's own go to the others
            from ..pipelines.refattn import MODULES as REFERENCE
            from ..pipelines.revision import MODULES as REVISION

            own = iter(["controlnet"] + [f"controlnet_{i + 1}" for i in range(1, n)])
            nets = [None if pre in REFERENCE + REVISION else next(own) for pre in pres]
        lows = _per_unit(args.control_threshold_a, n, "--control-threshold-a")
        highs = _per_unit(args.control_threshold_b, n, "--control-threshold-b")
        from ..pipelines.inpaintcn import ALIASES
        from ..pipelines.preprocessors import check_thresholds

        for pre, low, high in zip(pres, lows, highs):  # in the flags' words (the pipeline's: "controlnets[0] low")
            check_thresholds(ALIASES.get(pre, pre or "none"), low, high, "",
                             ("--control-threshold-a", "--control-threshold-b"))
        if args.control_pose_models and args.control_preprocessor_models:
            raise InputError("both --control-preprocessor-models and --control-pose-models are given",
                             where="--control-pose-models",
                             fix="pass --control-preprocessor-models alone (--control-pose-models is its older name)")
        mflag = "--control-pose-models" if args.control_pose_models else "--control-preprocessor-models"
        given = args.control_pose_models or args.control_preprocessor_models
        for k in range(n):
            args._names[f"controlnets[{k}] pose_models"] = mflag if n == 1 else f"the {_ordinal(k + 1)} {mflag}"
            args._names[f"controlnets[{k}] preprocessor_models"] = args._names[f"controlnets[{k}] pose_models"]
        poses = _per_unit(given, n, mflag)
        from ..pipelines.annotators import need
        from ..pipelines.preprocessors import model_files

        shared = len(given) == 1 and any(pre in WITH_MODELS for pre in pres)
        for pre, models in zip(pres, poses):  # in the flag's words
            if models is not None and pre not in WITH_MODELS and not shared:
                raise InputError(f"{mflag} is for the preprocessors that run a model ({', '.join(WITH_MODELS)}), and "
                                 f"the preprocessor is {pre or 'none'}", where=mflag,
                                 fix=f"pass --control-preprocessor with one of those, or leave {mflag} out")
            if pre in WITH_MODELS:
                if models is None:
                    raise InputError(f"{pre} needs {need(pre)}", where=f"--control-preprocessor {pre}",
                                     fix=f"pass {mflag} FOLDER holding them")
                model_files(pre, models, mflag)
        ress = _resolutions(args, pres, [bool(p) for p in perfect], images)
        backend = getattr(args, "backend", None) or "auto"
        init = getattr(args, "init_image", None)
        units = []
        for net, image, scale, start, end, pre, resize, mode, union, mask, low, high, crop, hr, pm, res, pp, ft in zip(
                nets, images, _per_unit(args.control_scale, n, "--control-scale"),
                _per_unit(args.control_start, n, "--control-start"), _per_unit(args.control_end, n, "--control-end"),
                pres, _per_unit(resizes, n, "--control-resize"), _per_unit(modes, n, "--control-mode"),
                _per_unit(args.control_union_mode, n, "--control-union-mode"),
                _per_unit(args.control_mask, n, "--control-mask"), lows, highs,
                _per_unit(args.control_inpaint_crop, n, "--control-inpaint-crop"),
                _per_unit(passes, n, "--control-hr-option"), poses, ress, perfect,
                _per_unit(args.control_face_tokens, n, "--control-face-tokens")):
            if pre in ("inpaint", "inpaint_only", "inpaint_only+lama", "inpaint_global_harmonious") and mask is None and init is not None \
                    and Path(image).resolve() == Path(init).resolve():
                image = None  # the extension's unit without an image: the run's init image and --mask
            units.append(ControlNet(net, image, 1.0 if scale is None else scale, 0.0 if start is None else start,
                                    1.0 if end is None else end, pre or "none", resize or "Crop and Resize",
                                    low=low, high=high, control_mode=mode or "Balanced",
                                    guess_mode=bool(args.guess_mode), union_mode=union, control_mask=mask,
                                    inpaint_crop=crop != "off", hr_option=hr or "Both", preprocessor_models=pm,
                                    pose_backend=backend, processor_res=res, pixel_perfect=bool(pp),
                                    face_tokens=None if ft is None else ft == "on"))
        opts["controlnets"] = units
    _ip_adapters(args, opts)
    for key in ("hires_scale", "hires_steps", "hires_denoise", "hires_upscaler", "hires_width", "hires_height",
                "hires_sampler", "hires_schedule", "hires_prompt", "hires_negative_prompt", "hires_checkpoint",
                "subseed", "refiner",
                "refiner_switch_at", "refiner_switch_by_steps", "hires_refiner_pass"):
        if getattr(args, key) is not None:
            opts[key] = getattr(args, key)
    if args.subseed is not None and not args.subseed_strength:  # A1111: a subseed at strength 0 changes nothing
        raise InputError("{@subseed} without {@subseed_strength}", where="subseed",
                         fix="pass {@subseed_strength} (e.g. 0.3) too, or leave {@subseed} out")
    if args.rng != "cpu":
        opts["rng"] = args.rng
    if args.subseed_strength:
        opts["subseed_strength"] = args.subseed_strength
    if args.preview_decoder:
        opts["preview"] = args.preview_decoder
    if args.preview_size is not None:
        text = str(args.preview_size).strip().lower()
        opts["preview_size"] = None if text in ("full", "none") else int(text) if text.lstrip("-").isdecimal() else text
    if args.preview_every is not None:
        every = args.preview_every
        if not str(every).strip().isdecimal() or int(every) < 1:
            raise InputError(f"{{@preview_every}} must be a whole number of steps, at least 1, got {every!r}",
                             where="preview_every", fix="pass e.g. 5 (a preview every 5 steps)")
        if args.preview_dir is None:
            raise InputError("{@preview_every} without {@preview_dir}", where="preview_every",
                             fix="pass {@preview_dir} too, or leave {@preview_every} out")
    for key in ("preview_decoder", "preview_size"):  # they shape the previews --preview-dir writes
        if getattr(args, key) is not None and args.preview_dir is None:
            raise InputError(f"{{@{key}}} without {{@preview_dir}}", where=key,
                             fix=f"pass {{@preview_dir}} too, or leave {{@{key}}} out")
    if args.preview_dir is not None and Path(args.preview_dir).exists() and not Path(args.preview_dir).is_dir():
        raise InputError(f"{args.preview_dir} is a file, and --preview-dir takes a folder", where="--preview-dir",
                         fix="pass a folder for the preview PNGs (create it first)")
    if args.preview_dir is not None and not Path(args.preview_dir).is_dir():
        raise InputError("the preview folder does not exist", where=args.preview_dir,
                         fix="create it, or pick another --preview-dir")
    if args.preview_dir is not None and not os.access(args.preview_dir, os.W_OK | os.X_OK):  # not after step 1
        raise InputError(f"cannot write into the folder {args.preview_dir}: it is not writable", where="--preview-dir",
                         fix="pick a folder you can write to")
    return opts


#: the resolution the preprocessors that read one run at without --control-processor-res (sd-webui-controlnet's slider
#: default, and sdrt serve's; softedge_anyline's is 1280, as the extension's: preprocessors.default_resolution; the
#: Python API's processor_res=None is the image's own size)
PROCESSOR_RES = 512


def _resolutions(args: argparse.Namespace, pres: list[Any], perfect: list[bool], images: list[str]) -> list[Any]:
    """Each unit's ``processor_res`` from ``--control-processor-res`` (default :data:`PROCESSOR_RES`; ``none``: None,
    the image's own size), checked in the flag's words before any model loads: a whole number from 1 to the API's
    limit; given, some unit's preprocessor must read it; a network's image at it within ``MAX_NET_PIXELS``."""
    from ..pipelines.controlnet import MAX_PROCESSOR_RES
    from ..pipelines.preprocessors import AT_RESOLUTION, default_resolution

    flag, n = "--control-processor-res", len(pres)
    values: list[Any] = []
    for text in args.control_processor_res:
        word = str(text).strip()
        if word.casefold() == "none":
            values.append(None)
            continue
        if not word.isdecimal() or not 1 <= int(word) <= MAX_PROCESSOR_RES:
            raise InputError(f"{flag} must be a whole number of pixels from 1 to {MAX_PROCESSOR_RES}, or none (the "
                             f"image's own size), got {word[:40]!r}", where=flag,
                             fix=f"pass e.g. {flag} {PROCESSOR_RES} (sd-webui-controlnet's default)")
        values.append(int(word))
    readers = [k for k in range(n) if (pres[k] or "none") in AT_RESOLUTION]
    for name, given in ((flag, values), ("--control-pixel-perfect", [k for k in range(n) if perfect[k]])):
        if given and not readers:  # as a threshold the preprocessor does not read: refused, not dropped
            raise InputError(f"{name}: the {pres[0] or 'none'} preprocessor reads no resolution" if n == 1 else
                             f"{name}: none of the preprocessors ({', '.join(p or 'none' for p in pres)}) reads a "
                             "resolution", where=name, fix=f"leave {name} out, or pass a --control-preprocessor that "
                                                           "reads one (canny, softedge_hed, ...)")
    if values and all(perfect[k] for k in readers):
        raise InputError(f"{flag} is given and every ControlNet whose preprocessor reads it is --control-pixel-perfect,"
                         " which works the resolution out itself", where=flag,
                         fix=f"leave {flag} or --control-pixel-perfect out")
    out = _per_unit(values, n, flag) if values else [default_resolution(pre) for pre in pres]
    from ..pipelines.onlymasked import ONLY_MASKED, check_area

    area = getattr(args, "inpaint_area", None)
    only_masked = area is not None and check_area(area) == ONLY_MASKED
    for k, (pre, res, image) in enumerate(zip(pres, out, images)):
        if res is None or perfect[k] or (pre or "none") not in AT_RESOLUTION or only_masked:
            continue  # pixel perfect, or an only-masked run's cut image: the pipeline checks it at its size
        try:
            from PIL import Image

            with Image.open(image) as im:
                w, h = im.size
        except Exception:  # noqa: BLE001 - read by the pipeline, which says what is wrong with it
            continue
        from ..pipelines.controlmaps import ControlImageError
        from ..pipelines.preprocessors import map_size

        try:
            map_size(pre, h, w, res)
        except ControlImageError as exc:
            name = flag if n == 1 or len(values) == 1 else f"the {_ordinal(k + 1)} {flag}"
            said = f"{name} {res}" if values else f"the default {flag} {res}"
            raise InputError(f"{said}: {exc.what} (--control-image {image} is {w}x{h})", where=name,
                             fix=f"pass a smaller {flag} (or none: the image's own size), or crop the image to "
                                 "nearer a square") from None
    return out


#: the names ``PreviewWriter`` writes (``--preview-dir`` is checked against the inputs with it)
PREVIEW_NAMES = re.compile(r"preview-\d+-\d{3,}\.png")


class PreviewWriter:
    """A step callback that writes ``preview-R-NNN.png`` previews (``pipe.preview()``) into a folder, then calls
    ``inner``: after every ``every``-th step of a pass and after its last (A1111's show_progress_every_n_steps)."""

    def __init__(self, pipe: Any, folder: str | None, inner: Any, every: int | str | None = None) -> None:
        self.pipe, self.folder, self.inner = pipe, Path(folder) if folder else None, inner
        self.every = int(every or 1)
        self.run = 0

    def __call__(self, step: int, total: int, latents: Any = None) -> None:
        from .interrupt import check

        check()  # a Ctrl-C that CPython swallowed (sdrt.cli.interrupt) ends the run at this step
        if step == 1:
            self.run += 1
        if self.folder is not None and (step % self.every == 0 or step == total):
            from ..pipelines.png import write_png

            image = self.pipe.preview(upscale=8)
            if image is not None:
                write_png(self.folder / f"preview-{self.run}-{step:03d}.png", image)
        self.inner(step, total, latents)


def _ordinal(i: int) -> str:
    """1st, 2nd, 3rd, 4th, ... 11th, 12th, 13th, ... 21st."""
    return f"{i}{'th' if 10 <= i % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(i % 10, 'th')}"
