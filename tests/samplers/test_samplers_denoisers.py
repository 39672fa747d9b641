"""Denoiser wrappers around a real ONNX graph run by the reference backend, and classifier-free guidance.

The graphs compute the exact eps / v / flow-velocity prediction of Gaussian
data whose mean is shifted by the mean of the conditioning, from the network
inputs (scaled sample, timestep, encoder hidden states), including the
timestep -> sigma lookup in log-sigma space. So a wrapper that scales,
converts or combines anything wrongly gives a wrong denoised estimate.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from _sampler_refs import DATA_STD, SHAPE, GaussianFlow, GaussianVE, data_mean, rel_err, start_noise
from onnx import TensorProto, helper, numpy_helper

import sdrt
from sdrt import samplers as S
from sdrt.errors import SamplerError

COND_SHAPE = (1, 2, 8)


def _const(name: str, value) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value, np.float32), name))


def build_graph(prediction: str, *, timestep_type: int = TensorProto.FLOAT, names=("sample", "timestep",
                "encoder_hidden_states"), extra_input: str | None = None) -> bytes:
    sample, timestep, ehs = names
    ms = S.DiscreteSchedule("eps")
    nodes = [
        _const("mu", data_mean()), _const("s2", DATA_STD**2), _const("one", 1.0), _const("zero", 0.0),
        _const("k1000", 1000.0), _const("tmax", 999.0),
        _const("log_sigmas", ms.log_sigmas),
        helper.make_node("Cast", [timestep], ["tf"], to=TensorProto.FLOAT),
        helper.make_node("ReduceMean", [ehs], ["c0"], keepdims=0),
    ]
    if extra_input:  # like SDXL's time_ids: shifts the data mean by its mean
        nodes += [helper.make_node("ReduceMean", [extra_input], ["c1"], keepdims=0),
                  helper.make_node("Add", ["c0", "c1"], ["c"])]
    else:
        nodes += [helper.make_node("Identity", ["c0"], ["c"])]
    nodes += [helper.make_node("Add", ["mu", "c"], ["m"])]
    if prediction == "flow":
        nodes += [helper.make_node("Div", ["tf", "k1000"], ["sigma"])]
    else:
        nodes += [
            helper.make_node("Clip", ["tf", "zero", "tmax"], ["tc"]),
            helper.make_node("Floor", ["tc"], ["lo"]), helper.make_node("Ceil", ["tc"], ["hi"]),
            helper.make_node("Sub", ["tc", "lo"], ["w"]),
            helper.make_node("Cast", ["lo"], ["lo_i"], to=TensorProto.INT64),
            helper.make_node("Cast", ["hi"], ["hi_i"], to=TensorProto.INT64),
            helper.make_node("Gather", ["log_sigmas", "lo_i"], ["ls_lo"]),
            helper.make_node("Gather", ["log_sigmas", "hi_i"], ["ls_hi"]),
            helper.make_node("Sub", ["ls_hi", "ls_lo"], ["ls_d"]), helper.make_node("Mul", ["w", "ls_d"], ["ls_w"]),
            helper.make_node("Add", ["ls_lo", "ls_w"], ["log_sigma"]),
            helper.make_node("Exp", ["log_sigma"], ["sigma"]),
        ]
    nodes += [helper.make_node("Mul", ["sigma", "sigma"], ["sig2"])]
    if prediction == "flow":
        nodes += [
            helper.make_node("Sub", ["one", "sigma"], ["a"]),
            helper.make_node("Mul", ["a", "a"], ["a2"]), helper.make_node("Mul", ["a2", "s2"], ["a2s2"]),
            helper.make_node("Add", ["a2s2", "sig2"], ["den"]), helper.make_node("Mul", ["a", "s2"], ["as2"]),
            helper.make_node("Div", ["as2", "den"], ["gain"]), helper.make_node("Mul", ["a", "m"], ["am"]),
            helper.make_node("Sub", [sample, "am"], ["dx"]), helper.make_node("Mul", ["gain", "dx"], ["gdx"]),
            helper.make_node("Add", ["m", "gdx"], ["D"]),
            helper.make_node("Sub", [sample, "D"], ["xmd"]), helper.make_node("Div", ["xmd", "sigma"], ["out"]),
        ]
    else:
        nodes += [
            helper.make_node("Add", ["sig2", "one"], ["sp1"]), helper.make_node("Sqrt", ["sp1"], ["root"]),
            helper.make_node("Mul", [sample, "root"], ["x"]),
            helper.make_node("Mul", ["s2", "x"], ["s2x"]), helper.make_node("Mul", ["sig2", "m"], ["sig2m"]),
            helper.make_node("Add", ["s2x", "sig2m"], ["num"]), helper.make_node("Add", ["s2", "sig2"], ["den"]),
            helper.make_node("Div", ["num", "den"], ["D"]),
            helper.make_node("Sub", ["x", "D"], ["xmd"]),
            helper.make_node("Div", ["xmd", "sigma"], ["eps" if prediction in ("v", "x0") else "out"]),
        ]
        if prediction == "x0":  # the denoised sample itself (diffusers' prediction_type="sample")
            nodes += [helper.make_node("Identity", ["D"], ["out"])]
        if prediction == "v":  # v = (eps - sigma D) / sqrt(1 + sigma^2)
            nodes += [helper.make_node("Mul", ["sigma", "D"], ["sD"]), helper.make_node("Sub", ["eps", "sD"], ["vn"]),
                      helper.make_node("Div", ["vn", "root"], ["out"])]
    graph = helper.make_graph(
        nodes, f"gaussian_{prediction}",
        [helper.make_tensor_value_info(sample, TensorProto.FLOAT, SHAPE),
         helper.make_tensor_value_info(timestep, timestep_type, [1]),
         helper.make_tensor_value_info(ehs, TensorProto.FLOAT, COND_SHAPE)]
        + ([helper.make_tensor_value_info(extra_input, TensorProto.FLOAT, [1, 6])] if extra_input else []),
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, SHAPE)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _cond(value: float) -> np.ndarray:
    return np.full(COND_SHAPE, value, np.float32)


@pytest.mark.parametrize("prediction", ["eps", "v", "x0"])
def test_discrete_denoiser_over_a_real_session_is_the_exact_denoiser(registry, prediction):
    session = sdrt.load(build_graph(prediction), backend="reference")
    model = S.Denoiser(session, S.DiscreteSchedule(prediction))
    x = (start_noise() * 3.0).astype(np.float32)
    for sigma in (14.6, 3.1, 0.4, 0.03):
        got = model(x, sigma, cond=_cond(0.25))
        want = GaussianVE(data_mean() + 0.25)(x.astype(np.float64), sigma)
        assert got.dtype == np.float32
        assert rel_err(got, want) < 2e-5, (prediction, sigma)


def test_flow_denoiser_over_a_real_session_is_the_exact_denoiser(registry):
    session = sdrt.load(build_graph("flow"), backend="reference")
    ms = S.sd3_schedule(3.0)
    model = S.Denoiser(session, ms)
    x = start_noise().astype(np.float32)
    for sigma in (0.999, 0.6, 0.1, 0.01):
        got = model(x, sigma, cond=_cond(-0.5))
        want = GaussianFlow(ms, data_mean() - 0.5)(x.astype(np.float64), sigma)
        assert rel_err(got, want) < 2e-5, sigma


def test_cfg_combines_and_skips_the_unconditional_pass_at_scale_one(registry):
    session = sdrt.load(build_graph("eps"), backend="reference")
    model = S.Denoiser(session, S.DiscreteSchedule("eps"))
    x = (start_noise() * 2.0).astype(np.float32)
    cond, uncond = _cond(0.3), _cond(-0.1)
    guided = S.CFGDenoiser(model, cond, uncond, scale=7.5)
    got = guided(x, 1.7)
    pos = GaussianVE(data_mean() + 0.3)(x.astype(np.float64), 1.7)
    neg = GaussianVE(data_mean() - 0.1)(x.astype(np.float64), 1.7)
    assert rel_err(got, neg + 7.5 * (pos - neg)) < 5e-5
    assert guided.calls == 2
    single = S.CFGDenoiser(model, cond, uncond, scale=1.0)
    assert np.array_equal(single(x, 1.7), model(x, 1.7, cond=cond))
    assert single.calls == 1


@pytest.mark.parametrize("prediction", ["eps", "v"])
def test_cfg_rescale_is_diffusers_rescale_in_the_network_output(registry, prediction):
    """``rescale`` mixes the guided network output brought to the positive one's (Bessel-corrected) std, per image,
    as diffusers' rescale_noise_cfg does (written out here). (This graph has batch 1: the batched form is checked
    against diffusers' images in tests/pipelines/test_pipelines_schedule.py.)"""
    session = sdrt.load(build_graph(prediction), backend="reference")
    ms = S.DiscreteSchedule(prediction)
    model = S.Denoiser(session, ms)
    x = (start_noise() * 2.0).astype(np.float32)
    cond, uncond = _cond(0.3), _cond(-0.1)
    sigma, phi = 1.7, 0.7
    t = ms.timestep(sigma)
    x_in = ms.scale_input(x, sigma)
    pos = model.predict(x_in, t, cond=cond).astype(np.float64)
    neg = model.predict(x_in, t, cond=uncond).astype(np.float64)
    guided = neg + 7.5 * (pos - neg)
    axes = tuple(range(1, x.ndim))
    scaled = guided * pos.std(axis=axes, ddof=1, keepdims=True) / guided.std(axis=axes, ddof=1, keepdims=True)
    want = ms.denoised(x.astype(np.float64), sigma, phi * scaled + (1 - phi) * guided)
    den = S.CFGDenoiser(model, cond, uncond, scale=7.5, rescale=phi)
    assert rel_err(den(x, sigma), want) < 5e-5
    assert den.calls == 2
    # this graph's conditioning shifts its output, which leaves the std as it is: the rescale's effect (up to 211
    # levels) is checked against diffusers' images in tests/pipelines/test_pipelines_schedule.py


def test_rescale_guidance_moves_a_guided_output_whose_spread_differs():
    """The graph test above cannot tell a rescale from none (its guided and positive outputs have one std): here the
    guided output has 3x the positive one's spread in image 0 and the same in image 1, per image as diffusers'."""
    from sdrt.samplers.denoisers import rescale_guidance

    pos = np.random.default_rng(1).standard_normal((2, 4, 8, 8)).astype(np.float32)
    guided = pos.copy()
    guided[0] *= 3.0
    out = rescale_guidance(guided, pos, 0.7)
    np.testing.assert_allclose(out[0], (0.7 * 1.0 + 0.3 * 3.0) * pos[0], rtol=1e-5, atol=1e-6)  # 3x -> 1.6x
    np.testing.assert_allclose(out[1], pos[1], rtol=1e-6, atol=1e-6)  # already the positive spread: unchanged
    flat = np.zeros_like(pos)  # no spread (the plan's dry run feeds zeros): kept, no division by zero
    assert np.array_equal(rescale_guidance(flat, pos, 0.7), flat)


def test_full_sampling_run_through_the_session_matches_the_numpy_model(registry):
    session = sdrt.load(build_graph("eps"), backend="reference")
    ms = S.DiscreteSchedule("eps")
    guided = S.CFGDenoiser(S.Denoiser(session, ms), _cond(0.2), _cond(0.0), scale=3.0)
    choice = S.resolve("DPM++ 2M Karras")
    sigmas = S.get_sigmas(choice.schedule, 12, ms)
    x = S.randn(1, SHAPE) * np.float32(sigmas[0])
    out = S.get_sampler(choice.sampler)(guided, x, sigmas)

    def numpy_model(xx, sigma):
        pos = GaussianVE(data_mean() + 0.2)(xx, sigma)
        neg = GaussianVE(data_mean())(xx, sigma)
        return neg + 3.0 * (pos - neg)

    ref = S.dpmpp_2m(numpy_model, x.astype(np.float64), sigmas)
    assert out.dtype == np.float32
    assert rel_err(out, ref) < 1e-4
    assert guided.calls == 2 * 12


def test_input_names_and_integer_timesteps_are_configurable(registry):
    graph = build_graph("eps", timestep_type=TensorProto.INT64, names=("latent", "t", "context"))
    session = sdrt.load(graph, backend="reference")
    model = S.Denoiser(session, S.DiscreteSchedule("eps"), sample_name="latent", timestep_name="t",
                       cond_name="context")
    assert model.timestep_dtype == np.int64
    ms = S.DiscreteSchedule("eps")
    x = start_noise().astype(np.float32)
    sigma = float(ms.sigma(400.0))  # an integer timestep, so rounding loses nothing
    got = model(x, sigma, cond=_cond(0.0))
    assert rel_err(got, GaussianVE()(x.astype(np.float64), sigma)) < 2e-5


def test_constant_extra_feeds_reach_the_session(registry):
    session = sdrt.load(build_graph("eps", extra_input="time_ids"), backend="reference")
    time_ids = np.full((1, 6), 0.5, np.float32)
    model = S.Denoiser(session, S.DiscreteSchedule("eps"), feeds={"time_ids": time_ids})
    x = start_noise().astype(np.float32)
    got = model(x, 2.0, cond=_cond(0.25))
    assert rel_err(got, GaussianVE(data_mean() + 0.75)(x.astype(np.float64), 2.0)) < 2e-5
    with pytest.raises(sdrt.SdrtError, match="time_ids"):
        S.Denoiser(session, S.DiscreteSchedule("eps"))(x, 2.0, cond=_cond(0.25))


def test_wrong_input_names_are_a_sampler_error(registry):
    session = sdrt.load(build_graph("eps"), backend="reference")
    with pytest.raises(SamplerError) as info:
        S.Denoiser(session, S.DiscreteSchedule(), timestep_name="t")
    assert "'t'" in str(info.value) and "timestep" in str(info.value)


def test_missing_conditioning_is_a_sampler_error(registry):
    session = sdrt.load(build_graph("eps"), backend="reference")
    with pytest.raises(SamplerError, match="no conditioning"):
        S.Denoiser(session, S.DiscreteSchedule())(start_noise().astype(np.float32), 1.0)


def test_an_output_of_another_shape_than_the_sample_is_a_model_error(registry):
    """A graph whose output is not its sample's shape (a learned-sigma UNet's 2C channels, a convolution exported
    with other dilations) gave numpy's broadcast error, a traceback, from inside the sampler."""
    from sdrt.errors import ModelError

    c = SHAPE[1]
    nodes = [helper.make_node("Concat", ["sample", "sample"], ["out"], axis=1)]
    graph = helper.make_graph(nodes, "twice_the_channels", [
        helper.make_tensor_value_info("sample", TensorProto.FLOAT, SHAPE),
        helper.make_tensor_value_info("timestep", TensorProto.FLOAT, [1]),
        helper.make_tensor_value_info("encoder_hidden_states", TensorProto.FLOAT, COND_SHAPE)],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [SHAPE[0], 2 * c, *SHAPE[2:]])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = sdrt.load(model.SerializeToString(), backend="reference")
    x = start_noise().astype(np.float32)
    with pytest.raises(ModelError, match=rf"output has shape \[{SHAPE[0]}, {2 * c}, .* for a sample of shape"):
        S.get_sampler("euler")(S.CFGDenoiser(S.Denoiser(session, S.DiscreteSchedule("eps")), _cond(0.0), None, 1.0),
                               x, np.array([14.6, 1.0, 0.0]))


@pytest.mark.parametrize(("x", "sigmas", "match"), [
    (np.zeros(SHAPE, np.int32), [1.0, 0.0], "floating-point"),
    ([0.0, 1.0], [1.0, 0.0], "floating-point"),
    (np.zeros(SHAPE), [0.0, 1.0], "must not increase"),
    (np.zeros(SHAPE), [1.0, -1.0], "non-negative"),
    (np.zeros(SHAPE), [[1.0, 0.0]], "1-D"),
])
def test_bad_sampler_arguments_are_sampler_errors(x, sigmas, match):
    with pytest.raises(SamplerError, match=match):
        S.euler(GaussianVE(), x, sigmas)


def test_bad_solver_options_are_sampler_errors():
    x = np.zeros(SHAPE)
    with pytest.raises(SamplerError, match="solver_type"):
        S.dpmpp_2m_sde(GaussianVE(), x, [1.0, 0.0], solver_type="rk4")
    with pytest.raises(SamplerError, match="variant"):
        S.uni_pc(GaussianVE(), x, [2.0, 1.0, 0.0], variant="bh3")
    with pytest.raises(SamplerError, match="at least 2 steps"):
        S.uni_pc(GaussianVE(), x, [1.0, 0.0])
