"""The upper bounds of a generation's settings, in one place for every caller (a module of constants only, so
that any module may import it)."""

#: the largest values any caller may ask for (the API, ``sdrt generate``/``plan``, and ``sdrt serve``, whose
#: per-request ``Limits`` sit below them): far above real use (A1111's UI stops at 150 steps, batch 8, 100
#: batches, 2048 px and CFG 30), low enough that a typo cannot allocate terabytes or run for years
MAX_STEPS = 10_000
MAX_BATCH = 256
MAX_BATCH_COUNT = 10_000
MAX_SIDE = 16_384
MAX_CFG = 100.0
#: T5's token count (SD3, Flux, Chroma): diffusers' pipelines refuse more than 512 (``check_inputs``)
MAX_SEQUENCE_LENGTH = 512

__all__ = ["MAX_BATCH", "MAX_BATCH_COUNT", "MAX_CFG", "MAX_SEQUENCE_LENGTH", "MAX_SIDE", "MAX_STEPS"]
