"""Where the model-backed ControlNet preprocessors' files are: one table, one finder for the API, CLI and server.

sd-webui-controlnet downloads each annotator's files into ``extensions/sd-webui-controlnet/annotator/downloads/
<folder>``; ComfyUI's controlnet_aux into ``custom_nodes/comfyui_controlnet_aux/ckpts/<repo>`` (the Hugging Face
repository they come from). :func:`find` takes the file itself, the files, a folder holding them, or a folder with
either layout under it (an A1111 or ComfyUI root, its models folder, the extension's folder).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError

__all__ = ["ANNOTATORS", "OLD_FOLDERS", "Files", "encoder_path", "find", "layouts", "need"]


@dataclass(frozen=True)
class Files:
    """The files one preprocessor reads (in the order its model takes them), the extension's download folders
    for them, and the Hugging Face repositories they come from (ComfyUI keeps them under ``ckpts/<repo>``)."""

    names: tuple[str, ...]
    folders: tuple[str, ...]
    repos: tuple[str, ...]
    #: how errors name the model ("DWPose's", "OpenPose's body model")
    what: str = ""
    #: other names a one-file model is also published under (other sizes, formats), taken where ``names[0]`` is not
    alternatives: tuple[str, ...] = ()
    #: a model whose files may lie in different folders (ComfyUI keeps the animal pose model apart from its
    #: detector): per file, the other names it is published under; each file is then taken from the first folder
    #: (most specific first) that holds it under one of its names
    apart: tuple[tuple[str, ...], ...] = ()


ANNOTATORS: dict[str, Files] = {
    "dw_openpose_full": Files(("yolox_l.onnx", "dw-ll_ucoco_384.onnx"), ("openpose", "dwpose"), ("yzd-v/DWPose",),
                              "DWPose's"),
    "openpose": Files(("body_pose_model.pth",), ("openpose",), ("lllyasviel/Annotators",), "OpenPose's body model"),
    "lineart_realistic": Files(("sk_model.pth",), ("lineart",), ("lllyasviel/Annotators",), "the lineart model"),
    "lineart_coarse": Files(("sk_model2.pth",), ("lineart",), ("lllyasviel/Annotators",), "the coarse lineart model"),
    "lineart_anime": Files(("netG.pth",), ("lineart_anime",), ("lllyasviel/Annotators",), "the anime lineart model"),
    "lineart_anime_denoise": Files(("erika.pth",), ("manga_line",), ("lllyasviel/Annotators",),
                                   "the manga line model"),
    "instant_id_face_keypoints": Files(("scrfd_10g_bnkps.onnx",), ("insightface/models/antelopev2",),
                                       ("DIAMONIK7777/antelopev2",), "InsightFace antelopev2's detector"),
    "mlsd": Files(("mlsd_large_512_fp32.pth",), ("mlsd",), ("lllyasviel/Annotators",), "M-LSD's large model"),
    "depth_midas": Files(("dpt_hybrid-midas-501f0c75.pt",), ("midas",), ("lllyasviel/Annotators",),
                         "MiDaS's DPT-Hybrid"),
    "normal_midas": Files(("dpt_hybrid-midas-501f0c75.pt",), ("midas",), ("lllyasviel/Annotators",),
                          "MiDaS's DPT-Hybrid"),
    **{n: Files(("ControlNetHED.pth",), ("hed",), ("lllyasviel/Annotators",), "lllyasviel's HED")
       for n in ("softedge_hed", "softedge_hedsafe", "scribble_hed")},
    **{n: Files(("table5_pidinet.pth",), ("pidinet",), ("lllyasviel/Annotators",), "PiDiNet's")
       for n in ("softedge_pidinet", "softedge_pidisafe", "scribble_pidinet", "t2ia_sketch_pidi")},
    "softedge_teed": Files(("7_model.pth",), ("TEED",), ("bdsqlsz/qinglong_controlnet-lllite/Annotators",), "TEED's"),
    # the animal pose: DWPose's detector beside the AP10K model (the extension downloads both into openpose/;
    # ComfyUI keeps its own ONNX export of the same model, from hr16/UnJIT-DWPose, apart from yzd-v/DWPose's detector)
    "animal_openpose": Files(("yolox_l.onnx", "rtmpose-m_simcc-ap10k_pt-aic-coco_210e-256x256-7a041aa1_20230206.onnx"),
                             ("openpose",), ("yzd-v/DWPose", "bdsqlsz/qinglong_controlnet-lllite/Annotators",
                                             "hr16/UnJIT-DWPose"), "the animal pose's",
                             apart=((), ("rtmpose-m_ap10k_256.onnx",))),
    # MistoLine's Anyline: TEED's network with other weights; the extension keeps it beside 7_model.pth
    "softedge_anyline": Files(("MTEED.pth",), ("TEED",), ("TheMistoAI/MistoLine/Anyline",), "MistoLine's MTEED"),
    "normal_bae": Files(("scannet.pt",), ("normal_bae",), ("lllyasviel/Annotators",), "Bae et al.'s normal model"),
    # Depth Anything: the extension's download; ComfyUI keeps the Space's checkpoints/ folder
    "depth_anything": Files(("depth_anything_vitl14.pth",), ("depth_anything",), ("LiheYoung/Depth-Anything/checkpoints",),
                            "Depth Anything's", ("depth_anything_vitb14.pth", "depth_anything_vits14.pth")),
    # the extension and Forge download MackinationsAi's safetensors, ComfyUI the depth-anything repos' .pth
    "depth_anything_v2": Files(("depth_anything_v2_vitl.safetensors",), ("depth_anything_v2",),
                               ("depth-anything/Depth-Anything-V2-Large", "MackinationsAi/Depth-Anything-V2_Safetensors",
                                "depth-anything/Depth-Anything-V2-Base", "depth-anything/Depth-Anything-V2-Small"),
                               "Depth Anything V2's", ("depth_anything_v2_vitl.pth", "depth_anything_v2_vitb.safetensors",
                                                       "depth_anything_v2_vitb.pth", "depth_anything_v2_vits.safetensors",
                                                       "depth_anything_v2_vits.pth")),
    # the body model finds the people, the hand and face models their hands and faces
    "openpose_hand": Files(("body_pose_model.pth", "hand_pose_model.pth"), ("openpose",), ("lllyasviel/Annotators",),
                           "OpenPose's"),
    "openpose_face": Files(("body_pose_model.pth", "facenet.pth"), ("openpose",), ("lllyasviel/Annotators",),
                           "OpenPose's"),
    "openpose_faceonly": Files(("body_pose_model.pth", "facenet.pth"), ("openpose",), ("lllyasviel/Annotators",),
                               "OpenPose's"),
    "openpose_full": Files(("body_pose_model.pth", "hand_pose_model.pth", "facenet.pth"), ("openpose",),
                           ("lllyasviel/Annotators",), "OpenPose's"),
    "depth_leres": Files(("res101.pth",), ("leres",), ("lllyasviel/Annotators",), "LeReS's depth model"),
    # ZoeDepth N: the extension's downloads/zoedepth (Forge's ControlNetPreprocessor/zoedepth), ComfyUI's
    # ckpts/lllyasviel/Annotators (controlnet_aux before its switch to transformers' ZoeDepth)
    "depth_zoe": Files(("ZoeD_M12_N.pt",), ("zoedepth",), ("lllyasviel/Annotators",), "ZoeDepth's"),
    # the boost: LeReS and the merge network (pix2pix), each where the extension reads it: res101.pth from
    # annotator/leres first (as depth_leres), latest_net_G.pth from downloads/leres: so each file on its own
    "depth_leres++": Files(("res101.pth", "latest_net_G.pth"), ("leres",), ("lllyasviel/Annotators",), "LeReS's",
                           apart=((), ())),
    # LaMa (big-lama) for inpaint_only+lama: the extension's annotator/downloads/lama (Forge: ControlNetPreprocessor)
    "inpaint_only+lama": Files(("ControlNetLama.pth",), ("lama",), ("lllyasviel/Annotators",), "LaMa's"),
    # Revision's image encoder (sdrt.pipelines.revision): OpenCLIP ViT-bigG/14 as transformers'
    # CLIPVisionModelWithProjection; the extension's clip_g.pth, ComfyUI's clip_vision/ file (stabilityai's
    # control-lora revision/clip_vision_g.safetensors, or laion's CLIP-ViT-bigG-14 one)
    **{n: Files(("clip_g.pth",), ("clip_vision",), ("lllyasviel/Annotators",), "OpenCLIP ViT-bigG/14",
                ("clip_vision_g.safetensors", "CLIP-ViT-bigG-14-laion2B-39B-b160k.safetensors"))
       for n in ("revision_clipvision", "revision_ignore_prompt")},
    # the T2I-Adapter style adapter's image encoder (sdrt.pipelines.styleadapter): CLIP ViT-L/14, the extension's
    # clip_vitl.pth (openai/clip-vit-large-patch14's pytorch_model.bin, saved under that name)
    "t2ia_style_clipvision": Files(("clip_vitl.pth",), ("clip_vision",), ("openai/clip-vit-large-patch14",),
                                   "CLIP ViT-L/14", ("clip_vision_l.safetensors", "clip-vit-large-patch14.safetensors")),
    # UniFormer's ADE20K segmentor: the extension reads it from annotator/uniformer first (its old place), then
    # downloads/uniformer (from lllyasviel/ControlNet's annotator/ckpts; ComfyUI: ckpts/lllyasviel/Annotators)
    "seg_ufade20k": Files(("upernet_global_small.pth",), ("uniformer",), ("lllyasviel/Annotators",),
                          "UniFormer's ADE20K segmentor"),
    "seg_anime_face": Files(("UNet.pth",), ("anime_face_segment",), ("bdsqlsz/qinglong_controlnet-lllite/Annotators",),
                            "the anime face segmentation UNet"),
}


#: the extension's folders whose files it still reads first from its older place, the annotator's own code folder
#: (``old_modeldir``, ``annotator/mlsd`` / ``annotator/midas`` / ``annotator/leres`` / ``annotator/uniformer``), before
#: ``annotator/downloads/<folder>``
OLD_FOLDERS = ("mlsd", "midas", "leres", "uniformer")


def layouts(files: Files) -> list[str]:
    """The sub-folders (of the folder given) looked in, most specific first."""
    old = [f for f in files.folders if f in OLD_FOLDERS]
    out = [f"extensions/sd-webui-controlnet/annotator/{f}" for f in old]
    out += [f"extensions/sd-webui-controlnet/annotator/downloads/{f}" for f in files.folders]
    out += [f"annotator/{f}" for f in old] + [f"annotator/downloads/{f}" for f in files.folders]
    out += [f"ControlNetPreprocessor/{f}" for f in files.folders]  # Forge's models/ControlNetPreprocessor
    out += [f"custom_nodes/comfyui_controlnet_aux/ckpts/{r}" for r in files.repos]
    out += [f"ckpts/{r}" for r in files.repos] + list(files.repos) + list(files.folders)
    out += [r.rsplit("/", 1)[-1] for r in files.repos]
    if "lllyasviel/Annotators" in files.repos:  # lllyasviel/ControlNet's annotator/ckpts, where the extension
        # downloads mlsd and midas from (controlnet_aux keeps that repository's files under ckpts/<repo>/too)
        out += ["custom_nodes/comfyui_controlnet_aux/ckpts/lllyasviel/ControlNet/annotator/ckpts",
                "ckpts/lllyasviel/ControlNet/annotator/ckpts", "annotator/ckpts"]
    return list(dict.fromkeys(out))


def need(name: str) -> str:
    """What ``name`` reads, in words: "body_pose_model.pth", "DWPose's yolox_l.onnx and dw-ll_ucoco_384.onnx"."""
    files = ANNOTATORS[name]
    names = " and ".join(files.names)
    return f"{files.what} {names}" if len(files.names) > 1 and files.what else names


def find(name: str, models: Any, where: str) -> tuple[Path, ...]:
    """The files preprocessor ``name`` reads, from ``models`` (a file, the files, or a folder as the module says);
    an ``InputError`` naming ``where`` and every place looked in otherwise."""
    files = ANNOTATORS[name]
    source = " or ".join(files.repos)
    if models is None:
        raise InputError(f"{where}: the {name} preprocessor needs {need(name)}", where=where,
                         fix="pass the folder that holds " + ("them (or the files)" if len(files.names) > 1 else
                                                               "it (or the file)"))
    if isinstance(models, (str, os.PathLike)) and not os.fspath(models):
        raise InputError(f"{where} is an empty path", where=where, fix=f"pass the folder that holds {need(name)}")
    if not isinstance(models, (str, os.PathLike)):
        # a number, bytes or a mapping would be read item by item (or fail in Path() with a traceback)
        ok = isinstance(models, Iterable) and not isinstance(models, (bytes, bytearray, Mapping))
        items = list(models) if ok else []
        if not ok or not all(isinstance(p, (str, os.PathLike)) and os.fspath(p) for p in items):
            bad = models if not ok else next(p for p in items if not isinstance(p, (str, os.PathLike))
                                             or not os.fspath(p))
            raise InputError(f"{where} must be a folder, a file or a list of files (str or Path), got "
                             f"{type(bad).__name__} {bad!r:.40}", where=where,
                             fix=f"pass the folder that holds {need(name)}")
        given = [Path(p) for p in items]
        for f in given:
            if not f.is_file():
                raise InputError(f"{where}: {f} is not a file", where=where, fix=f"pass {need(name)}")
        if len(files.names) == 1:
            hits = ([f for f in given if f.name == files.names[0]] or [f for f in given if f.name in files.alternatives]
                    or (given if len(given) == 1 else []))
            if len(hits) != 1:
                raise InputError(f"{where}: {name} needs one {files.names[0]}; given "
                                 f"{', '.join(map(str, given)) or 'none'}", where=where,
                                 fix=f"pass {files.names[0]} or the folder holding it")
            return (hits[0],)
        if len(given) != len(files.names):
            raise InputError(f"{where}: {len(given)} files given; {name} needs {len(files.names)}, {need(name)}",
                             where=where, fix="pass them in that order, or the folder holding them")
        by_name = {f.name: f for f in given}
        # each file by its name, or by another name it is published under (ComfyUI's, ``apart``)
        named = [next((by_name[m] for m in (n, *(files.apart[i] if i < len(files.apart) else ())) if m in by_name),
                      None) for i, n in enumerate(files.names)]
        return tuple(named) if None not in named and len(set(named)) == len(named) else tuple(given)
    base = Path(models)
    if base.is_file():
        if len(files.names) == 1:
            return (base,)
        raise InputError(f"{where}: {base} is one file; {name} needs {need(name)}", where=where,
                         fix="pass the folder that holds them, or the files")
    looked = [base] + [base / sub for sub in layouts(files)]
    if files.apart:
        hits = [next((folder / n for folder in looked for n in (first, *other) if (folder / n).is_file()), None)
                for first, other in zip(files.names, files.apart)]
        if all(h is not None for h in hits):
            return tuple(hits)
        gone = [n + (f" (or {', '.join(o)})" if o else "") for n, o, h in zip(files.names, files.apart, hits) if h is None]
        return _missing(name, base, looked, where, source, gone if len(gone) < len(files.names) else None)
    for folder in looked:
        if all((folder / n).is_file() for n in files.names):
            return tuple(folder / n for n in files.names)
        for n in files.alternatives:
            if (folder / n).is_file():
                return (folder / n,)
    return _missing(name, base, looked, where, source)


def _missing(name: str, base: Path, looked: Sequence[Path], where: str, source: str,
             gone: Sequence[str] | None = None) -> tuple[Path, ...]:
    """``gone``: the files not found where the others were (``Files.apart``); None: all of them."""
    files = ANNOTATORS[name]
    it = "them" if len(files.names) > 1 and gone is None else "it"
    raise InputError(f"{where}: no {' and '.join(gone or files.names)} in {base} (looked in "
                     f"{', '.join(str(p) for p in looked[:4])} and {len(looked) - 4} more)", where=where,
                     fix=f"download {it} ({source}) into one of those folders, or pass the file"
                         + ("s" if len(files.names) > 1 else ""))


def encoder_path(name: str, models: Any, where: str) -> Path:
    """The image encoder a revision or style adapter unit's ``preprocessor_models`` names: a transformers folder
    (``config.json`` beside its weights, h94's ``sdxl_models/image_encoder``), else the file found as the annotators'
    are (the file, or a folder in the extension's or ComfyUI's layout)."""
    if isinstance(models, (str, os.PathLike)) and os.fspath(models) and Path(models).is_dir() \
            and (Path(models) / "config.json").is_file():
        return Path(models)
    return find(name, models, where)[0]
