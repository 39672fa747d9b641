"""LoRA layouts that training tools write, against the tools' own merge.

Data: ``scripts/make_lora_layout_refs.py`` (tests/data/lora/):

- PEFT LoRAs saved by diffusers' ``save_lora_weights`` with ``lora_adapter_metadata`` in the header, as
  diffusers' training scripts save them: ``lora_alpha`` / ``r``, ``rank_pattern``, ``alpha_pattern`` and
  ``use_rslora`` live there, not in ``.alpha`` tensors. Reference: diffusers' ``load_lora_weights`` +
  ``fuse_lora(lora_scale=0.8)``. sdrt read them as alpha = rank before: the tiny SD 1.x UNet's layers 2x to
  4x off, silently.
- LyCORIS's own wrapper (``create_lycoris``, how SimpleTuner trains LyCORIS) names modules ``lycoris_<module
  path flattened>`` (ComfyUI reads them); sdrt refused every layer ("match no weight") before. Reference:
  LyCORIS's ``merge_to``.
- LyCORIS's full weight differences and norm deltas (``diff`` / ``diff_b`` / ``w_norm`` / ``b_norm``), under both
  prefixes; sdrt refused them before. Reference: LyCORIS's ``merge_to``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from lora_helpers import DATA, merged_parts, transformer_deltas

from sdrt import pipelines
from sdrt.errors import WeightsError
from sdrt.lora import Lora
from sdrt.weights import Weights, stfile

D = DATA / "lora"
FLUX = DATA / "pipelines" / "tiny-flux-dev"


def _refs(npz: str, name: str) -> dict[str, np.ndarray]:
    refs = np.load(D / npz)
    return {k.split("/", 1)[1]: refs[k] for k in refs.files if k.startswith(name + "/")}


def _close(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for k, ref in want.items():
        np.testing.assert_allclose(got[k], ref.reshape(got[k].shape), atol=2e-5 * max(1.0, float(np.abs(ref).max())),
                                   err_msg=k)


def _sd1_deltas(lora: Lora, scale: float) -> dict[str, np.ndarray]:
    parts = merged_parts(lora, "sd1", scale)
    assert list(parts) == ["unet"]
    return parts["unet"].deltas


@pytest.mark.parametrize("name", ["peft_meta_sd1", "peft_meta_rslora_sd1"])
def test_peft_lora_scaled_by_its_adapter_metadata_as_diffusers(name):
    _close(_sd1_deltas(Lora.open(D / f"{name}.safetensors"), 0.8), _refs("peft_meta_refs.npz", name))


def test_peft_adapter_config_beside_the_file(tmp_path):
    """peft's ``save_pretrained`` layout: ``adapter_model.safetensors`` (``base_model.model.`` keys) and
    ``adapter_config.json``; the same factors and configuration as ``peft_meta_sd1`` give diffusers' change."""
    src = Weights.open(D / "peft_meta_sd1.safetensors")
    meta = json.loads(stfile.read_header(D / "peft_meta_sd1.safetensors")[1]["lora_adapter_metadata"])
    stfile.write(tmp_path / "adapter_model.safetensors",
                 {"base_model.model." + k.removeprefix("unet."): np.asarray(src[k]) for k in src})
    (tmp_path / "adapter_config.json").write_text(json.dumps({k.removeprefix("unet."): v for k, v in meta.items()}))
    _close(_sd1_deltas(Lora.open(tmp_path / "adapter_model.safetensors"), 0.8),
           _refs("peft_meta_refs.npz", "peft_meta_sd1"))
    (tmp_path / "adapter_config.json").unlink()  # without it: alpha = rank, peft's default
    plain = _sd1_deltas(Lora.open(tmp_path / "adapter_model.safetensors"), 0.8)
    k = "unet/down_blocks.0.attentions.0.proj_in.weight"
    np.testing.assert_allclose(plain[k] * 2, _refs("peft_meta_refs.npz", "peft_meta_sd1")[k].reshape(plain[k].shape),
                               rtol=1e-5, atol=1e-6)  # lora_alpha 8 / r 4


@pytest.mark.parametrize("meta, what", [("{not json", "is not JSON"),
                                        ('{"unet.r": 4, "unet.lora_alpha": "eight"}', "lora_alpha = 'eight'"),
                                        ('{"unet.r": 0, "unet.lora_alpha": 8}', "r = 0"),
                                        ('{"unet.r": 4, "unet.lora_alpha": 8, "unet.rank_pattern": [2]}',
                                         "rank_pattern")])
def test_a_broken_adapter_metadata_is_one_error_naming_the_file(tmp_path, meta, what):
    src = Weights.open(D / "peft_meta_sd1.safetensors")
    path = tmp_path / "broken.safetensors"
    stfile.write(path, {k: np.asarray(src[k]) for k in src}, {"lora_adapter_metadata": meta})
    with pytest.raises(WeightsError, match=r"^broken\.safetensors: .*" + what.replace("[", r"\[")) as e:
        Lora.open(path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("algo", ["lora", "loha", "lokr"])
def test_lycoris_wrapper_prefix_merges_as_lycoris(algo):
    name = f"lycoris_prefix_sd1_{algo}"
    lora = Lora.open(D / f"{name}.safetensors")
    assert all(k.startswith("lycoris_") for k in lora.layers)
    _close(_sd1_deltas(lora, 1.0), {f"unet/{k}": v for k, v in _refs("lycoris_prefix_refs.npz", name).items()})


@pytest.mark.parametrize("name", ["lycoris_full_sd1", "lycoris_full_prefix_sd1"])
def test_lycoris_full_diffs_and_norms_merge_as_lycoris(name):
    """LyCORIS's ``algo="full"`` (``diff``, ``diff_b``) with ``train_norm`` (``w_norm`` / ``b_norm`` on GroupNorm and
    LayerNorm) against LyCORIS's own ``create_lycoris_from_weights`` + ``merge_to(0.7)``: weights and biases of linear
    and conv layers, and the norms' weight and bias (a GroupNorm's kept [C, 1, 1] in the graph). sdrt refused every
    such key before ("not a lora_down/lora_up/lora_A/lora_B/alpha key")."""
    lora = Lora.open(D / f"{name}.safetensors")
    assert lora.format == "lycoris"
    want = _refs("lycoris_full_refs.npz", name)
    assert any(k.endswith("norm2.bias") for k in want) and any(k.endswith("norm1.weight") for k in want)
    _close(_sd1_deltas(lora, 0.7), want)


def test_a_full_diff_beside_lora_factors_of_one_module_is_one_error():
    arrays = {"lora_unet_fc.diff": np.ones((4, 4), np.float32), "lora_unet_fc.lora_down.weight": np.ones((2, 4), np.float32),
              "lora_unet_fc.lora_up.weight": np.ones((4, 2), np.float32), "lora_unet_nm.b_norm": np.ones((4, 2), np.float32)}
    with pytest.raises(WeightsError, match=r"2 LoRA keys cannot be used: .*lora_unet_fc \(has diff, down, up: a full "
                       r"diff .*lora_unet_nm.b_norm \(\[4, 2\]: expected one vector\)") as e:
        Lora.from_arrays(arrays)
    assert "\n" not in str(e.value)


@pytest.fixture
def flux(registry):
    with pipelines.load(FLUX, backend="reference") as p:
        yield p


def _flux_deltas(pipe, name: str, scale: float) -> dict[str, np.ndarray]:
    return transformer_deltas(pipe, D / f"{name}.safetensors", scale)


def test_flux_lora_with_adapter_metadata_and_lycoris_prefix(flux):
    _close(_flux_deltas(flux, "flux_peft_meta", 0.8), _refs("peft_meta_refs.npz", "flux_peft_meta"))
    _close(_flux_deltas(flux, "lycoris_prefix_flux_lokr", 1.0), _refs("lycoris_prefix_refs.npz", "lycoris_prefix_flux_lokr"))


def test_lycoris_full_diffs_on_flux_merge_weights_and_biases_as_lycoris(flux):
    """SimpleTuner's Flux LyCORIS with ``algo="full"`` (``lycoris_transformer_blocks_0_attn_to_q.diff`` / ``.diff_b``)
    against LyCORIS's ``merge_to(0.7)``: every linear's weight and bias."""
    want = _refs("lycoris_full_refs.npz", "lycoris_full_flux")
    assert sum(k.endswith(".bias") for k in want) == 5
    _close(_flux_deltas(flux, "lycoris_full_flux", 0.7), want)


def test_lycoris_full_diffs_in_bfl_fused_names_split_as_diffusers_converter(flux):
    """sd-scripts' LyCORIS full diffs on Flux (Black Forest Labs' names: ``lora_unet_double_blocks_0_img_attn_qkv.diff``
    and ``.diff_b``) against diffusers' single-file converter of the whole change: ``qkv`` weight and bias rows split
    into q, k, v, the final adaLN's halves swapped, bias and weight alike."""
    want = _refs("lycoris_full_refs.npz", "lycoris_full_bfl_flux")
    assert {"transformer_blocks.0.attn.to_k.bias", "norm_out.linear.bias"} <= set(want)
    _close(_flux_deltas(flux, "lycoris_full_bfl_flux", 0.7), want)


@pytest.mark.parametrize("name", ["peft_meta_loha_sd1", "peft_meta_lokr_sd1"])
def test_peft_loha_and_lokr_scaled_by_their_adapter_metadata_as_peft(name):
    """peft's LoHa / LoKr saved by diffusers' ``save_lora_adapter`` (``alpha`` 8, ``r`` 4 in the header) against
    peft's own ``merge()``: scaled ``alpha / r`` (a LoKr with whole factors too, where LyCORIS's files scale 1)."""
    _close(_sd1_deltas(Lora.open(D / f"{name}.safetensors"), 1.0), _refs("peft_meta_lycoris_refs.npz", name))


def test_sd3_kohya_lora_splits_as_diffusers_single_file_converter(registry):
    """kohya sd-scripts' SD3 LoRA (Stability's MMDiT names after ``lora_unet_``: fused ``qkv`` of both streams and of
    the dual attention, adaLN layers (the last block's pre-only context adaLN swapped), the final layer, the patch
    embedder's conv) against diffusers' ``convert_sd3_transformer_checkpoint_to_diffusers`` of each layer's change
    (diffusers 0.42 loads no such LoRA itself)."""
    with pipelines.load(DATA / "pipelines" / "tiny-sd3", backend="reference") as pipe:
        _close(_flux_deltas(pipe, "sd3_kohya", 0.8), dict(np.load(D / "sd3_kohya_refs.npz")))


def test_an_adapter_config_applies_only_to_peft_s_own_adapter_file(tmp_path):
    """A loras folder holding one peft adapter's ``adapter_config.json`` beside other LoRAs: the others keep alpha =
    rank (the config belongs to ``adapter_model.safetensors`` alone)."""
    src = Weights.open(D / "peft_meta_sd1.safetensors")
    plain = {k: np.asarray(src[k]) for k in src}
    stfile.write(tmp_path / "other_lora.safetensors", plain)
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 64, "peft_type": "LORA"}))
    lora = Lora.open(tmp_path / "other_lora.safetensors")
    layer = lora.layers["unet.down_blocks.0.attentions.0.proj_in"]
    assert layer.alpha == layer.rank
