"""The memory budget (sdrt.pipelines.budget) and block-group streaming (sdrt.pipelines.streaming).

Streaming is checked against the unsplit graph on the reference backend, OpenVINO (float32) and ggml, on
the tiny Flux transformer and the tiny SD 1.5 UNet, and a pipeline under a tiny budget against the same
pipeline without one."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from pipeline_helpers import DATA, register

import sdrt
from sdrt.cli import main
from sdrt.errors import InputError
from sdrt.graph import Graph
from sdrt.pipelines import load
from sdrt.pipelines.budget import parse_memory, peak_rss, plan_memory
from sdrt.pipelines.streaming import StreamedSession, analyse, split

BACKENDS = ["reference", "openvino", "ggml"]
#: the parts under test and the static shapes they run at
GRAPHS = {
    "tiny-flux-dev": ("transformer", {"hidden_states": (1, 16, 64), "encoder_hidden_states": (1, 8, 64),
                                      "pooled_projections": (1, 32), "timestep": (1,), "img_ids": (16, 3),
                                      "txt_ids": (8, 3), "guidance": (1,)}),
    "tiny-sd15": ("unet", {"sample": (2, 4, 8, 8), "timestep": (2,), "encoder_hidden_states": (2, 77, 32)}),
}


def _options(backend: str) -> dict:
    return {"precision": "fp32"} if backend == "openvino" else {}  # OpenVINO's CPU default is bf16 on AMX


# ---------------------------------------------------------------------------- sizes
def test_sizes_read_in_si_and_binary_units():
    assert parse_memory("8GB") == 8 * 10**9 and parse_memory("8 GiB") == 8 * 2**30 == parse_memory("8g")
    assert parse_memory("512MB") == 512 * 10**6 and parse_memory("1.5MiB") == 3 * 2**19
    assert parse_memory(4096) == 4096


@pytest.mark.parametrize("bad", ["lots", "8XB", "-1GB", "8", "", True, None, "nanGB", "1e308", 1e308, "2000000TB"])
def test_a_bad_size_names_the_argument(bad):
    with pytest.raises(InputError) as e:
        parse_memory(bad, "memory")
    assert e.value.where == "memory" and "8GB" in str(e.value)


@pytest.mark.parametrize("bad", [10**400, "9" * 5000])
def test_a_size_past_floats_range_is_one_short_line(bad):
    """An int past float's range (the API's memory=10**400) was an OverflowError's traceback; a long value is cut
    in the message."""
    with pytest.raises(InputError) as e:
        parse_memory(bad, "memory")
    assert e.value.where == "memory" and len(str(e.value)) < 300


def test_a_bad_size_on_the_cli_is_one_line(capsys):
    assert main(["generate", str(DATA / "tiny-sd15"), "a fox", "--memory", "8XB", "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert "--memory" in err and "8XB" in err and "Traceback" not in err and err.count("\n") == 1


def test_pipeline_memory_is_checked_at_load():
    register("reference")
    with pytest.raises(InputError, match="memory"):
        load(DATA / "tiny-sd15", backend="reference", memory="eight gigs")


# ---------------------------------------------------------------------------- the decision
W = {"text_encoder": 250, "unet": 1700, "vae_decoder": 100}


def test_everything_resident_when_it_fits():
    plan = plan_memory(W, "unet", 5000, base=100)
    assert {p.placement for p in plan.parts} == {"resident"} and plan.fits
    assert plan.peak_bytes == 100 + 2 * 2050


def test_small_parts_stay_while_the_largest_runs():
    plan = plan_memory(W, "unet", 3900)  # all three need 2 x 2050 = 4100: they do not fit together
    where = {p.part: p.placement for p in plan.parts}
    assert where == {"vae_decoder": "resident", "text_encoder": "released", "unet": "released"}
    assert plan.fits and plan.peak_bytes == 2 * (100 + 1700)


def test_a_denoiser_over_the_budget_streams_and_the_rest_is_released():
    plan = plan_memory(W, "unet", 1000, base=100, split=lambda cap: [cap, cap, 1700 - 2 * cap])
    where = {p.part: p.placement for p in plan.parts}
    assert where == {"text_encoder": "released", "unet": "streamed", "vae_decoder": "released"}
    unet = plan.placement("unet")
    assert unet.cap_bytes == 450 and unet.groups == [450, 450, 800] and not unet.fits  # one group too heavy
    assert plan.placement("text_encoder").peak_bytes == 100 + 500 and not plan.fits


def test_low_memory_releases_everything_and_no_budget_keeps_everything():
    assert {p.placement for p in plan_memory(W, "unet", None, release_all=True).parts} == {"released"}
    assert {p.placement for p in plan_memory(W, "unet", None).parts} == {"resident"}
    below = plan_memory(W, "unet", 50, base=100)  # less than the process already holds: nothing can stream
    assert not below.fits and below.placement("unet").placement == "released"


# ---------------------------------------------------------------------------- splitting a graph
def _pinned(folder: str) -> tuple[Graph, dict[str, np.ndarray]]:
    part, shapes = GRAPHS[folder]
    g = Graph.load(DATA / folder / part / "model.onnx").with_shapes(shapes)
    rng = np.random.default_rng(0)
    feeds = {i.name: (rng.standard_normal(i.shape).astype(np.float32) if i.dtype == "float32"
                      else np.zeros(i.shape, i.dtype)) for i in g.inputs}
    return g, feeds


@pytest.mark.parametrize("folder", list(GRAPHS))
def test_cuts_are_where_few_activations_cross(folder):
    g, _ = _pinned(folder)
    a = analyse(g)
    groups = split(g, groups=4)
    assert len(groups) >= 3 and groups[0].start == 0 and groups[-1].end == len(a.nodes)
    assert all(x.end == y.start for x, y in zip(groups, groups[1:]))
    # every weight is in a group; one read by two groups (an aliased, shared tensor) is in both
    assert sum(x.weight_bytes for x in groups) >= sum(a.node_weight) == sum(a.inits.values())
    for x in groups[:-1]:  # each cut is the thinnest boundary of the second half of its window
        assert len(x.outputs) <= a.live_count[x.end] and a.live_count[x.end] <= np.median(a.live_count)
    cap = max(x.weight_bytes for x in split(g, max_weight_bytes=sum(a.node_weight) // 5))
    assert cap <= sum(a.node_weight) // 5 or cap == max(a.node_weight)


@pytest.mark.parametrize("share", [False, True], ids=["compiled-each", "shared"])
@pytest.mark.parametrize("folder", list(GRAPHS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_streamed_groups_equal_the_whole_graph(backend, folder, share):
    register(backend)
    g, feeds = _pinned(folder)
    whole = sdrt.load(g, backend=backend, **_options(backend)).run(feeds)
    sess = StreamedSession(g, None, groups=4, backend=backend, share=share, options=_options(backend))
    assert len(sess.groups) >= 3
    out = sess.run(feeds)
    again = sess.run(feeds)  # a second call (a second step) loads the groups again
    sess.close()
    for name, ref in whole.items():
        np.testing.assert_allclose(out[name], ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(again[name], out[name])


def test_a_streamed_session_returns_the_outputs_asked_for(monkeypatch):
    """``StreamedSession.run(feeds, outputs=)`` as ``Session.run``'s: a reference unit's read call on a streamed
    UNet asks for ``out_sample`` alone; its groups copy out only what a later group reads or the caller wants."""
    import onnx

    from sdrt.checkpoint.refattention import reference_graph

    register("reference")
    from sdrt_reference.backend import ReferenceSession

    asked: list[list[str]] = []
    some = ReferenceSession._run_outputs

    def run_outputs(self, feeds, names):
        asked.append(list(names))
        return some(self, feeds, names)

    monkeypatch.setattr(ReferenceSession, "_run_outputs", run_outputs)
    g, feeds = _pinned("tiny-sd15")
    model = onnx.ModelProto()
    model.CopyFrom(g.model)
    ref = g.derive(reference_graph(model, lambda w: 2, "unet"))
    rng = np.random.default_rng(1)
    for i in ref.inputs:
        if i.name not in feeds:
            feeds[i.name] = rng.standard_normal([d if isinstance(d, int) else 4 for d in i.shape]).astype(np.float32)
    ref = ref.with_shapes({k: v.shape for k, v in feeds.items()})
    whole = sdrt.load(ref, backend="reference").run(feeds)
    banks = [n for n in whole if n.startswith("ref_bank_")]
    assert banks
    sess = StreamedSession(ref, None, groups=3, backend="reference")
    assert len(sess.groups) >= 2
    asked.clear()
    got = sess.run(feeds, outputs=["out_sample"])
    assert list(got) == ["out_sample"]
    # each group named what it hands on; no group copied out a bank, which nothing reads
    assert len(asked) == len(sess.groups) and not any(n.startswith("ref_bank_") for a in asked for n in a), asked
    np.testing.assert_allclose(got["out_sample"], whole["out_sample"], rtol=1e-5, atol=1e-5)
    got = sess.run(feeds, outputs=banks[:1])
    np.testing.assert_allclose(got[banks[0]], whole[banks[0]], rtol=1e-5, atol=1e-5)
    sess.close()


# ---------------------------------------------------------------------------- the pipeline under a budget
def _tiny_budget(pipe) -> int:
    """A budget (the process's own memory not counted) that streams the denoiser in at least three groups."""
    den = pipe.family.denoiser_part
    return int(2 * pipe.memory_plan(base=0).placement(den).weight_bytes / 3.5)


@pytest.mark.parametrize(("backend", "folder"), [("reference", "tiny-flux-dev"), ("reference", "tiny-sd15"),
                                                 ("openvino", "tiny-flux-dev"), ("ggml", "tiny-sd15")])
def test_an_image_under_a_tiny_budget_equals_the_image_without(backend, folder, caplog):
    register(backend)
    caplog.set_level("INFO", logger="sdrt.pipelines.streaming")
    kw = dict(steps=2, seed=7, width=64, height=64)
    if "flux" in folder:
        kw["max_sequence_length"] = 16  # T5's 512 tokens on the reference backend take minutes
    free = load(DATA / folder, backend=backend, **_options(backend))
    expected = free.generate("a red fox", **kw)
    assert {p.placement for p in expected.memory.parts} == {"resident"}
    pipe = load(DATA / folder, backend=backend, memory=_tiny_budget(free), **_options(backend))
    plan = pipe.memory_plan(base=0)
    den = plan.placement(pipe.family.denoiser_part)
    assert den.placement == "streamed" and len(den.groups) >= 3
    assert "streamed" in pipe.plan("a red fox", **kw).format()  # the run plan shows it (--dry-run)
    got = pipe.generate("a red fox", **kw)
    streamed = [r.getMessage() for r in caplog.records if "streams in" in r.getMessage()]
    assert streamed and all(int(m.split("streams in ")[1].split()[0]) >= 3 for m in streamed)
    diff = np.abs(got.images[0].astype(int) - expected.images[0].astype(int)).max()
    # the reference backend is exact; OpenVINO fuses differently across a cut (float32 rounding, <= 1 level)
    assert diff == 0 if backend == "reference" else diff <= 1
    plan = got.memory  # made again for this job's shapes, with their activations counted
    assert plan is pipe.memory_plan() and plan.measured and plan.placement(den.part).placement == "streamed"
    if sys.platform.startswith("linux"):
        assert plan.measured_source.startswith("VmHWM") and all(v > 0 for v in plan.measured.values())
        assert peak_rss()[1] == "VmHWM"


def test_dry_run_prints_placements_and_the_prediction(capsys):
    register("reference")
    assert main(["generate", str(DATA / "tiny-flux-dev"), "a fox", "--dry-run", "--steps", "2",
                 "--backend", "reference", "--memory", "8GB"]) == 0
    out = capsys.readouterr().out
    assert "memory: budget 7.45 GiB (--memory), predicted peak" in out
    assert "transformer      resident" in out


@pytest.mark.parametrize("backend", BACKENDS)
def test_identical_blocks_share_one_compiled_session(backend):
    """A Flux-like chain (1 double + 4 single blocks, each block's weights its own): with a cap a little above one
    single block, the cuts fall between blocks, the single blocks compile once and swap their weights in."""
    from sdrt.testing.dit_blocks import flux_chain, flux_single_block

    register(backend)
    model, feeds = flux_chain(1, 4, "tiny")
    g = Graph.load(model.SerializeToString())
    block = sum(np.prod(t.dims) * 4 for t in flux_single_block("tiny")[0].graph.initializer)
    whole = sdrt.load(g, backend=backend, **_options(backend)).run(feeds)["out_hidden_states"]
    sess = StreamedSession(g, None, max_weight_bytes=int(1.2 * block), backend=backend, share=True,
                           options=_options(backend))
    out = sess.run(feeds)["out_hidden_states"]
    assert sess.swaps >= 2  # blocks 2..4 reuse block 1's compiled group
    np.testing.assert_allclose(out, whole, rtol=1e-5, atol=1e-5)
    sess.close()


def test_cli_reports_the_measured_peak_beside_the_prediction(capsys, tmp_path):
    register("reference")
    out = tmp_path / "fox.png"
    assert main(["generate", str(DATA / "tiny-sd15"), "a fox", "--steps", "1", "--backend", "reference",
                 "--memory", "16GiB", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert out.is_file() and "memory: budget 16.00 GiB (--memory)" in err
    assert "unet             resident" in err and ("measured peak RSS (VmHWM)" in err or sys.platform != "linux")


def test_streamed_groups_bind_the_parts_own_weights():
    """Weights bound by the caller (a checkpoint, a LoRA merge) reach each group by reference, under the
    group's names, shared blocks included."""
    register("reference")
    g, feeds = _pinned("tiny-flux-dev")
    own = sdrt.Weights.from_graph(g)
    changed = sdrt.Weights.from_arrays({n: own[n] * np.float32(1.5) if own[n].dtype == np.float32 else own[n]
                                        for n in own})
    whole = sdrt.load(g, weights=changed, backend="reference").run(feeds)
    plain = sdrt.load(g, backend="reference").run(feeds)
    for share in (False, True):
        sess = StreamedSession(g, changed, groups=4, backend="reference", share=share)
        out = sess.run(feeds)
        sess.close()
        for name, ref in whole.items():
            np.testing.assert_allclose(out[name], ref, rtol=1e-5, atol=1e-5)
            assert not np.allclose(out[name], plain[name])


def test_streamed_groups_read_the_next_groups_weights_ahead():
    """Each group's weight ranges in the mapped file are read ahead while the group before runs; the outputs do
    not change, and without ``prefetch`` nothing is read ahead."""
    register("reference")
    _, feeds = _pinned("tiny-sd15")
    part, shapes = GRAPHS["tiny-sd15"]
    g = Graph.load(DATA / "tiny-sd15" / part / "model.onnx", load_external=False).with_shapes(shapes)
    assert g.external_refs  # the tiny UNet's weights stay mapped from model.onnx_data
    outs = {}
    for prefetch in (False, True):
        sess = StreamedSession(g, None, groups=4, backend="reference", prefetch=prefetch)
        outs[prefetch] = sess.run(feeds)
        sess.close()
        if prefetch:  # every group once (the first again after the last, for the next call)
            per_group = [sum(n for _, n in r) for x in sess._ranges for r in x.values()]
            assert sum(per_group) > 0 and sess.prefetched_bytes >= sum(per_group) - 2**20
        else:
            assert sess.prefetched_bytes == 0
    for name, ref in outs[False].items():
        np.testing.assert_array_equal(outs[True][name], ref)


# ---------------------------------------------------------------------------- activations
def _attention_graph(tokens: int = 64, dim: int = 16) -> Graph:
    """x [1, tokens, dim] -> softmax(x x^T) x, then x + that: the score matrix is [1, tokens, tokens]."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, tokens, dim])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, tokens, dim])
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["x", "xt"], ["scores"]),
             helper.make_node("Softmax", ["scores"], ["probs"], axis=-1),
             helper.make_node("MatMul", ["probs", "x"], ["att"]),
             helper.make_node("Add", ["x", "att"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "att", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    return Graph.load(model.SerializeToString()).with_shapes()


def test_activations_count_what_is_alive_at_once_but_not_attention_scores():
    from sdrt.pipelines.streaming import activation_peaks

    g = _attention_graph(tokens=64, dim=16)
    act = 64 * 16 * 4  # one [1, 64, 16] float32 tensor
    # between two nodes at most two [1, 64, 16] tensors are alive (x, read by the last Add, and xt or the attention
    # output); the 64 x 64 scores and probabilities (x + scores would be 5 x act) are not counted: the backends
    # run attention fused
    assert activation_peaks(g) == [2 * act]
    groups = split(g, groups=5)
    per_group = activation_peaks(g, groups)
    assert len(per_group) == len(groups) and max(per_group) == 2 * act and min(per_group) >= act


def test_activations_join_each_parts_need():
    plan = plan_memory(W, "unet", 6000, base=100, activations={"vae_decoder": 900})
    assert plan.placement("vae_decoder").activation_bytes == 900
    assert plan.peak_bytes == 100 + 2 * 2050 + 900 and plan.fits
    tight = plan_memory(W, "unet", 1400, base=100, activations={"unet": 300},
                        split=lambda cap: [(cap, 300), (cap, 100), (1700 - 2 * cap, 50)])
    unet = tight.placement("unet")
    assert unet.placement == "streamed" and unet.cap_bytes == (1300 - 300) // 2  # the activations leave less
    assert unet.peak_bytes == 100 + max(2 * 500 + 300, 2 * 500 + 100, 2 * 700 + 50)
