"""Where the model-backed ControlNet preprocessors' files are: one table, one finder for the API, CLI and server.

sd-webui-controlnet downloads each annotator's files into ``extensions/sd-webui-controlnet/annotator/downloads/
<folder>``; ComfyUI's controlnet_aux into ``custom_nodes/comfyui_controlnet_aux/ckpts/<repo>`` (the Hugging Face
repository they come from). :func:`find` takes the file itself, the files, a folder holding them, or a folder with
either layout under it (an A1111 or ComfyUI root, its models folder, the extension's folder).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError

__all__ = ["ANNOTATORS", "Files", "find", "layouts", "need"]


@dataclass(frozen=True)
class Files:
    """The files one preprocessor reads (in the order its model takes them), the extension's download folders
    for them, and the Hugging Face repositories they come from (ComfyUI keeps them under ``ckpts/<repo>``)."""

    names: tuple[str, ...]
    folders: tuple[str, ...]
    repos: tuple[str, ...]
    #: how errors name the model ("DWPose's", "OpenPose's body model")
    what: str = ""


ANNOTATORS: dict[str, Files] = {
    "dw_openpose_full": Files(("yolox_l.onnx", "dw-ll_ucoco_384.onnx"), ("openpose", "dwpose"), ("yzd-v/DWPose",),
                              "DWPose's"),
    "openpose": Files(("body_pose_model.pth",), ("openpose",), ("lllyasviel/Annotators",), "OpenPose's body model"),
    # the body model finds the people, the hand and face models their hands and faces
    "openpose_hand": Files(("body_pose_model.pth", "hand_pose_model.pth"), ("openpose",), ("lllyasviel/Annotators",),
                           "OpenPose's"),
    "openpose_face": Files(("body_pose_model.pth", "facenet.pth"), ("openpose",), ("lllyasviel/Annotators",),
                           "OpenPose's"),
    "openpose_faceonly": Files(("body_pose_model.pth", "facenet.pth"), ("openpose",), ("lllyasviel/Annotators",),
                               "OpenPose's"),
    "openpose_full": Files(("body_pose_model.pth", "hand_pose_model.pth", "facenet.pth"), ("openpose",),
                           ("lllyasviel/Annotators",), "OpenPose's"),
}


def layouts(files: Files) -> list[str]:
    """The sub-folders (of the folder given) looked in, most specific first."""
    out = [f"extensions/sd-webui-controlnet/annotator/downloads/{f}" for f in files.folders]
    out += [f"annotator/downloads/{f}" for f in files.folders]
    out += [f"custom_nodes/comfyui_controlnet_aux/ckpts/{r}" for r in files.repos]
    out += [f"ckpts/{r}" for r in files.repos] + list(files.repos) + list(files.folders)
    out += [r.rsplit("/", 1)[-1] for r in files.repos]
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
    if not isinstance(models, (str, Path)):
        given = [Path(p) for p in models]
        for f in given:
            if not f.is_file():
                raise InputError(f"{where}: {f} is not a file", where=where, fix=f"pass {need(name)}")
        if len(files.names) == 1:
            hits = [f for f in given if f.name == files.names[0]] or (given if len(given) == 1 else [])
            if len(hits) != 1:
                raise InputError(f"{where}: {name} needs one {files.names[0]}; given "
                                 f"{', '.join(map(str, given)) or 'none'}", where=where,
                                 fix=f"pass {files.names[0]} or the folder holding it")
            return (hits[0],)
        if len(given) != len(files.names):
            raise InputError(f"{where}: {len(given)} files given; {name} needs {len(files.names)}, {need(name)}",
                             where=where, fix="pass them in that order, or the folder holding them")
        by_name = {f.name: f for f in given}
        return tuple(by_name[n] for n in files.names) if all(n in by_name for n in files.names) else tuple(given)
    base = Path(models)
    if base.is_file():
        if len(files.names) == 1:
            return (base,)
        raise InputError(f"{where}: {base} is one file; {name} needs {need(name)}", where=where,
                         fix="pass the folder that holds them, or the files")
    looked = [base] + [base / sub for sub in layouts(files)]
    for folder in looked:
        if all((folder / n).is_file() for n in files.names):
            return tuple(folder / n for n in files.names)
    return _missing(name, base, looked, where, source)


def _missing(name: str, base: Path, looked: Sequence[Path], where: str, source: str) -> tuple[Path, ...]:
    files = ANNOTATORS[name]
    it = "them" if len(files.names) > 1 else "it"
    raise InputError(f"{where}: no {' and '.join(files.names)} in {base} (looked in "
                     f"{', '.join(str(p) for p in looked[:4])} and {len(looked) - 4} more)", where=where,
                     fix=f"download {it} ({source}) into one of those folders, or pass the file"
                         + ("s" if len(files.names) > 1 else ""))
