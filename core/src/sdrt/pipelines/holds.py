"""A loaded pipeline another job runs as its hires checkpoint or refiner, held for that job as a pipeline's own lock
holds it (:func:`hold`, :func:`release`), with the ring of jobs that would wait for each other refused."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ..errors import InputError

if TYPE_CHECKING:  # pragma: no cover
    from .pipeline import Pipeline


#: {thread id: the pipeline whose lock it waits for in ``hold``}: jobs that wait in a ring for each other's model
_WAITING: dict[int, Any] = {}
_WAITING_LOCK = threading.Lock()


def hold(pipe: Pipeline, other: Pipeline, role: str = "hires_checkpoint") -> None:
    """Lock ``other`` (a loaded Pipeline passed as the hires checkpoint, or as the ``refiner``: ``role``) for this job,
    as ``pipe``'s own lock holds ``pipe``: a job of another thread on it waits until this job ends (``release``), and
    this job waits for one running on it. Jobs that each run the next one's pipeline as their hires checkpoint (or
    refiner), in a ring (two that run each other's, or more), would wait for each other forever: the last to see it
    is refused in one line."""
    me = threading.get_ident()
    slot = f"_{role}_held"
    if other._owner == me or pipe.__dict__.get(slot) is other:
        return
    what = "hires checkpoint" if role == "hires_checkpoint" else role
    try:
        while not other._lock.acquire(timeout=0.05):
            with _WAITING_LOCK:
                if _waits_for(other, pipe):
                    _WAITING.pop(me, None)  # gone before the lock opens: no other job of the ring sees it and gives up
                    raise InputError(f"the {what} ({other.folder.name}) is running a job of another thread "
                                     f"that waits for this pipeline (its own {what}, or through the jobs it "
                                     "waits for): each job would wait for the other", where=role,
                                     fix="run the two jobs one after the other, or pass the model's path as "
                                         f"{{@{role}}} (a pipeline of its own is then loaded)")
                _WAITING[me] = other
    finally:
        with _WAITING_LOCK:
            _WAITING.pop(me, None)
    other._owner = me
    pipe.__dict__[slot] = other


def _waits_for(other: Pipeline, pipe: Pipeline) -> bool:
    """Whether the job holding ``other`` waits, itself or through the jobs it waits for, for ``pipe`` (a ring of any
    length: job 1 on A waits for B, job 2 on B for C, job 3 on C for A). Called under ``_WAITING_LOCK``."""
    seen: set[int] = set()
    node: Any = other
    while node is not None and id(node) not in seen:
        seen.add(id(node))
        owner = node._owner
        node = _WAITING.get(owner) if owner is not None else None
        if node is pipe:
            return True
    return False


def release(pipe: Pipeline) -> None:
    """The job is over: the hires checkpoint and the refiner ``hold`` locked are free for other threads again."""
    for slot in ("_hires_checkpoint_held", "_refiner_held"):
        other = pipe.__dict__.pop(slot, None)
        if other is not None:
            other._owner = None
            other._lock.release()
