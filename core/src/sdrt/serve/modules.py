"""Separate VAE and text-encoder files, as A1111 (``sd_vae``) and Forge (``forge_additional_modules``) take them.

The files live in two folders: VAEs in the models folder's ``VAE/`` (A1111's ``models/VAE``) or ``--vae-dir``, text
encoders in its ``text_encoder/`` (Forge's ``models/text_encoder``) or ``--text-encoder-dir``. Each ``.safetensors``
(or PyTorch ``.ckpt``/``.pt``/``.pth``/``.bin``) file there is listed under its file name (subfolders included, as A1111 and Forge scan them; the first of a name
wins). A request names a file; it never gives a path: a name is matched against the listing (exact, in any case,
without ``.safetensors``), and a path (Easy Diffusion sends its own absolute paths) by its last part, so a path
to a file this server does not list, or one with ``..``, is a 400 naming the field.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ApiError, in_request_words

if TYPE_CHECKING:  # pragma: no cover
    from .registry import ModelEntry, Registry

#: A1111's sd_vae choices besides a file: the model's own VAE
VAE_AUTO = ("Automatic", "None")
#: files a forge_additional_modules list may hold (Forge's UI takes a VAE and up to three text encoders)
MAX_MODULES = 8


@dataclass(frozen=True)
class ModuleEntry:
    """A VAE or text-encoder file a request can name: ``name`` (the file name, as A1111's ``/sd-vae`` and Forge's
    ``/sd-modules`` list it), ``path`` and ``folder`` (``"vae"`` or ``"text_encoder"``, where it was found)."""

    name: str
    path: Path
    folder: str


# ---------------------------------------------------------------- folder listings, cached on the folders' mtimes
#: a folder changed less than this long before it was read may change again within its mtime's granularity
#: (2 s on FAT, 1 s on ext3 and some network file systems): read it again next time (git's "racy" rule)
_RACY_NS = 2_000_000_000


@dataclass
class _Scan:
    dirs: dict[str, int]     # every folder read -> its mtime (ns) when read
    value: Any
    racy: bool


_SCANS: dict[tuple[str, str], _Scan] = {}
_SCANS_LOCK = threading.Lock()


def _cached(kind: str, folder: Path, read: Any) -> Any:
    """``read(folder)`` -> ``(value, dirs)``, kept until one of ``dirs`` (the folders it read) has another mtime: a
    file added, removed or renamed in any of them shows at the next request, with no refresh; otherwise no folder of
    thousands of files is walked per request."""
    key = (kind, str(folder))
    with _SCANS_LOCK:
        scan = _SCANS.get(key)
    if scan is not None and not scan.racy:
        try:
            if all(os.stat(d).st_mtime_ns == m for d, m in scan.dirs.items()):
                return scan.value
        except OSError:
            pass
    started = time.time_ns()
    value, dirs = read(folder)
    racy = any(started - m < _RACY_NS for m in dirs.values())
    with _SCANS_LOCK:
        _SCANS[key] = _Scan(dirs, value, racy)
    return value


def forget() -> None:
    """Drop the cached listings (``/refresh-vae``: the folders are read again, whatever their mtimes say)."""
    with _SCANS_LOCK:
        _SCANS.clear()


def _read_subfolder(models: Path, name: str) -> tuple[Path | None, dict[str, int]]:
    dirs = {str(models): os.stat(models).st_mtime_ns}
    found = next((p for p in sorted(models.iterdir()) if p.is_dir() and p.name.casefold() == name.casefold()
                  and not (p / "model_index.json").is_file()), None)
    return found, dirs


def _subfolder(models: Path | None, name: str) -> Path | None:
    """The models folder's ``name`` folder (any case), if there is one and it is no model folder."""
    if models is None or not models.is_dir():
        return None
    return _cached(f"sub:{name}", models, lambda m: _read_subfolder(m, name))


def vae_folder(reg: Registry) -> Path | None:
    return reg.vae_dir or _subfolder(reg.models_dir, "VAE")


def text_encoder_folder(reg: Registry) -> Path | None:
    return reg.text_encoder_dir or _subfolder(reg.models_dir, "text_encoder")


#: the files listed: safetensors, and PyTorch files (A1111's models/VAE holds many ``.vae.pt`` and ``.ckpt``)
_SUFFIXES = (".safetensors", ".ckpt", ".pt", ".pth", ".bin")


def _read_files(folder: Path) -> tuple[list[Path], dict[str, int]]:
    """The folder's VAE / text-encoder files, subfolders included (not followed through links, as ``rglob``),
    sorted by path; and every folder read, with its mtime (taken before it is listed)."""
    files: list[Path] = []
    dirs: dict[str, int] = {}
    todo = [str(folder)]
    while todo:
        d = todo.pop()
        try:
            dirs[d] = os.stat(d).st_mtime_ns
            with os.scandir(d) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        todo.append(e.path)
                    elif os.path.splitext(e.name)[1].lower() in _SUFFIXES and not e.name.startswith(".") and e.is_file():
                        files.append(Path(e.path))
        except OSError:  # a folder removed or unreadable while read: as rglob, what is there
            continue
    return sorted(files), dirs


@dataclass
class _Listing:
    sources: tuple[Any, ...]                   # the cached file lists it was built from (compared by identity)
    found: dict[str, ModuleEntry]
    #: (vae_only) -> {name: entry}, {name or stem in any case: first entry}, for resolve
    index: dict[bool, tuple[dict[str, ModuleEntry], dict[str, ModuleEntry]]]


_LAST: list[_Listing] = []


def _listing(reg: Registry) -> _Listing:
    sources: list[Any] = []
    for kind, folder in (("vae", vae_folder(reg)), ("text_encoder", text_encoder_folder(reg))):
        if folder is not None and folder.is_dir():
            sources.append((kind, _cached("files", folder, _read_files)))
    last = _LAST[0] if _LAST else None
    if last is not None and len(last.sources) == len(sources) and all(
            a[0] == b[0] and a[1] is b[1] for a, b in zip(last.sources, sources)):
        return last
    found: dict[str, ModuleEntry] = {}
    for kind, files in sources:
        for p in files:
            found.setdefault(p.name, ModuleEntry(p.name, p, kind))
    index = {}
    for vae_only in (False, True):
        have = {k: e for k, e in found.items() if e.folder == "vae" or not vae_only}
        folded: dict[str, ModuleEntry] = {}
        for e in have.values():
            for key in (e.name.casefold(), e.path.stem.casefold()):
                folded.setdefault(key, e)
        index[vae_only] = (have, folded)
    out = _Listing(tuple(sources), found, index)
    with _SCANS_LOCK:
        _LAST[:] = [out]
    return out


def listing(reg: Registry) -> dict[str, ModuleEntry]:
    """Every VAE, then every text encoder, by file name. The folders are read again when one of them changed
    (its mtime: a file added, removed or renamed), so a new file shows without a refresh."""
    return dict(_listing(reg).found)


def vaes(reg: Registry) -> list[ModuleEntry]:
    return [e for e in listing(reg).values() if e.folder == "vae"]


def _where(reg: Registry, vae_only: bool) -> str:
    if vae_only:
        return "" if vae_folder(reg) is not None else \
            "; put VAE .safetensors files in a VAE folder inside the models folder (or pass --vae-dir)"
    if vae_folder(reg) is None and text_encoder_folder(reg) is None:
        return ("; put VAE files in a VAE folder and text encoders in a text_encoder folder inside the models folder "
                "(or pass --vae-dir / --text-encoder-dir)")
    return ""


def resolve(reg: Registry, name: Any, field: str, vae_only: bool = False) -> ModuleEntry:
    """The listed file ``name`` means: its file name, in any case, with or without ``.safetensors``; a path by its
    last part (never a path with ``..``). A 400 naming ``field`` and the choices otherwise."""
    if not isinstance(name, str):
        raise ApiError(422, f"{field} must be a string (a file name from /sdapi/v1/{'sd-vae' if vae_only else 'sd-modules'}"
                            f"), got {type(name).__name__}", field=field)
    have, folded = _listing(reg).index[vae_only]
    text = name.strip()
    parts = text.replace("\\", "/").split("/")
    if ".." in parts:
        raise ApiError(400, f"{field}: {name[:200]!r} is a path; name a file of this server's "
                            f"{'VAE' if vae_only else 'VAE or text-encoder'} folder", field=field)
    last = parts[-1].casefold()
    if text in have:  # the exact name first, then the first file whose name or stem it is in any case
        return have[text]
    if last in folded:
        return folded[last]
    what = "VAE files" if vae_only else "VAE and text-encoder files"
    choices = ", ".join(have) or "none"
    raise ApiError(400, f"{field}: no {'VAE' if vae_only else 'VAE or text-encoder'} file named {name[:200]!r}; "
                        f"this server's {what}: {choices}{_where(reg, vae_only)}", field=field)


# ---------------------------------------------------------------- what a file is
_KINDS: dict[tuple[Path, float], tuple[str, str | None]] = {}
_KINDS_LOCK = threading.Lock()


def _identify(entry: ModuleEntry) -> tuple[str, str | None]:
    """``(kind, why)``: the file's part kind from its tensors (headers only, cached by path and mtime; ``unknown``
    when they say no part; ``foreign`` with what it is for a file of a family sdrt does not run), or why it cannot
    be read."""
    from ..checkpoint.families import identify
    from ..errors import SdrtError
    from ..weights import Weights

    try:
        key = (entry.path, entry.path.stat().st_mtime)
    except OSError as exc:
        return "unknown", f"it cannot be read ({exc.strerror})"
    with _KINDS_LOCK:
        if key in _KINDS:
            return _KINDS[key]
    try:
        ident = identify(Weights.open(entry.path).shapes())
        # a file of a family sdrt does not run (a Wan VAE, a UMT5 encoder): "foreign", and what it is
        out: tuple[str, str | None] = (("foreign", in_request_words(ident.label)) if ident.foreign
                                       else (ident.kind, None))
    except SdrtError as exc:
        out = ("unknown", exc.what.replace(str(entry.path), entry.name))
    except OSError as exc:
        out = ("unknown", f"it cannot be read ({exc.strerror})")
    with _KINDS_LOCK:
        _KINDS[key] = out
    return out


def _kind(entry: ModuleEntry) -> str:
    """``vae`` or ``text_encoder`` from the file's tensors; the folder's when the tensors say neither (the pipeline
    then names what the file is)."""
    from ..checkpoint.families import PART_KINDS

    kind = _identify(entry)[0]
    return ("vae" if kind.startswith("vae") else "text_encoder") if kind in PART_KINDS else entry.folder


def check_vae_file(entry: ModuleEntry, field: str) -> ModuleEntry:
    """A VAE file ``sd_vae`` names, checked from its header before it is stored or queued: one that cannot be read,
    or holds another part, is a 400 naming ``field`` (the VAE in use is unchanged). Whether it fits the model is
    the pipeline's check, when a job runs."""
    from ..checkpoint.families import PART_KINDS

    kind, why = _identify(entry)
    if kind == "foreign":
        raise ApiError(400, f"{field}: {entry.name} is {why}, which sdrt does not run; the VAE in use is unchanged "
                            "(choose a file of /sdapi/v1/sd-vae that holds an SD or Flux VAE)", field=field)
    if why is not None:
        raise ApiError(400, f"{field}: the VAE file {entry.name} cannot be read: {why}; the VAE in use is unchanged "
                            "(replace the file, or choose another of /sdapi/v1/sd-vae)", field=field)
    if not kind.startswith("vae") and (kind in PART_KINDS or kind == "checkpoint"):
        what = PART_KINDS.get(kind) or "a whole model"
        raise ApiError(400, f"{field}: {entry.name} is {what}, not a VAE; the VAE in use is unchanged (choose a file "
                            "of /sdapi/v1/sd-vae that holds a VAE)", field=field)
    return entry


def part_only(path: Path) -> bool:
    """Whether a ``.safetensors`` file is a denoiser of a family sdrt runs that lacks its text encoders or VAE (a
    transformer-only Flux file): listed as a model that runs once those files are chosen."""
    from ..checkpoint.families import identify
    from ..errors import SdrtError
    from ..weights import Weights

    try:
        return identify(Weights.open(path).shapes()).family is not None
    except (SdrtError, OSError):
        return False


def choose(reg: Registry, model: ModelEntry, overrides: dict[str, Any], options: dict[str, Any],
           notes: list[str]) -> ModelEntry:
    """``model`` with the VAE and text encoders the request chose: ``override_settings.sd_vae`` or the ``sd_vae``
    option, and ``forge_additional_modules`` (the request's ``override_settings`` first, then the option)."""
    if "forge_additional_modules" in overrides:
        mods, mod_field = overrides["forge_additional_modules"], "override_settings.forge_additional_modules"
    else:
        mods, mod_field = options.get("forge_additional_modules"), "forge_additional_modules"
    mods = check_modules(reg, mods, mod_field)
    if overrides.get("sd_vae") not in (None, ""):
        vae_name, vae_field = overrides["sd_vae"], "override_settings.sd_vae"
    else:
        vae_name, vae_field = options.get("sd_vae"), "sd_vae"
    vae = check_vae(reg, vae_name, vae_field)
    chosen_vaes = [e for e in mods if _kind(e) == "vae"]
    if len(chosen_vaes) > 1:
        raise ApiError(400, f"{mod_field} holds {len(chosen_vaes)} VAEs ({', '.join(e.name for e in chosen_vaes)}); "
                            "a model takes one", field=mod_field)
    if vae is not None and chosen_vaes and chosen_vaes[0] != vae:
        notes.append(f"{mod_field}: the VAE {chosen_vaes[0].name} was not used; {vae_field} {vae.name} was")
    field = vae_field if vae is not None and len(mods) == len(chosen_vaes) else mod_field  # what a refusal names
    vae = vae or (chosen_vaes[0] if chosen_vaes else None)
    encoders = tuple(e.path for e in mods if _kind(e) == "text_encoder")
    if model.needs and vae is None and not encoders:
        raise ApiError(400, f"{model.name} cannot run on its own: {model.needs}; choose its files with "
                            "forge_additional_modules (options or override_settings: file names from "
                            "GET /sdapi/v1/sd-modules, the models folder's text_encoder and VAE folders), the VAE "
                            f"also with sd_vae{_where(reg, False)}", field=mod_field)
    if vae is None and not encoders:
        return model
    return dataclasses.replace(model, vae=vae.path if vae else None, text_encoders=encoders, module_field=field)


def check_vae(reg: Registry, value: Any, field: str) -> ModuleEntry | None:
    """A1111's ``sd_vae``: ``Automatic`` / ``None`` (the model's own VAE: None here) or a VAE file's name; an empty
    name is ``Automatic``, as A1111 falls back when its VAE list has no such entry."""
    if value is None:
        return None
    if isinstance(value, str):
        if not value.strip():
            return None
        for word in VAE_AUTO:
            if value.strip().casefold() == word.casefold():
                return None
    return check_vae_file(resolve(reg, value, field, vae_only=True), field)


def vae_option(reg: Registry, value: Any) -> str:
    """What the ``sd_vae`` option stores: ``Automatic``, ``None`` or the listed file's name."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return "Automatic"
    entry = check_vae(reg, value, "sd_vae")
    if entry is not None:
        return entry.name
    return next(w for w in VAE_AUTO if isinstance(value, str) and value.strip().casefold() == w.casefold())


def check_modules(reg: Registry, value: Any, field: str) -> list[ModuleEntry]:
    """Forge's ``forge_additional_modules``: a list of file names (or paths, by their file name)."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [value] if value.strip() else []
    if not isinstance(value, list):
        raise ApiError(422, f"{field} must be a list of file names from /sdapi/v1/sd-modules, got "
                            f"{type(value).__name__}", field=field)
    if len(value) > MAX_MODULES:
        raise ApiError(400, f"{field} holds {len(value)} files; at most {MAX_MODULES}", field=field)
    out: list[ModuleEntry] = []
    for i, name in enumerate(value):
        e = resolve(reg, name, f"{field}[{i}]")
        if e not in out:
            out.append(e)
    return out


__all__ = ["MAX_MODULES", "ModuleEntry", "VAE_AUTO", "check_modules", "check_vae", "check_vae_file", "choose", "forget",
           "listing",
           "part_only",
           "resolve", "text_encoder_folder", "vae_folder", "vae_option", "vaes"]
