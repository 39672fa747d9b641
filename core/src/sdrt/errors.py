"""The one error hierarchy of sdrt.

Every message says three things: what was wrong, where it was, and what to do
about it. Build errors with those three parts so that no message forgets one::

    raise ModelError("the file is not an ONNX model", where=path, fix="export it with torch.onnx.export")

An exception from inside a vendor library is wrapped in one of these (keep the
original as ``__cause__`` with ``raise ... from exc``), never passed through.

A message that names an argument of the API writes it as ``{@name}`` (or ``{@name=}``), and a
``where`` that is an argument is its bare name::

    raise InputError("a mask needs an init image", where="mask", fix="pass {@init_image=} too")

``{@name=}`` followed by a value (``"pass {@steps=}1 or more"``) reads ``steps=1`` in the API and
``--steps 1`` on the command line; followed by ``True`` or ``False`` it is a switch, the flag alone on the command line
(``{@t5=}False``: ``t5=False``, ``--no-t5``).

``{@@name}`` says how a caller passes a file of the kind ``name`` takes, in whole (``{@@loras}``: the API's
``pipe.set_loras([(FILE, WEIGHT)])``, ``USAGE``; on the command line ``--lora FILE:WEIGHT``): for a hint that names
the way in, where the value's form differs per caller too. A tool maps ``"@name"`` to its own words.

``str(exc)`` speaks the API (``Where: mask. What to do: pass init_image= too.``); a tool that
takes the arguments under other names renders the same error in its own words with
``exc.render(names)`` (the ``sdrt`` command: ``Where: --mask. What to do: pass --init-image too.``).

A warning, which no ``render`` reaches, is logged with ``in_caller_words(text)``: the API's words, or the names of
the tool that runs it inside ``with caller_words(names):`` (the ``sdrt`` command around each command's run).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

_ARG = re.compile(r"\{@([A-Za-z_][A-Za-z0-9_]*)(=?)\}(?:(True|False)(?![A-Za-z0-9_]))?")


_USE = re.compile(r"\{@@([A-Za-z_][A-Za-z0-9_]*)\}")

#: ``{@@name}`` in the API's words: how a program passes a file of that kind (a tool maps ``"@name"`` to its own)
USAGE = {"loras": "pipe.set_loras([(FILE, WEIGHT)])", "controlnets": "generate(..., controlnets=[(FILE, image)])",
         "embeddings": "pipe.add_embedding(FILE)", "model": "sdrt.pipelines.load(FILE)",
         "weights": "pipe.load_weights(FILE)", "lora_dir": "pipe.weights.lora_dir",
         "hires_upscaler": "generate(..., hires_upscaler=FILE), or sdrt.pipelines.upscaler.ModelUpscaler(FILE)"}


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def counted(n: int, noun: str, nouns: str | None = None) -> str:
    """``"1 tensor"``, ``"3 tensors"``: a count with its noun in the number it takes (``nouns``: an irregular
    plural, such as ``"entries"``)."""
    return f"{n:,} {noun if n == 1 else nouns or noun + 's'}"


def printable(text: object) -> str:
    """``text`` (a path, a message) with its control characters escaped as ``repr`` writes them (``\\n``, ``\\t``,
    ``\\x1b``): a newline in a file name must not break a one-line message, nor an escape sequence reach the
    terminal."""
    return _CONTROL.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), str(text))


def _render(text: str, names: Mapping[str, str] | None) -> str:
    def use(m: re.Match[str]) -> str:
        key = "@" + m.group(1)
        return names[key] if names is not None and key in names else USAGE.get(m.group(1), m.group(1))

    text = _USE.sub(use, text)

    def one(m: re.Match[str]) -> str:
        name, eq, flag = m.group(1), m.group(2), m.group(3)
        if flag and eq:  # "{@t5=}False": a switch, "t5=False" in the API, its flag alone on the command line
            return names[name] if names is not None and name in names else f"{name}={flag}"
        if flag:  # "{@name}True": no value glued to it, the word kept
            return (names[name] if names is not None and name in names else name) + flag
        if names is not None and name in names:
            # "{@steps=}1" is "steps=1" in the API and "--steps 1" on the command line
            glued = eq and m.end() < len(text) and not text[m.end()].isspace() and text[m.end()] not in ",.;:)"
            return names[name] + (" " if glued else "")
        return name + eq

    return _ARG.sub(one, text)


_CALLER_WORDS: ContextVar[Mapping[str, str] | None] = ContextVar("sdrt_caller_words", default=None)


@contextmanager
def caller_words(names: Mapping[str, str] | None) -> Iterator[None]:
    """Inside it, ``in_caller_words`` names arguments as ``names`` maps them (``{"text_encoders": "--text-encoder"}``)."""
    token = _CALLER_WORDS.set(names)
    try:
        yield
    finally:
        _CALLER_WORDS.reset(token)


def in_caller_words(text: str) -> str:
    """``text`` with its ``{@name}`` arguments in the words of the caller running now (``caller_words``), else the
    API's: for a warning's text, which is logged, not raised."""
    names = _CALLER_WORDS.get()
    return _items(_render(text, names), names)


def in_caller_words_error(exc: SdrtError) -> str:
    """``exc``'s message in the words of the caller running now (``caller_words``): for a warning that logs an error
    it goes on past (a file skipped), which ``str(exc)`` gives in the API's words."""
    return exc.render(_CALLER_WORDS.get())


def _items(text: str, names: Mapping[str, str] | None) -> str:
    """``text`` with each item of a list argument that ``names`` maps (``controlnets[0]`` -> ``--controlnet``) in
    the caller's words: the pipeline names a unit ``controlnets[k]``, which no ``{@name}`` can say per item."""
    # the longest first: a unit's "controlnets[0] low" (a threshold of it) before the unit "controlnets[0]"
    for key, name in sorted((names or {}).items(), key=lambda kv: -len(kv[0])):
        if (key.endswith("]") or "] " in key) and key in text:
            text = text.replace(key, name)
    return text


def _sentence(text: str) -> str:
    """``text`` ending in one full stop: its own periods stripped, but an ellipsis (a list cut short, ``def f(): ...``)
    kept as it is, where stripping left a dangling ``, .``."""
    return text if text.endswith("...") else text.rstrip(".") + "."


class SdrtError(Exception):
    """Root of every error that sdrt raises on purpose."""

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None) -> None:
        self.what = what
        self.where = where
        self.fix = fix
        super().__init__(self._format())

    def _format(self, names: Mapping[str, str] | None = None) -> str:
        parts = [_sentence(_items(_render(self.what, names), names))]
        if self.where:
            where = names.get(self.where, self.where) if names is not None else self.where
            parts.append(f"Where: {_items(_render(where, names), names)}.")
        if self.fix:
            parts.append(f"What to do: {_sentence(_items(_render(self.fix, names), names))}")
        # one line in the API too (the command prints it through printable as well): a value's repr in the message
        # (a 2-D numpy array given as cfg=) broke it over several lines
        return printable(" ".join(parts))

    def render(self, names: Mapping[str, str] | None = None) -> str:
        """The message with each argument named as ``names`` maps it (``{"init_image": "--init-image"}``);
        arguments ``names`` does not hold keep their API names. ``str(exc)`` is ``exc.render()``."""
        return self._format(names)


class ModelError(SdrtError):
    """The model file (ONNX graph) is missing, malformed or not supported."""


class ModelNotFoundError(ModelError, FileNotFoundError):
    """The model path does not exist."""


class WeightsError(SdrtError):
    """Weights are missing, unsafe, malformed or do not fit the graph."""


class FileChanged(WeightsError):
    """A weights file changed on disk while its tensors were in use (replaced, or written again): none is read from
    the new version with the old one's header; open the file again."""


class UnusableEntry(SdrtError):
    """A compile cache entry that a backend cannot load (built by another driver, say): it is discarded and the
    graph compiled again. Backends raise it from ``Backend._load``."""


class UnsupportedGraph(SdrtError):
    """A backend cannot run this graph. ``unsupported`` maps op type -> node names."""

    def __init__(
        self,
        what: str,
        *,
        unsupported: dict[str, list[str]] | None = None,
        where: str | None = None,
        fix: str | None = None,
    ) -> None:
        self.unsupported = dict(unsupported or {})
        if self.unsupported:
            listing = "; ".join(
                f"{op} (nodes: {', '.join(nodes[:8])}{', ...' if len(nodes) > 8 else ''})"
                for op, nodes in sorted(self.unsupported.items())
            )
            what = f"{what}: {listing}"
        super().__init__(what, where=where, fix=fix)


class InputError(SdrtError):
    """A feed given to ``Session.run`` is missing, unexpected, or has the wrong shape or dtype."""


class OptionError(SdrtError):
    """A backend's option (``sdrt.load(..., **options)``) is unknown or has a bad value."""


class UnknownOptions(OptionError):
    """Options a backend does not take (``check_known_options``): ``unknown`` names them, ``known`` lists every option
    the backend takes (empty: none), so that a caller can say more than the backend's own message (``pipelines.load``
    lists its own keywords beside them)."""

    unknown: tuple[str, ...] = ()
    known: tuple[str, ...] = ()


def check_known_options(backend: str, options: Mapping[str, object] | object, known: tuple[str, ...] | list[str],
                        *, where: str | None = None) -> None:
    """Raise ``UnknownOptions`` when ``options`` (their names) holds any that ``backend`` does not take (``known``)."""
    unknown = tuple(sorted(set(options) - set(known)))  # type: ignore[arg-type]
    if not unknown:
        return
    exc = UnknownOptions(f"unknown options for the {backend} backend: {', '.join(unknown)}",
                         where=where or f"sdrt.load(..., backend={backend!r})",
                         fix=f"use only {', '.join(known)}" if known else
                         f"the {backend} backend takes no options; remove them")
    exc.unknown, exc.known = unknown, tuple(known)
    raise exc


class BackendUnavailable(SdrtError):
    """A backend cannot be used: unknown, broken, disabled, or with no device here."""


class UnknownBackendError(BackendUnavailable):
    """No installed plugin provides a backend with this name."""


class NoDeviceError(BackendUnavailable):
    """The backend exists but offers no usable device (or not the one asked for)."""


class PluginError(SdrtError):
    """A plugin failed to import or register."""


class PluginVersionError(PluginError):
    """A plugin was built for a plugin API that this core does not speak."""


class HardwareError(SdrtError):
    """Hardware detection failed in a way that leaves nothing to report."""


class InstallError(SdrtError):
    """Installing a plugin failed; the environment was left as it was."""


class SamplerError(SdrtError):
    """An unknown sampler or schedule name, or bad sampler arguments."""


__all__ = [
    "BackendUnavailable",
    "caller_words",
    "in_caller_words",
    "FileChanged",
    "HardwareError",
    "InputError",
    "InstallError",
    "Interrupted",
    "ModelError",
    "ModelNotFoundError",
    "printable",
    "NoDeviceError",
    "PluginError",
    "PluginVersionError",
    "SamplerError",
    "SdrtError",
    "UnknownBackendError",
    "UnsupportedGraph",
    "UnusableEntry",
    "WeightsError",
]


class Interrupted(SdrtError):
    """A generation stopped on request: ``Pipeline.interrupt()`` or a step callback that returned False.

    ``step`` is the last step that finished and ``total`` the steps the run had. ``partial()`` gives what the
    job had made, as A1111 answers an interrupt: the images of its finished runs, and the stopped run's batch
    decoded from its last step's denoised estimate (a ``Generation``; its decode runs only when asked, so an
    app that only wants to stop pays nothing); None when nothing can be given.
    """

    def __init__(self, what: str, *, step: int = 0, total: int = 0, where: str | None = None,
                 fix: str | None = None) -> None:
        self.step, self.total = step, total
        self._partial: Callable[[], Any] | None = None
        super().__init__(what, where=where, fix=fix)

    def partial(self) -> Any:
        """The ``Generation`` of what was made before the stop, or None (stopped before any step)."""
        return None if self._partial is None else self._partial()
