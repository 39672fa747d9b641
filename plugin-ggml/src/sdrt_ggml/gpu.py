"""What a lowered graph needs before it runs on a GPU backend: float32 matmuls that stay float32,
and weights the device cannot hold kept in CPU memory.

ggml's Vulkan backend (ggml-vulkan.cpp, ``ggml_vk_mul_mat_q_f16``) copies a matmul operand whose
first two dims are not dense into a float16 buffer before multiplying, and on a device with
float16 support it accumulates such products in float16 unless the node asks for
``GGML_PREC_F32``. On Mesa's lavapipe that put the CLIP text encoder export 7e-4 of its output's
range away from onnxruntime (1e-4 is the limit). So on every non-CPU device each ``MUL_MAT`` node
asks for float32 precision, and an operand that is not dense in its first two dims is made
dense first (``ggml_cont``, a float32 copy on the device). The CPU backend needs neither: its
kernels read any strides in float32.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

from .devices import DeviceHandles
from .ops._common import ggml_lib

log = logging.getLogger("sdrt.ggml.gpu")


def _dim01_dense(t: Any) -> bool:
    """ggml-vulkan's ``ggml_vk_dim01_contiguous``: dense rows, dense row stride, dims 2/3 mergeable."""
    g = ggml_lib()
    c = t.contents
    size = g.ggml_type_size(c.type)
    blck = g.ggml_blck_size(c.type)
    return c.nb[0] == size and c.nb[1] == size * c.ne[0] // blck and (c.ne[3] == 1 or c.nb[3] == c.nb[2] * c.ne[2])


def keep_matmuls_f32(ctx: Any, reserve: int) -> int:
    """Ask every ``MUL_MAT`` of ``ctx`` for float32 precision and give it dense operands.

    Runs before the compute graph is built from the outputs, so the copies land in the graph.
    ``reserve`` bytes of the (no-alloc) context stay free for that graph; an operand is left as
    it is, with a warning, when no room is left for its copy (a ggml context that runs out of
    memory aborts the process). Returns the number of copies added.
    """
    g = ggml_lib()
    matmuls = []
    t = g.ggml_get_first_tensor(ctx)
    while t:
        if t.contents.op == g.GGML_OP_MUL_MAT:
            matmuls.append(t)
        t = g.ggml_get_next_tensor(ctx, t)
    copies, skipped = 0, 0
    for mm in matmuls:
        g.ggml_mul_mat_set_prec(mm, g.GGML_PREC_F32)
        for i in (0, 1):
            src = mm.contents.src[i]
            if not src or _dim01_dense(src):
                continue
            if g.ggml_get_mem_size(ctx) - g.ggml_used_mem(ctx) < g.ggml_tensor_overhead() + reserve:
                skipped += 1
                continue
            mm.contents.src[i] = g.ggml_cont(ctx, src)
            copies += 1
    if skipped:
        log.warning("%d strided matmul operands stay strided (the ggml context is full): a GPU backend may "
                    "multiply them in float16", skipped)
    return copies


def weights_on_host(pending: list[tuple[Any, Any]], device: DeviceHandles) -> Any:
    """Put the weight tensors that ``device`` cannot hold into one CPU buffer; return it (or None).

    A GPU backend refuses tensors above its storage-buffer range (Mesa's lavapipe: 128 MiB; vgg19's
    first fully connected weight is 392 MiB). ggml's scheduler aborts the process when a weight
    already placed in a device buffer feeds an op that device cannot run ("pre-allocated tensor
    ... cannot run the operation"), so such weights go to CPU memory, and the scheduler runs the
    ops that read them on the CPU. The rest are allocated on the device afterwards
    (``ggml_backend_alloc_ctx_tensors`` skips tensors that have memory).
    """
    g = ggml_lib()
    host = [t for t, _ in pending if not g.ggml_backend_supports_op(device.backend, t)]
    if not host:
        return None
    # the CPU backend's buffer type (ggml-python 0.0.45 truncates ggml_backend_cpu_buffer_type's pointer)
    buft = g.ggml_backend_get_default_buffer_type(device.cpu)
    align = int(g.ggml_backend_buft_get_alignment(buft))
    sizes = [-(-int(g.ggml_backend_buft_get_alloc_size(buft, t)) // align) * align for t in host]
    buf = g.ggml_backend_buft_alloc_buffer(buft, sum(sizes) + align)
    if not buf:
        from sdrt.errors import SdrtError

        raise SdrtError(f"could not allocate {sum(sizes)} bytes of CPU memory for {len(host)} weights that "
                        f"ggml device {device.name} cannot hold", where=f"ggml device {device.name}",
                        fix="free memory, or run on device='CPU'")
    g.ggml_backend_buffer_set_usage(buf, g.GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
    talloc = g.ggml_tallocr_new(buf)
    for t in host:
        g.ggml_tallocr_alloc(ctypes.byref(talloc), t)
    log.info("%d weights (%.1f MiB) stay in CPU memory: ggml device %s cannot hold them", len(host),
             sum(sizes) / 2**20, device.name)
    return buf
