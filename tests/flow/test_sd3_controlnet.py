"""SD3 ControlNets (diffusers' SD3ControlNetModel with a text stream) on tiny-sd3 against diffusers.

tests/data/pipelines/tiny-sd3-controlnet (scripts/gen_sd3_controlnet_refs.py) holds tiny random
``SD3ControlNetModel``s of tiny-sd3's widths (``canny``/``canny2``: 2 blocks; ``depth``: 1 block with
``force_zeros_for_pooled_projection: false``, so the prompt's pooled projections and the VAE shift), each as its
fp16 ``diffusion_pytorch_model.safetensors`` and ``config.json``, the tiny weight-free SD3 transformer graph sdrt
cuts their graphs from (what the shipped ``sd35_medium_transformer`` is at full size), and the images diffusers
0.42.1's ``StableDiffusion3ControlNetPipeline`` made with them on tiny-sd3's parts (the control samples drawn
from the run's seed before the noise, as the script explains). Tolerance: 1 of 255. Residuals on the wrong
blocks, a wrong control-latent order, shift, pooled input or window show as tens of levels.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from flow_helpers import register

from sdrt import pipelines
from sdrt.checkpoint.controlnet import identify, open_controlnet
from sdrt.errors import InputError, ModelError
from sdrt.pipelines.controlnet import ControlNet

DATA = Path(__file__).resolve().parents[1] / "data" / "pipelines"
NETS = DATA / "tiny-sd3-controlnet"
#: the tiny weight-free graphs the nets are cut from: SD3.5 Medium's design, and Large's for the image-only net
BASES = {"blur": NETS / "sd35_large_transformer.onnx"}
BASE = NETS / "sd35_medium_transformer.onnx"
CASES = json.loads((NETS / "refs.json").read_text())
REFS = np.load(NETS / "refs.npz")

_PIPES: dict = {}


def _pipe(backend: str):
    register(backend)
    if backend not in _PIPES:
        _PIPES[backend] = pipelines.load(DATA / "tiny-sd3", backend=backend)
    return _PIPES[backend]


def _net(name: str):
    return open_controlnet(NETS / name / "diffusion_pytorch_model.safetensors", graph=BASES.get(name, BASE))


def _kwargs(case: dict) -> dict:
    units = [ControlNet(_net(n), REFS[f"{case['name']}/control_image_{k}"], case["scale"][k], case["start"][k],
                        case["end"][k]) for k, n in enumerate(case["nets"])]
    kw = dict(steps=case["steps"], seed=case["seed"], width=case["width"], height=case["height"], batch=case["batch"],
              sampler="Euler", cfg=case["cfg"], max_sequence_length=case["max_sequence_length"], controlnets=units)
    if case["negative_prompt"]:
        kw["negative_prompt"] = case["negative_prompt"]
    return kw


PARAMS = [(c["name"], b) for c in CASES for b in ("reference", "openvino", "ggml")]


@pytest.mark.parametrize(("name", "backend"), PARAMS, ids=[f"{n}-{b}" for n, b in PARAMS])
def test_image_matches_diffusers(name: str, backend: str) -> None:
    case = next(c for c in CASES if c["name"] == name)
    gen = _pipe(backend).generate(case["prompt"], **_kwargs(case))
    got = np.stack(gen.images).astype(int)
    assert "ControlNet 0" in gen.settings[0]
    want = REFS[f"{name}/image"].astype(int)
    assert got.shape == want.shape
    diff = int(np.abs(got - want).max())
    assert diff <= 1, f"{name} on {backend}: max difference {diff}"


def test_plain_run_after_a_controlnet_run_is_the_plain_model() -> None:
    """The transformer takes the residual inputs only while a net is asked for: the next plain run gives tiny-sd3's
    own diffusers image, and the plan of a ControlNet run lists the residual inputs."""
    pipe = _pipe("reference")
    case = CASES[0]
    pipe(case["prompt"], **{**_kwargs(case), "steps": 1})
    assert any(n.startswith("controlnet_block_sample_") for n in pipe.denoiser.inputs)
    flow = json.loads((DATA / "tiny-sd3" / "refs.json").read_text())[0]
    got = np.stack(pipe(flow["prompt"], flow["negative_prompt"] or "", steps=flow["steps"], seed=flow["seed"],
                        width=flow["width"], height=flow["height"], sampler="Euler", cfg=flow["cfg"],
                        max_sequence_length=flow["max_sequence_length"])).astype(int)
    want = np.load(DATA / "tiny-sd3" / "refs.npz")[f"{flow['name']}/image"].astype(int)
    assert int(np.abs(got - want).max()) <= 2
    assert not any(n.startswith("controlnet_") for n in pipe.denoiser.inputs)
    plan = pipe.plan(case["prompt"], **_kwargs(case))
    shapes = {name: tuple(shape) for sig, _ in plan.part("transformer").signatures for name, shape, _ in sig}
    tokens = (case["height"] // 16) * (case["width"] // 16)
    assert shapes["controlnet_block_sample_0"] == (2, tokens, 32)  # both CFG halves in one call


def test_layouts_and_refusals(tmp_path) -> None:
    """The layout read from a file's keys and config.json; what does not run: one line each, naming the
    argument."""
    canny, depth = _net("canny"), _net("depth")
    assert (canny.sd3.blocks, canny.sd3.width, canny.sd3.zero_pooled) == (2, 32, True)
    assert (depth.sd3.blocks, depth.sd3.zero_pooled) == (1, False)
    from sdrt.checkpoint.families import detect

    assert detect(canny.weights.shapes()).startswith("a ControlNet")  # passed as the model: named as a ControlNet
    pipe = _pipe("reference")
    image = REFS["multi/control_image_0"]
    common = dict(steps=2, width=64, height=64, max_sequence_length=32)
    errors = [
        # (img2img, inpainting and the hires fix run: tests/flow/test_sd3_controlnet_img2img.py)
        (dict(controlnets=[ControlNet(canny, image), ControlNet(depth, image)]), "controlnets[1]",
         "cannot be summed"),
        (dict(controlnets=[ControlNet(canny, image, control_mode=1)]), "controlnets[0]", "scale and window only"),
        (dict(controlnets=[ControlNet(canny, image, union_mode=1)]), "controlnets[0] union_mode", "no union"),
    ]
    import dataclasses
    import shutil

    shutil.copytree(NETS / "canny", tmp_path / "wide")  # a net of SD3.5 Large's width on this 32-wide model
    wide = _net("canny")
    wide = dataclasses.replace(wide, path=tmp_path / "wide" / "diffusion_pytorch_model.safetensors",
                               sd3=dataclasses.replace(wide.sd3, width=2432))
    errors.append((dict(controlnets=[ControlNet(wide, image)]), "controlnets[0]", "32 wide"))
    for kw, where, words in errors:
        with pytest.raises(InputError) as exc:
            pipe("a cat", **common, **kw)
        assert exc.value.where == where and words in str(exc.value), (where, str(exc.value))
        assert "\n" not in str(exc.value)
    # a net of another family, either way round: both named
    register("reference")
    sd = pipelines.load(DATA / "tiny-sd15-controlnet", backend="reference")
    with pytest.raises((InputError, ModelError)) as exc:
        sd("a cat", steps=1, width=64, height=64, controlnets=[ControlNet(canny, image)])
    assert "SD3 ControlNet" in str(exc.value) and "SD 1.x" in str(exc.value), str(exc.value)
    from safetensors.numpy import save_file

    sd1 = tmp_path / "control_sd15_canny.safetensors"  # an SD 1.x net's telling keys (nothing else is read)
    save_file({"controlnet_cond_embedding.conv_in.weight": np.zeros((16, 3, 3, 3), np.float16),
               "controlnet_down_blocks.0.weight": np.zeros((320, 320, 1, 1), np.float16),
               "down_blocks.1.attentions.0.transformer_blocks.0.attn2.to_k.weight": np.zeros((640, 768), np.float16)},
              str(sd1))
    for net in (sd1, DATA / "tiny-sd15-controlnet" / "controlnet"):
        with pytest.raises((InputError, ModelError)) as exc:
            pipe("a cat", **common, controlnets=[ControlNet(net, image)])
        assert "SD3" in str(exc.value) and "SD 1.x" in str(exc.value) and "\n" not in str(exc.value), str(exc.value)
    flux = DATA / "tiny-flux-controlnet" / "canny" / "diffusion_pytorch_model.safetensors"
    with pytest.raises((InputError, ModelError)) as exc:
        pipe("a cat", **common, controlnets=[ControlNet(flux, image)])
    assert "Flux.1 ControlNet" in str(exc.value) and "SD3" in str(exc.value) and "\n" not in str(exc.value)
    flux_pipe = pipelines.load(DATA / "tiny-flux-dev", backend="reference")
    with pytest.raises((InputError, ModelError)) as exc:
        flux_pipe("a cat", **common, controlnets=[ControlNet(canny, image)])
    assert "SD3 ControlNet" in str(exc.value) and "Flux.1" in str(exc.value), str(exc.value)


def _shapes(base: str, blocks: int) -> dict[str, tuple[int, ...]]:
    """A full-size diffusers SD3 ControlNet's tensors of a shipped graph's architecture: its embeddings and first
    blocks (names and shapes as the shipped graph holds them), plus SD3ControlNetModel's own."""
    import onnx

    from sdrt.checkpoint.graphs import shipped_graph

    model = onnx.load(str(shipped_graph(base)), load_external_data=False)
    shapes = {}
    for t in model.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        parts = t.name.split(".")
        if parts[0] == "transformer_blocks" and int(parts[1]) >= blocks or parts[0] in ("norm_out", "proj_out"):
            continue
        shapes[t.name] = tuple(t.dims)
    width = shapes["pos_embed.proj.bias"][0]
    shapes.update({"pos_embed_input.proj.weight": (width, 16, 2, 2), "pos_embed_input.proj.bias": (width,)})
    for j in range(blocks):
        shapes.update({f"controlnet_blocks.{j}.weight": (width, width), f"controlnet_blocks.{j}.bias": (width,)})
    return shapes


@pytest.mark.parametrize(("base", "blocks"), [("sd3_medium_transformer", 6), ("sd35_medium_transformer", 6),
                                             ("sd35_large_transformer", 12)])
def test_full_size_files_bind_onto_the_derived_graph(tmp_path, base: str, blocks: int) -> None:
    """Full-size files (fp16, written sparse: nothing is read) bind tensor for tensor onto the graph cut from the
    shipped graph of their architecture, without graph=: InstantX's SD3 Medium nets (1536 wide, no q/k norm, a
    192x192 pos_embed) onto SD3 Medium's, 1536-wide nets with q/k norm onto SD3.5 Medium's, 2432-wide onto SD3.5
    Large's; a net of another architecture is one line naming it."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "checkpoint"))
    from single_file_helpers import sparse

    from sdrt.checkpoint.sd3controlnet import base_of

    shapes = _shapes(base, blocks)
    opened = open_controlnet(sparse(tmp_path / "net.safetensors", shapes), base="sd3")
    assert (opened.sd3.blocks, opened.sd3.zero_pooled) == (blocks, True)
    assert base_of(opened.sd3, shapes) == base
    last = f"transformer_blocks.{blocks - 1}."
    dead = [k for k in shapes if k.startswith((last + "attn.to_add_out.", last + "ff_context."))]
    assert len([k for k in opened.weights.shapes() if k in shapes]) == len(shapes) - len(dead)
    if base != "sd3_medium_transformer":  # the same net without q/k norm: SD3 Medium's design at another width
        plain = {k: v for k, v in shapes.items() if ".norm_" not in k and ".attn2." not in k}
        with pytest.raises(ModelError) as exc:
            open_controlnet(sparse(tmp_path / "plain.safetensors", plain), base="sd3")
        assert "plain.safetensors" in str(exc.value) and "\n" not in str(exc.value)
        assert ("another architecture" if base == "sd35_medium_transformer" else "sdrt ships SD3 Medium") in str(
            exc.value), str(exc.value)  # 1536 wide: SD3 Medium's graph, whose pos_embed is 192x192, not 384x384
    other = {k: v for k, v in shapes.items() if ".attn2." not in k and "norm1.linear" not in k}  # blocks unlike the graph's
    with pytest.raises(ModelError) as exc:
        open_controlnet(sparse(tmp_path / "other.safetensors", other), base="sd3")
    assert "other.safetensors" in str(exc.value) and "another architecture" in str(exc.value)
    assert "\n" not in str(exc.value)


def _stability_file(path: Path) -> Path:
    """The tiny image-only net in Stability's single-file keys (``sd3.5_large_controlnet_*.safetensors``): q, k, v
    fused into ``attn.qkv``, ``attn.proj``, ``mlp.fc1``/``fc2``, ``adaLN_modulation.1``; no config.json."""
    from safetensors.numpy import load_file, save_file

    d = load_file(str(NETS / "blur" / "diffusion_pytorch_model.safetensors"))
    out = {}
    names = {"attn.to_out.0.": "attn.proj.", "ff.net.0.proj.": "mlp.fc1.", "ff.net.2.": "mlp.fc2.",
             "norm1.linear.": "adaLN_modulation.1."}
    for k, v in d.items():
        head, _, rest = k.partition(".")
        if head == "transformer_blocks":
            block, _, rest = rest.partition(".")
            if rest.startswith(("attn.to_k.", "attn.to_v.")):
                continue
            if rest.startswith("attn.to_q."):
                kind = rest.rsplit(".", 1)[1]
                out[f"transformer_blocks.{block}.attn.qkv.{kind}"] = np.concatenate(
                    [d[f"transformer_blocks.{block}.attn.to_{x}.{kind}"] for x in "qkv"])
                continue
            new = next((n + rest[len(o):] for o, n in names.items() if rest.startswith(o)), rest)
            out[f"transformer_blocks.{block}.{new}"] = v
        else:
            out[k] = v
    save_file(out, str(path))
    return path


def test_stability_single_file_is_the_diffusers_net(tmp_path) -> None:
    """Stability's single-file layout of the SD3.5 Large nets binds onto the same graph (q, k, v split from
    ``attn.qkv``) and gives the diffusers folder's image; with no config.json it takes the prompt's pooled
    projections and the shifted latents, as diffusers' conversion of those files says."""
    path = _stability_file(tmp_path / "sd3.5_large_controlnet_blur.safetensors")
    opened = open_controlnet(path, graph=BASES["blur"])
    assert opened.sd3.image_only and not opened.sd3.zero_pooled and "SD3.5 Large" in opened.sd3.label
    case = next(c for c in CASES if c["nets"] == ["blur"])
    kw = _kwargs(case)
    kw["controlnets"][0].net = opened
    got = np.stack(_pipe("reference")(case["prompt"], **kw)).astype(int)
    assert int(np.abs(got - REFS[f"{case['name']}/image"].astype(int)).max()) <= 1


def test_a_net_of_other_control_channels_is_refused_in_one_line(tmp_path) -> None:
    """16 control channels (the control image's latents) and 17 with a text stream (alimama's inpainting nets:
    tests/flow/test_sd3_inpaint_controlnet.py) run; another count is a design sdrt has no graph for."""
    from safetensors.numpy import save_file

    inpaint = {"pos_embed_input.proj.weight": (1536, 17, 2, 2), "context_embedder.weight": (1536, 4096),
               "controlnet_blocks.0.weight": (1536, 1536)}
    assert identify(inpaint).base == "sd3" and "inpainting" in identify(inpaint).label
    odd = {**inpaint, "pos_embed_input.proj.weight": (1536, 18, 2, 2)}
    assert identify(odd).base is None and "18 control input channels" in identify(odd).label
    path = tmp_path / "odd.safetensors"  # written small: 2 control channels, another count sdrt has no graph for
    save_file({k: np.zeros((2,) * len(v), np.float16) for k, v in odd.items()}, str(path))
    with pytest.raises(ModelError) as exc:
        open_controlnet(path, base="sd3")
    assert "2 control input channels" in str(exc.value) and "\n" not in str(exc.value)


def test_full_size_stability_file_binds_onto_the_large_graph(tmp_path) -> None:
    """sd3.5_large_controlnet_{canny,depth,blur}.safetensors' keys and shapes (as diffusers' conversion script reads
    them; fp16, written sparse) bind onto the graph cut from the shipped SD3.5 Large graph; a 1536-wide net of
    that design is one line (sdrt runs it with SD3.5 Large)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "checkpoint"))
    from single_file_helpers import sparse

    w, ff = 2432, 9728
    shapes = {"pos_embed_input.proj.weight": (w, 16, 2, 2), "pos_embed_input.proj.bias": (w,),
              "time_text_embed.timestep_embedder.linear_1.weight": (w, 256),
              "time_text_embed.timestep_embedder.linear_1.bias": (w,),
              "time_text_embed.timestep_embedder.linear_2.weight": (w, w),
              "time_text_embed.timestep_embedder.linear_2.bias": (w,),
              "time_text_embed.text_embedder.linear_1.weight": (w, 2048),
              "time_text_embed.text_embedder.linear_1.bias": (w,),
              "time_text_embed.text_embedder.linear_2.weight": (w, w), "time_text_embed.text_embedder.linear_2.bias": (w,)}
    for i in range(19):
        b = f"transformer_blocks.{i}."
        shapes.update({b + "attn.qkv.weight": (3 * w, w), b + "attn.qkv.bias": (3 * w,), b + "attn.proj.weight": (w, w),
                       b + "attn.proj.bias": (w,), b + "mlp.fc1.weight": (ff, w), b + "mlp.fc1.bias": (ff,),
                       b + "mlp.fc2.weight": (w, ff), b + "mlp.fc2.bias": (w,),
                       b + "adaLN_modulation.1.weight": (6 * w, w), b + "adaLN_modulation.1.bias": (6 * w,),
                       f"controlnet_blocks.{i}.weight": (w, w), f"controlnet_blocks.{i}.bias": (w,)})
    opened = open_controlnet(sparse(tmp_path / "sd3.5_large_controlnet_canny.safetensors", shapes), base="sd3")
    assert (opened.sd3.blocks, opened.sd3.image_only, opened.sd3.zero_pooled) == (19, True, False)
    assert len(opened.weights.shapes()) >= 19 * 14 + 8 + 2 + 38
    small = {k: tuple(1536 if d == w else d for d in v) for k, v in shapes.items()}
    with pytest.raises(ModelError) as exc:
        open_controlnet(sparse(tmp_path / "small.safetensors", small), base="sd3")
    assert "SD3.5 Large" in str(exc.value) and "\n" not in str(exc.value)


def test_cli_flags_reach_the_net(tmp_path, capsys) -> None:
    """``--controlnet FILE --control-image PNG`` with an SD3 model: the net binds onto a shipped graph, which the
    tiny net (32 wide) has none of: one line saying so (the tiny tests bind with graph= above)."""
    from PIL import Image

    from sdrt.cli import main

    register("reference")  # the test alone: no earlier test registered it
    png = tmp_path / "edges.png"
    Image.fromarray(REFS["multi/control_image_0"]).save(png)
    rc = main(["generate", str(DATA / "tiny-sd3"), "a cat", "--controlnet", str(NETS / "canny"),
               "--control-image", str(png), "--steps", "1", "--max-sequence-length", "32", "--backend", "reference",
               "-o", str(tmp_path / "x.png")])
    err = capsys.readouterr().err
    assert rc != 0 and "SD3 ControlNet" in err and "1536" in err, err
    assert "Traceback" not in err and err.count("error:") == 1


@pytest.mark.parametrize("flags, said, unsaid", [
    (["--control-union-mode", "2"], "leave --control-union-mode out", "leave union_mode out"),
    (["--guess-mode"], "leave --control-mode Balanced and --guess-mode off", "guess mode off"),
])
def test_cli_refusals_of_sd_only_flags_name_the_flags(tmp_path, capsys, flags, said, unsaid) -> None:
    """A union mode, or guess mode, on an SD3 net was refused in the API's words on the command line ("leave
    union_mode out", "leave the control mode Balanced and guess mode off"); Flux's union refusals named the flag."""
    from PIL import Image

    from sdrt.cli import main

    register("reference")
    png = tmp_path / "edges.png"
    Image.fromarray(REFS["multi/control_image_0"]).save(png)
    rc = main(["generate", str(DATA / "tiny-sd3"), "a cat", "--controlnet", str(NETS / "canny"), "--control-image",
               str(png), *flags, "--steps", "1", "--backend", "reference", "-o", str(tmp_path / "x.png")])
    err = capsys.readouterr().err
    assert rc != 0 and err.count("error:") == 1 and said in err and unsaid not in err, err


def test_the_control_image_moves_the_image() -> None:
    """The tiny nets matter: a blank control image moves the image of a case by 100+ levels from diffusers' (so
    the 1-level image tests above see a control path gone wrong), and a net file rewritten on disk with another
    net's weights and opened again runs the new weights, not the ControlNet part compiled from the old ones."""
    pipe = _pipe("reference")
    for case in CASES:
        kw = _kwargs(case)
        for unit in kw["controlnets"]:
            unit.image = np.full_like(unit.image, 255)
        got = np.stack(pipe(case["prompt"], **kw)).astype(int)
        moved = int(np.abs(got - REFS[f"{case['name']}/image"].astype(int)).max())
        assert moved >= 100, f"{case['name']}: a blank control image moves the image by {moved} levels only"


def test_a_net_file_written_again_is_read_again(tmp_path) -> None:
    """A net's file written anew in place (``cp``) and opened again: the next run binds the new weights (the
    ControlNet part kept from the last run is of the old version), as a fresh pipeline does."""
    import shutil

    case = next(c for c in CASES if c["nets"] == ["canny"] and c["batch"] == 1)
    folder = tmp_path / "net"
    shutil.copytree(NETS / "canny", folder)
    path = folder / "diffusion_pytorch_model.safetensors"
    pipe = _pipe("reference")

    def run(net) -> np.ndarray:
        kw = {**_kwargs(case), "steps": 1}
        kw["controlnets"][0].net = net
        return np.stack(pipe(case["prompt"], **kw)).astype(int)

    first = run(open_controlnet(path, graph=BASE))
    with open(path, "r+b") as f:  # written again in place: the same inode, another mtime
        f.write((NETS / "canny2" / "diffusion_pytorch_model.safetensors").read_bytes())
    want = run(_net("canny2"))
    assert int(np.abs(want - first).max()) > 10  # the two nets give other images
    got = run(open_controlnet(path, graph=BASE))
    assert int(np.abs(got - want).max()) == 0


@pytest.mark.parametrize("module", ["tile_colorfix", "tile_colorfix+sharp"])
def test_the_colour_fix_modules_are_refused_in_one_line(module: str) -> None:
    """tile_colorfix corrects an SD UNet's noise prediction while sampling: on an SD3 ControlNet it is refused (as on
    Flux's), not run as the bare picture without its colour fix."""
    case = CASES[0]
    kw = {**_kwargs(case), "steps": 1}
    kw["controlnets"] = [ControlNet(_net(case["nets"][0]), REFS[f"{case['name']}/control_image_0"],
                                    preprocessor=module, low=3)]
    with pytest.raises(InputError, match=re.escape(f"{module} corrects the colours of an SD UNet's noise prediction "
                                                   "while sampling, and this is an SD3 ControlNet")) as exc:
        _pipe("reference").generate(case["prompt"], **kw)
    assert "\n" not in str(exc.value)
