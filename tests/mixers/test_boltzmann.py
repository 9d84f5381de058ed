"""The Boltzmann attention mixer: its modes, inference methods and couplings."""

import pytest
import torch
import yaml

from attnlab.config import ModelConfig, TrainConfig
from attnlab.errors import ConfigError, UserError
from attnlab.mixers import build_mixer
from attnlab.model import Decoder
from attnlab.train import param_groups

D_MODEL, N_HEADS = 16, 2


def make(**options):
    torch.manual_seed(0)
    return build_mixer("boltzmann", d_model=D_MODEL, n_heads=N_HEADS, **options).double()


def heads(mixer, x):
    B, T, _ = x.shape
    q, k, _ = mixer.qkv(x).view(B, T, 3, N_HEADS, -1).permute(2, 0, 3, 1, 4)
    return mixer.rotary(q), mixer.rotary(k)


def attention_weights(mixer, x):
    """The normalised weights the mixer applies, recovered by feeding identity values."""
    q, k = heads(mixer, x)
    T = x.shape[1]
    eye = torch.eye(T, dtype=x.dtype).expand(x.shape[0], N_HEADS, T, T)
    return mixer.attend(q, k, eye)


def test_zero_couplings_give_normalised_sigmoid_of_twice_the_scores():
    mixer = make()  # J starts at zero
    x = torch.randn(2, 7, D_MODEL, dtype=torch.float64)
    q, k = heads(mixer, x)
    alpha = torch.sigmoid(2 * q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5)).tril()
    torch.testing.assert_close(attention_weights(mixer, x), alpha / alpha.sum(-1, keepdim=True), rtol=0, atol=1e-10)


def test_j_only_attends_uniformly():
    mixer = make(mode="j-only", j_init_std=1.0)
    w = attention_weights(mixer, torch.randn(1, 6, D_MODEL, dtype=torch.float64))
    uniform = torch.ones(6, 6, dtype=torch.float64).tril() / torch.arange(1, 7, dtype=torch.float64)[:, None]
    torch.testing.assert_close(w[0, 0], uniform, rtol=0, atol=1e-12)
    biased = make(mode="j-only", j_init_std=1.0, bias_field=True)
    with torch.no_grad():
        biased.bias.normal_()
    assert not torch.allclose(attention_weights(biased, torch.randn(1, 6, D_MODEL, dtype=torch.float64))[0, 0], uniform)


@pytest.mark.parametrize("inference", ["banded", "mean-field"])
def test_without_couplings_every_inference_is_the_closed_form(inference):
    exact = make(mode="h-only")
    other = make(mode="h-only", inference=inference, window=8, band=2)
    other.load_state_dict(exact.state_dict())
    x = torch.randn(2, 7, D_MODEL, dtype=torch.float64)
    torch.testing.assert_close(attention_weights(other, x), attention_weights(exact, x), rtol=0, atol=1e-12)


@pytest.mark.parametrize("inference", ["banded", "mean-field", "dqa"])
def test_inference_methods_agree_with_exact_where_they_should(inference):
    x = torch.randn(2, 6, D_MODEL, dtype=torch.float64)
    exact = make(couplings="distance", window=8, j_init_std=0.3 if inference != "mean-field" else 0.02)
    other = make(couplings="distance", window=8, inference=inference, band=7, dqa_shots=0, dqa_tau=0.05,
                 j_init_std=0.3 if inference != "mean-field" else 0.02)
    other.load_state_dict(exact.state_dict())
    w_exact, w_other = attention_weights(exact, x), attention_weights(other, x)
    if inference == "banded":  # band 7 covers every pair of 6 positions: the same model exactly
        torch.testing.assert_close(w_other, w_exact, rtol=0, atol=1e-12)
    elif inference == "mean-field":  # weak couplings: close
        assert (w_other - w_exact).abs().max() < 2e-3
    else:  # a very fast anneal samples nearly uniformly
        uniform = torch.ones(6, 6, dtype=torch.float64).tril() / torch.arange(1, 7, dtype=torch.float64)[:, None]
        assert (w_other[0, 0] - uniform).abs().max() < 1e-3


def test_banded_inference_runs_far_beyond_the_window_with_distance_couplings():
    mixer = make(couplings="distance", inference="banded", band=3, window=8, j_init_std=0.2)
    x = torch.randn(1, 200, D_MODEL, dtype=torch.float64, requires_grad=True)
    y, _ = mixer(x)
    y.sum().backward()
    assert torch.isfinite(y).all() and mixer.J.grad.abs().sum() > 0


@pytest.mark.parametrize("inference", ["banded", "mean-field"])
def test_past_the_window_distance_couplings_slide_it(inference):
    """Each query sees its last `window` keys, exactly as if the sequence began there (RoPE is relative)."""
    mixer = make(couplings="distance", inference=inference, band=3, window=5, j_init_std=0.3)
    x = torch.randn(2, 11, D_MODEL, dtype=torch.float64)
    w = attention_weights(mixer, x)
    assert (w[..., 6:, :2] == 0).all() and (w[..., 10, 6:] > 0).all()
    y, _ = mixer(x)
    for t in (4, 7, 10):
        alone, _ = mixer(x[:, t - 4 : t + 1])
        torch.testing.assert_close(y[:, t], alone[:, -1], rtol=0, atol=1e-10)


def test_banded_inference_is_linear_in_the_length(monkeypatch):
    """The work per query is one chain of `window` spins: a 4x longer input makes 4x the chains."""
    from attnlab.ops import ising

    chains, real = [], ising.banded_log_marginals
    monkeypatch.setattr(ising, "banded_log_marginals", lambda h, Jb: chains.append(tuple(h.shape)) or real(h, Jb))
    mixer = make(couplings="distance", inference="banded", band=2, window=4)
    for T in (16, 64):
        mixer(torch.randn(1, T, D_MODEL, dtype=torch.float64))
    assert chains == [(N_HEADS * 16, 4), (N_HEADS * 64, 4)]


def test_position_couplings_refuse_contexts_beyond_the_window():
    mixer = make(window=4)
    with pytest.raises(UserError, match="window=4 sees at most 4 positions, but this call reaches 6"):
        mixer(torch.randn(1, 6, D_MODEL, dtype=torch.float64))


def test_distance_couplings_are_toeplitz():
    mixer = make(couplings="distance", window=5, j_init_std=1.0)
    J = mixer.coupling_matrix(7)
    for d in range(1, 7):
        expected = mixer.J[:, d - 1] if d <= 4 else torch.zeros(N_HEADS, dtype=torch.float64)
        for j in range(7 - d):
            torch.testing.assert_close(J[:, j, j + d], expected)


def test_couplings_get_their_own_optimizer_group():
    model = Decoder(ModelConfig(vocab_size=12, d_model=D_MODEL, n_layers=1, n_heads=N_HEADS, mixer="boltzmann",
                                mixer_options={"boltzmann": {"j_lr": 1e-4, "j_weight_decay": 0.02}}))
    groups = {id(p): (g["peak_lr"], g["weight_decay"]) for g in param_groups(model, TrainConfig()) for p in g["params"]}
    assert groups[id(model.blocks[0].mixer.J)] == (1e-4, 0.02)


def test_three_body_and_bias_parameters():
    mixer = make(mode="h+J+K", window=6)
    assert mixer.K.shape == (N_HEADS, 6, 6, 6) and mixer.J.shape == (N_HEADS, 6, 6)
    assert make(mode="h-only").J is None


@pytest.mark.parametrize(
    "options, message",
    [({"mode": "hJ"}, r"unknown boltzmann.mode 'hJ'; did you mean 'h\+J'"),
     ({"inference": "sampling"}, "unknown boltzmann.inference 'sampling'"),
     ({"couplings": "pair"}, "unknown boltzmann.couplings 'pair'. Known: distance, position"),
     ({"mode": "h+J+K", "inference": "banded"}, "banded inference handles pair couplings only"),
     ({"mode": "h+K", "couplings": "distance"}, "three-body couplings, which are indexed by position"),
     ({"inference": "banded", "band": 20}, "band=20 must be between 1 and window - 1 = 15"),
     ({"inference": "dqa", "window": 16}, "dqa simulates 2\\^window amplitudes per query; window=16")],
)
def test_bad_options(options, message):
    with pytest.raises(ConfigError, match=message):
        build_mixer("boltzmann", d_model=D_MODEL, n_heads=N_HEADS, **options)


def test_dqa_with_shots_is_reproducible_in_evaluation_and_trains_the_couplings():
    mixer = make(inference="dqa", window=6, dqa_shots=64, j_init_std=0.3)
    x = torch.randn(1, 5, D_MODEL, dtype=torch.float64, requires_grad=True)
    mixer.eval()
    torch.testing.assert_close(mixer(x)[0], mixer(x)[0], rtol=0, atol=0)
    mixer.train()
    for gradient in ("ste", "covariance"):
        mixer.cfg.dqa_gradient = gradient
        mixer.zero_grad()
        mixer(x)[0].square().sum().backward()
        assert torch.isfinite(mixer.J.grad).all() and mixer.J.grad.abs().sum() > 0, gradient


def advised_settings(message: str) -> dict:
    """The field=value pairs an error advises after 'set ' (up to the note in brackets), read as a run's
    overrides are (YAML values)."""
    pairs = message.split("; set ", 1)[1].split(" (")[0].split()
    return {field: yaml.safe_load(value) for field, value in (pair.split("=") for pair in pairs)}


@pytest.mark.parametrize("options", [{}, {"mode": "h+J+K", "window": 6}, {"inference": "dqa", "window": 8},
                                     {"bias_field": True, "inference": "mean-field"}])
def test_the_window_error_advises_a_configuration_that_runs_at_the_length(options):
    T = 40
    with pytest.raises(UserError, match=f"but this call reaches {T}; set couplings=distance") as error:
        make(**options)(torch.randn(1, T, D_MODEL, dtype=torch.float64))
    y, _ = make(**{**options, **advised_settings(str(error.value))})(torch.randn(1, T, D_MODEL, dtype=torch.float64))
    assert y.shape == (1, T, D_MODEL) and torch.isfinite(y).all()


def test_raising_the_window_is_advised_only_as_far_as_exact_inference_can_enumerate():
    from attnlab.mixers.boltzmann import exact_gib, max_exact_positions

    budget = exact_gib(N_HEADS, 10) + 1e-9  # exactly ten positions fit (fp32)
    assert max_exact_positions(N_HEADS, budget) == 10
    with pytest.raises(UserError, match=r"or raise window to 9 \(exact inference: 2\^9 configurations") as error:
        make(window=4, memory_budget_gib=budget).float()(torch.randn(1, 9, D_MODEL))
    make(window=9, memory_budget_gib=budget, j_init_std=0.1).float()(torch.randn(1, 9, D_MODEL))  # and it runs
    with pytest.raises(UserError, match="raising window cannot reach 11: exact inference enumerates at most 10"):
        make(window=4, memory_budget_gib=budget).float()(torch.randn(1, 11, D_MODEL))
    assert "raise window" not in str(error.value).split("; set ")[1].split(",")[0]  # the sliding fix comes first


def test_exact_inference_past_its_budget_fails_before_enumerating_and_advises_what_runs():
    mixer = make(window=64, memory_budget_gib=2**-20, j_init_std=0.1)  # a few positions fit
    with pytest.raises(UserError, match=r"enumerates 2\^30 configurations per query, .* GiB per sequence, but "
                                        r"memory_budget_gib=9.53674e-07 holds at most 4 positions; set") as error:
        mixer(torch.randn(1, 30, D_MODEL).double())
    y, _ = make(**advised_settings(str(error.value)))(torch.randn(1, 30, D_MODEL, dtype=torch.float64))
    assert torch.isfinite(y).all()


def tiny_run(mixer_overrides, seq_len=64):
    from attnlab.config import load_config

    cfg = load_config("demo", ["model.d_model=16", "model.n_layers=1", "model.n_heads=2", "train.batch_size=4",
                               f"train.seq_len={seq_len}", *mixer_overrides])
    cfg.model.vocab_size = 20
    torch.manual_seed(0)
    return cfg, Decoder(cfg.model)


BANDED = ["model.mixer=boltzmann", "model.mixer_options.boltzmann.couplings=distance",
          "model.mixer_options.boltzmann.inference=banded"]


def test_the_cost_estimate_is_printed_above_the_threshold_only():
    from attnlab.step_cost import EXPENSIVE_X_SOFTMAX, StepCost, cost_report

    assert cost_report(StepCost(5.0, EXPENSIVE_X_SOFTMAX), 100, []) is None
    report = cost_report(StepCost(5.0, 1.01 * EXPENSIVE_X_SOFTMAX), 1200, ["boltzmann: use band=2"])
    assert "1200 steps x 5 s = about 100 min" in report and report.endswith("\n  boltzmann: use band=2")


@pytest.mark.parametrize("seconds, printed", [({"model": 0.4, "softmax": 0.01}, True),
                                              ({"model": 0.02, "softmax": 0.01}, False)])
def test_training_logs_the_estimate_and_the_mixer_advice_for_an_expensive_configuration(monkeypatch, seconds, printed):
    from attnlab import step_cost

    monkeypatch.setattr(step_cost, "probe_seconds", lambda *args, **kwargs: seconds)
    cfg, model = tiny_run(BANDED)
    lines = []
    estimate = step_cost.warn_if_expensive(model, cfg, torch.device("cpu"), lines.append)
    assert estimate.seconds == seconds["model"] * 4 and estimate.x_softmax == seconds["model"] / seconds["softmax"]
    assert bool(lines) == printed
    if printed:
        assert f"{cfg.train.steps} steps x 1.6 s" in lines[0]
        assert "band=2 window=16" in lines[0] and "model.mixer_options.boltzmann.<field>" in lines[0]


def test_the_probe_finds_long_banded_chains_expensive_and_leaves_the_run_unchanged():
    from attnlab import step_cost

    cfg, model = tiny_run([*BANDED, "model.mixer_options.boltzmann.band=10", "model.mixer_options.boltzmann.window=32"])
    rng = torch.get_rng_state()
    estimate = step_cost.estimate_step_cost(model, cfg, torch.device("cpu"))
    assert estimate.x_softmax > step_cost.EXPENSIVE_X_SOFTMAX
    assert torch.equal(torch.get_rng_state(), rng) and all(p.grad is None for p in model.parameters())
    softmax_cfg, softmax_model = tiny_run(["model.mixer=softmax"])
    assert step_cost.estimate_step_cost(softmax_model, softmax_cfg, torch.device("cpu")) is None  # nothing to compare


def test_unnormalised_fields_weigh_each_value_by_sigmoid_of_twice_its_score():
    mixer = make(mode="h-only", normalise=False)
    x = torch.randn(2, 7, D_MODEL, dtype=torch.float64)
    q, k = heads(mixer, x)
    alpha = torch.sigmoid(2 * q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5)).tril()
    torch.testing.assert_close(attention_weights(mixer, x), alpha, rtol=0, atol=1e-12)
    j_only = attention_weights(make(mode="j-only", j_init_std=1.0, normalise=False), x)
    torch.testing.assert_close(j_only[0, 0], torch.full((7, 7), 0.5, dtype=torch.float64).tril(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("inference", ["banded", "mean-field", "dqa"])
def test_unnormalised_weights_are_the_marginals_in_every_inference(inference):
    """Each inference's weights without the normalisation, times their sum with it, are the normalised ones: the
    same marginals, and they are the marginals themselves (the banded chain with every pair in its band is
    exact, so its unnormalised weights are also compared with brute-force marginals)."""
    options = dict(couplings="distance", window=8, inference=inference, band=7, dqa_shots=0, dqa_steps=20,
                   j_init_std=0.3)
    normalised, raw = make(**options), make(**options, normalise=False)
    raw.load_state_dict(normalised.state_dict())
    x = torch.randn(2, 6, D_MODEL, dtype=torch.float64)
    w, alpha = attention_weights(normalised, x), attention_weights(raw, x)
    torch.testing.assert_close(alpha / alpha.sum(-1, keepdim=True), w, rtol=0, atol=1e-10)
    assert (alpha.sum(-1) - 1).abs().max() > 0.1  # not normalised
    if inference == "banded":
        from attnlab.ops import ising

        q, k = heads(raw, x)
        h = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        J = raw.coupling_matrix(6)
        spins = ising.configurations(6, dtype=torch.float64)
        for i in range(6):  # query i's model: spins 0..i with their fields and couplings
            s = spins[:, : i + 1].unique(dim=0)
            energy = (h[0, :, i, : i + 1] @ s.T) + torch.einsum("ca,hab,cb->hc", s, J[:, : i + 1, : i + 1].triu(1), s)
            p = torch.softmax(energy, dim=-1) @ ((s + 1) / 2)
            torch.testing.assert_close(alpha[0, :, i, : i + 1], p, rtol=0, atol=1e-10)


@pytest.mark.parametrize("options, message", [
    ({"normalise": False}, "normalise=false needs each key's own marginal"),
    ({"normalise": False, "mode": "j-only", "bias_field": True}, "normalise=false needs each key's own marginal"),
    ({"normalise": False, "mode": "h-only", "backend": "flex"}, "backend=flex runs a softmax"),
])
def test_unnormalised_weights_refuse_forms_that_give_them_up_to_a_constant(options, message):
    with pytest.raises(ConfigError, match=message):
        build_mixer("boltzmann", d_model=D_MODEL, n_heads=N_HEADS, **options)
