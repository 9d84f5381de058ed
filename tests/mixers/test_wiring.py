"""The wiring of every registered mixer, pinned against an explicit composition of its pieces.

Each `expect_*` function below recomputes a mixer's forward by hand from the mixer's own weight tensors:
the projections as plain matrix products, the recurrence or attention map from the loop/reference form in
`attnlab.ops` (or written out where it is short: the q/k integrators, the Ising marginals), and the output
projection. Nothing else of the mixer is called, so a mixer that calls its ops in the wrong order, feeds one
the wrong tensor or passes an option the wrong way round no longer matches.

Such a bug often hides at the initial parameters (a weight that starts at zero, a gate that starts at one,
an option whose default makes two orders agree) and in fp32 noise. So every learned parameter is moved away
from its initial value by noise, the options that change the computation are set away from their defaults,
and everything runs in fp64 with tight tolerances. The functions double as documentation of the wiring.
"""

import itertools
import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F

from attnlab.mixers import build_mixer, list_mixers, mixer_class
from attnlab.ops.ccq import ccq_reference
from attnlab.ops.delta_rule import delta_rule_reference
from attnlab.ops.gla import gla_reference
from attnlab.ops.interdomain import interdomain_reference
from attnlab.ops.s4d import s4d_reference

D_MODEL, N_HEADS = 32, 4
NOISE = 0.3  # added to every parameter: large next to the weights' own scale, so no parameter keeps its init
TOL = {"rtol": 1e-11, "atol": 1e-11}  # the compositions agree to ~1e-14 in fp64


def build(name, **options):
    """The mixer in fp64 with every learned parameter moved away from its initial value by Gaussian noise."""
    torch.manual_seed(0)
    mixer = build_mixer(name, d_model=D_MODEL, n_heads=N_HEADS, **options).double()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in mixer.parameters():
            p.add_(NOISE * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return mixer


# ------------------------------------------------------------------------------------------------------
# small pieces written out


def heads(t):
    """[B, T, H * D] -> [B, H, T, D]."""
    return t.unflatten(-1, (N_HEADS, -1)).transpose(1, 2)


def merge(t):
    """[B, H, T, D] -> [B, T, H * D]."""
    return t.transpose(1, 2).flatten(2)


def linear(x, layer):
    """x W^T (+ b): an nn.Linear by hand, from its tensors."""
    return x @ layer.weight.T + (0 if layer.bias is None else layer.bias)


def rope(x, base):
    """Rotate-half RoPE at positions 0..T-1: channel pair (i, i + D/2) turns by position * base^(-2i/D).
    The frequencies are rounded through fp32, as the mixers store them."""
    D = x.shape[-1]
    inv_freq = (base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)).float().double()
    angles = torch.arange(x.shape[-2], dtype=torch.float64)[:, None] * inv_freq
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * angles.cos() - x2 * angles.sin(), x1 * angles.sin() + x2 * angles.cos()), dim=-1)


def rms_norm(x, weight, eps):
    return x / torch.sqrt(x.square().mean(-1, keepdim=True) + eps) * weight


def short_conv(x, weight):
    """Depthwise causal conv then SiLU: y_t = silu(sum_j w[:, j] x_{t - K + 1 + j}), x [B, T, C], w [C, 1, K]."""
    K, T = weight.shape[-1], x.shape[1]
    padded = F.pad(x, (0, 0, K - 1, 0))
    return F.silu(sum(padded[:, j : j + T] * weight[:, 0, j] for j in range(K)))


def causal(T):
    return torch.ones(T, T, dtype=torch.bool).tril()


def attention_qkv(m, x):
    """q, k, v heads from the fused projection (rows: all query heads, then all keys, then all values)."""
    return (heads(t) for t in linear(x, m.qkv).chunk(3, dim=-1))


def softmax_map(q, k):
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return scores.masked_fill(~causal(q.shape[-2]), float("-inf")).softmax(-1)


# ------------------------------------------------------------------------------------------------------
# attention mixers


def expect_softmax(m, x):
    q, k, v = attention_qkv(m, x)
    q, k = rope(q, m.cfg.rope_base), rope(k, m.cfg.rope_base)
    return linear(gated(m, x, merge(softmax_map(q, k) @ v)), m.out_proj)


def expect_nonlinear_q(m, x):
    """q = x + W_2 gelu(W_1 x + b_1) + b_2 split into heads; k and v from one projection."""
    q = heads(x + linear(F.gelu(linear(x, m.query_in)), m.query_out))
    k, v = (heads(t) for t in linear(x, m.kv).chunk(2, dim=-1))
    q, k = rope(q, m.cfg.rope_base), rope(k, m.cfg.rope_base)
    return linear(merge(softmax_map(q, k) @ v), m.out_proj)


def gated(m, x, o):
    """o * sigmoid(W_g x) where the mixer has an output gate."""
    return o if m.gate is None else o * torch.sigmoid(linear(x, m.gate))


def expect_sigmoid(m, x):
    q, k, v = attention_qkv(m, x)
    q, k = rope(q, m.cfg.rope_base), rope(k, m.cfg.rope_base)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + m.cfg.bias
    return linear(merge((torch.sigmoid(scores) * causal(x.shape[1])) @ v), m.out_proj)


def expect_stick_breaking(m, x):
    """Key j < i gets beta_ij prod_{j < l < i} (1 - beta_il) of query i, from the definition's products; with
    attend_current, key j <= i gets beta_ij prod_{j < l <= i} (1 - beta_il): the query's own key breaks first."""
    q, k, v = attention_qkv(m, x)  # no position encoding, as the paper has it
    beta = torch.sigmoid(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]))
    weights = torch.zeros_like(beta)
    for i in range(x.shape[1]):
        last = i + 1 if m.cfg.attend_current else i  # one past the nearest key the query sees
        for j in range(last):
            weights[..., i, j] = beta[..., i, j] * torch.prod(1 - beta[..., i, j + 1 : last], dim=-1)
    return linear(merge(weights @ v), m.out_proj)


def differential_heads(m, q, k, v):
    """Heads 2i and 2i+1 form differential head i: (A_2i - lambda A_2i+1) [v_2i, v_2i+1], RMSNorm, (1 - lambda_init)."""
    lambda_init = 0.8 - 0.6 * math.exp(-0.3 * m.cfg.layer_idx)
    lam = torch.exp(m.lambda_q1 @ m.lambda_k1) - torch.exp(m.lambda_q2 @ m.lambda_k2) + lambda_init
    pairs = []
    for i in range(N_HEADS // 2):
        a = softmax_map(q[:, 2 * i], k[:, 2 * i]) - lam * softmax_map(q[:, 2 * i + 1], k[:, 2 * i + 1])
        o = a @ torch.cat((v[:, 2 * i], v[:, 2 * i + 1]), dim=-1)
        pairs.append(rms_norm(o, m.head_norm.weight, m.cfg.norm_eps) * (1 - lambda_init))
    return torch.stack(pairs, dim=1)


def expect_differential(m, x):
    q, k, v = attention_qkv(m, x)
    q, k = rope(q, m.cfg.rope_base), rope(k, m.cfg.rope_base)
    return linear(gated(m, x, merge(differential_heads(m, q, k, v))), m.out_proj)


def couple(m, q, k, integrator):
    """The pre-scoring dynamics with force f(x) = W_out silu(W_in x) (shared, or one per head) and dt per head;
    or affine coupling layers whose nets W_out silu(W_in x) give (s, t), scaling by exp(tanh s)."""
    c = m.coupling
    if integrator == "affine":
        D = q.shape[-1]
        for step in range(m.cfg.steps):
            (w_in_k, w_in_q), (w_out_k, w_out_q) = c.w_in[step], c.w_out[step]
            st = F.silu(q @ w_in_k.T) @ w_out_k.T
            k = k * torch.exp(torch.tanh(st[..., :D])) + st[..., D:]
            st = F.silu(k @ w_in_q.T) @ w_out_q.T
            q = q * torch.exp(torch.tanh(st[..., :D])) + st[..., D:]
        return q, k
    dt = F.softplus(c.dt_raw)  # [H, 1, 1]

    def f(x):
        if c.w_in.ndim == 2:
            return F.silu(x @ c.w_in.T) @ c.w_out.T
        return torch.einsum("bhte,hde->bhtd", F.silu(torch.einsum("bhtd,hed->bhte", x, c.w_in)), c.w_out)

    for _ in range(m.cfg.steps):
        if integrator == "euler":
            q, k = q + dt * k, k + dt * f(q)
        elif integrator == "leapfrog":
            k = k + dt / 2 * f(q)
            q = q + dt * k
            k = k + dt / 2 * f(q)
        else:  # uncoupled
            q, k = q + dt * f(q), k + dt * f(k)
    return q, k


def expect_coupled(integrator, differential=False):
    """Coupling on the split heads, then RoPE, then the wrapped attention's scoring."""

    def expect(m, x):
        q, k, v = attention_qkv(m, x)
        q, k = couple(m, q, k, integrator)
        q, k = rope(q, m.cfg.rope_base), rope(k, m.cfg.rope_base)
        o = differential_heads(m, q, k, v) if differential else softmax_map(q, k) @ v
        return linear(merge(o), m.out_proj)

    return expect


# ------------------------------------------------------------------------------------------------------
# Boltzmann attention


def strict_upper(n, dims):
    """Boolean mask of the index tuples j < k (< l) of an [n]*dims tensor."""
    idx = torch.arange(n)
    if dims == 2:
        return idx[:, None] < idx[None, :]
    return (idx[:, None, None] < idx[None, :, None]) & (idx[None, :, None] < idx[None, None, :])


def exact_marginals(h, J, K=None):
    """P(s_j = +1) by enumerating every configuration: h [B, H, n], J [H, n, n], K [H, n, n, n] (upper parts)."""
    n = h.shape[-1]
    s = torch.tensor(list(itertools.product([-1.0, 1.0], repeat=n)), dtype=h.dtype)  # [2^n, n]
    neg_energy = h @ s.T + torch.einsum("cj,hjk,ck->hc", s, J * strict_upper(n, 2), s)
    if K is not None:
        neg_energy = neg_energy + torch.einsum("cj,ck,cl,hjkl->hc", s, s, s, K * strict_upper(n, 3))
    return neg_energy.softmax(-1) @ ((s + 1) / 2)


def mean_field_marginals(h, J, iterations, damping):
    """Naive mean field from m = tanh(h): phi = h + J_sym m, m <- (1 - damping) m + damping tanh(phi).
    Returns the marginals sigmoid(2 phi)."""
    J_sym = J.triu(1) + J.triu(1).transpose(-1, -2)
    m = torch.tanh(h)
    for _ in range(iterations):
        phi = h + torch.einsum("hjk,bhk->bhj", J_sym, m)
        m = (1 - damping) * m + damping * torch.tanh(phi)
    return torch.sigmoid(2 * phi)


def distance_couplings(m, n):
    """J_jk = J_dist[k - j - 1] for 1 <= k - j <= window - 1, else 0: [H, n, n]."""
    offset = torch.arange(n)[None, :] - torch.arange(n)[:, None]
    table = torch.cat((torch.zeros(N_HEADS, 1, dtype=m.J.dtype), m.J), dim=-1)
    return table[:, torch.where((offset >= 1) & (offset < m.cfg.window), offset, 0)]


def expect_boltzmann(m, x):
    """Per query i: the Ising model of its visible keys lo..i (the last `window`), fields q_i . k_j / sqrt(D)
    (+ a bias per position), couplings J (and K) among them; o_i = sum_j alpha_j v_j / sum_j alpha_j."""
    cfg = m.cfg
    q, k, v = attention_qkv(m, x)
    q, k = rope(q, cfg.rope_base), rope(k, cfg.rope_base)
    T = x.shape[1]
    h = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if m.bias is not None:
        h = h + m.bias[:, None, :T]
    J = m.J[:, :T, :T] if cfg.couplings == "position" else distance_couplings(m, T)
    if cfg.inference == "banded":  # couplings past the band are dropped
        J = J * (torch.arange(T)[None, :] - torch.arange(T)[:, None] <= cfg.band)
    outputs = []
    for i in range(T):
        seen = slice(max(0, i - cfg.window + 1), i + 1)
        h_i, J_i = h[:, :, i, seen], J[:, seen, seen]
        if cfg.inference == "mean-field":
            alpha = mean_field_marginals(h_i, J_i, cfg.mean_field_iterations, cfg.mean_field_damping)
        else:  # exact and banded are both exact marginals
            alpha = exact_marginals(h_i, J_i, None if m.K is None else m.K[:, seen, seen, seen])
        weights = alpha / alpha.sum(-1, keepdim=True)
        outputs.append((weights[..., None, :] @ v[:, :, seen]).squeeze(-2))
    return linear(merge(torch.stack(outputs, dim=2)), m.out_proj)


# ------------------------------------------------------------------------------------------------------
# linear attention


def linear_qkv(m, x):
    """q, k, v projections, through the short conv (one conv over [q, k, v]) where the layer has one."""
    q, k, v = linear(x, m.q_proj), linear(x, m.k_proj), linear(x, m.v_proj)
    if m.conv is not None:
        widths = [q.shape[-1], k.shape[-1], v.shape[-1]]
        q, k, v = short_conv(torch.cat((q, k, v), dim=-1), m.conv.conv.weight).split(widths, dim=-1)
    return heads(q), heads(k), heads(v)


def linear_output(m, x, o):
    """Per-head RMSNorm gated by swish(W_g x), then the output projection."""
    return linear(merge(rms_norm(o, m.out_norm.weight, m.cfg.norm_eps) * F.silu(heads(linear(x, m.gate_proj)))),
                  m.out_proj)


def ccq_query(m, q, k, log_decay):
    """q - lambda Sigma q (the ridge read: (I + lambda Sigma)^-1 q, by an explicit inverse) with
    lambda = sigmoid(w . q_bar + b) and Sigma from the normalised keys k_bar."""
    q_bar, k_bar = F.normalize(q, dim=-1, eps=1e-6), F.normalize(k, dim=-1, eps=1e-6)
    lam = torch.sigmoid((q_bar * m.lambda_weight[:, None]).sum(-1) + m.lambda_bias[:, None])
    if not m.cfg.ccq_decay:
        log_decay = None
    elif log_decay.ndim == 4:  # GLA's per-channel decay: its mean ages the statistics
        log_decay = log_decay.mean(-1)
    if m.cfg.read == "ridge":
        return ridge_query(q, k_bar, lam, log_decay)
    return ccq_reference(q, k_bar, lam, None, log_decay)[0]


def ridge_query(q, k_bar, lam, log_decay):
    """(I + lambda_t Sigma_t)^-1 q_t, Sigma_t the (decayed) covariance of k_bar_1..t, from explicit sums."""
    T, D = q.shape[2], q.shape[-1]
    g = torch.zeros(q.shape[:3], dtype=q.dtype) if log_decay is None else log_decay
    out = torch.empty_like(q)
    for t in range(T):
        w = torch.stack([g[:, :, j + 1 : t + 1].sum(-1) for j in range(t + 1)], -1).exp()  # [B, H, t+1]
        keys = k_bar[:, :, : t + 1]
        n, m = w.sum(-1), (w[..., None] * keys).sum(2)
        second = torch.einsum("bhj,bhjd,bhje->bhde", w, keys, keys)
        sigma = second / n[..., None, None] - m[..., :, None] * m[..., None, :] / n[..., None, None] ** 2
        out[:, :, t] = (torch.linalg.inv(torch.eye(D, dtype=q.dtype) + lam[:, :, t, None, None] * sigma)
                        @ q[:, :, t, :, None])[..., 0]
    return out


def expect_gla(m, x, plain=False, ccq=False):
    """GLA: g = logsigmoid(W2 W1 x + b2) / gate_normalizer per key channel (0 for plain linear attention)."""
    q, k, v = linear_qkv(m, x)
    if plain:
        g = torch.zeros_like(q)
    else:
        g = heads(F.logsigmoid(linear(linear(x, m.forget_gate[0]), m.forget_gate[1])) / m.cfg.gate_normalizer)
    if ccq:
        q = ccq_query(m, q, k, g)  # the read changes; the write keys stay raw
    o, memory = gla_reference(q, k, v, g)
    return linear_output(m, x, o), memory


def expect_gdn(m, x, ccq=False):
    """Gated DeltaNet: normalised q, k; g = -exp(A_log) softplus(W_a x + dt_bias); beta = sigmoid(W_b x)."""
    q, k, v = linear_qkv(m, x)
    q, k = F.normalize(q, dim=-1, eps=1e-6), F.normalize(k, dim=-1, eps=1e-6)
    g = (-m.A_log.exp() * F.softplus(linear(x, m.decay_proj) + m.dt_bias)).transpose(1, 2)
    beta = torch.sigmoid(linear(x, m.beta_proj)).transpose(1, 2)
    if ccq:
        q = ccq_query(m, q, k, g)
    o, memory = delta_rule_reference(q, k, v, g, beta)
    return linear_output(m, x, o), memory


# ------------------------------------------------------------------------------------------------------
# Interdomain attention and S4D


def head_norm(x, norm, eps):
    return rms_norm(x, norm.weight, eps) + norm.bias


def expect_interdomain(m, x, corner: dict | None = None):
    """z = [key half ; value half] through one S4D recurrence per head, read by xi(q) (or a learned contraction).

    Key half: k (dual input: conv, RoPE, L2-normalised) or a (single: conv, RoPE); value half: v unconvolved
    (dual) or b convolved (single); both through their head norms. The conv runs over [q, key half, (b)].
    """
    cfg = m.cfg
    query, inputs = (corner["query"], corner["input"]) if corner else (cfg.query, cfg.input)
    conditioned, dual = query == "conditioned", inputs == "dual"
    streams = ([linear(x, m.q_proj)] if conditioned else []) + [linear(x, m.k_proj)]
    streams += [] if dual else [linear(x, m.v_proj)]
    convolved = [heads(t) for t in short_conv(torch.cat(streams, -1), m.conv.conv.weight).split(D_MODEL, -1)]
    q = convolved.pop(0) if conditioned else None
    key_half = convolved.pop(0)
    value_half = heads(linear(x, m.v_proj)) if dual else convolved.pop(0)
    if cfg.rope:
        key_half = rope(key_half, cfg.rope_base)
        q = None if q is None else rope(q, cfg.rope_base)
    if dual:
        key_half = F.normalize(key_half, dim=-1, eps=cfg.norm_eps)
    z = torch.cat((head_norm(key_half, m.key_norm, cfg.norm_eps), head_norm(value_half, m.value_norm, cfg.norm_eps)),
                  dim=-1)

    A = torch.complex(-m.log_A_real.exp(), m.A_imag)
    dt = m.log_dt.exp()[:, None]
    if cfg.discretization == "zoh":
        lam = torch.exp(dt * A)
        B_bar = (lam - 1) / A
    else:  # bilinear
        lam = (1 + dt * A / 2) / (1 - dt * A / 2)
        B_bar = dt / (1 - dt * A / 2)
    C = torch.view_as_complex(m.C)
    if conditioned:
        xi_q = F.normalize(q, dim=-1, eps=cfg.norm_eps)
        if cfg.normalize:
            z = torch.cat((z, torch.ones_like(z[..., :1])), -1)
        o, memory = interdomain_reference(xi_q, z, lam, B_bar, C, cfg.readout)
        if cfg.normalize:
            o = o[..., :-1] / (o[..., -1:] + cfg.normalize_eps)
    else:
        c = torch.einsum("hm,hmn->hn", m.contraction.to(C.dtype), C)
        o, memory = s4d_reference(z, c, lam, B_bar)
    y = merge(o)
    if cfg.gate:
        y = F.silu(linear(x, m.gate_proj)) * y
    return linear(y, m.out_proj), memory


def expect_s4d(m, x):
    """S4D-only: the corner of the interdomain composition with generic inputs [a, b] and a learned contraction."""
    return expect_interdomain(m, x, corner={"query": "linear", "input": "single"})


# ------------------------------------------------------------------------------------------------------
# the cases: every registered mixer, with options away from their defaults where they change the computation

BOLTZMANN = {"j_init_std": 0.3}  # exact inference needs window >= the 11 positions of the input
CASES = [
    ("softmax", {"rope_base": 500.0}, expect_softmax),
    ("softmax", {"output_gate": True}, expect_softmax),
    ("nonlinear-q", {"hidden_ratio": 0.25, "rope_base": 700.0}, expect_nonlinear_q),
    ("sigmoid", {"bias": -1.3, "rope_base": 500.0}, expect_sigmoid),
    ("stick-breaking", {}, expect_stick_breaking),
    ("stick-breaking", {"attend_current": True}, expect_stick_breaking),
    ("differential", {"layer_idx": 3, "norm_eps": 1e-3}, expect_differential),
    ("differential", {"output_gate": True}, expect_differential),
    ("coupled-qk", {"steps": 2, "dt_init": 0.5}, expect_coupled("euler")),
    ("coupled-qk", {"integrator": "leapfrog", "steps": 3, "dt_init": 0.5, "per_head_mlp": True},
     expect_coupled("leapfrog")),
    ("uncoupled-qk", {"steps": 2, "dt_init": 0.5}, expect_coupled("uncoupled")),
    ("coupled-qk", {"integrator": "affine", "steps": 2}, expect_coupled("affine")),
    ("coupled-differential", {"integrator": "affine", "steps": 1, "layer_idx": 1},
     expect_coupled("affine", differential=True)),
    ("coupled-differential", {"integrator": "leapfrog", "steps": 2, "dt_init": 0.5, "layer_idx": 2},
     expect_coupled("leapfrog", differential=True)),
    ("boltzmann", {**BOLTZMANN, "window": 12, "bias_field": True}, expect_boltzmann),
    ("boltzmann", {**BOLTZMANN, "window": 12, "mode": "h+J+K"}, expect_boltzmann),
    ("boltzmann", {**BOLTZMANN, "window": 12, "inference": "mean-field", "mean_field_damping": 0.3,
                   "mean_field_iterations": 7}, expect_boltzmann),
    ("boltzmann", {**BOLTZMANN, "window": 5, "couplings": "distance", "inference": "mean-field",
                   "mean_field_damping": 0.8, "mean_field_iterations": 5}, expect_boltzmann),
    ("boltzmann", {**BOLTZMANN, "window": 6, "couplings": "distance", "inference": "banded", "band": 2},
     expect_boltzmann),
    ("linear", {"chunk_size": 4}, partial(expect_gla, plain=True)),
    ("linear", {"chunk_size": 4, "short_conv": True, "conv_size": 3, "expand_k": 0.75},
     partial(expect_gla, plain=True)),
    ("gla", {"chunk_size": 4, "gate_normalizer": 4.0, "gate_rank": 5}, expect_gla),
    ("gdn", {"chunk_size": 4, "conv_size": 3}, expect_gdn),
    ("ccq-gla", {"chunk_size": 4, "gate_normalizer": 4.0}, partial(expect_gla, ccq=True)),
    ("ccq-gla", {"chunk_size": 4, "ccq_decay": True, "short_conv": True}, partial(expect_gla, ccq=True)),
    ("ccq-gdn", {"chunk_size": 4}, partial(expect_gdn, ccq=True)),
    ("ccq-gdn", {"chunk_size": 4, "ccq_decay": True, "ccq_lambda_init": 0.6}, partial(expect_gdn, ccq=True)),
    ("ccq-gla", {"chunk_size": 4, "read": "ridge", "ccq_lambda_init": 0.7}, partial(expect_gla, ccq=True)),
    ("ccq-gdn", {"chunk_size": 4, "read": "ridge", "ccq_decay": True, "ccq_lambda_init": 0.6},
     partial(expect_gdn, ccq=True)),
    ("interdomain", {"modes": 8, "chunk_size": 4, "rope_base": 300.0}, expect_interdomain),
    ("interdomain", {"modes": 8, "form": "fft", "readout": "hermitian", "discretization": "bilinear", "gate": True,
                     "normalize": True, "norm_eps": 1e-3}, expect_interdomain),
    ("interdomain", {"modes": 8, "chunk_size": 5, "input": "single", "readout": "bilinear"}, expect_interdomain),
    ("interdomain", {"modes": 8, "query": "linear", "gate": True}, expect_interdomain),
    ("s4d", {"modes": 8}, expect_s4d),
    ("s4d", {"modes": 8, "discretization": "bilinear", "rope": True}, expect_s4d),
]
CASE_IDS = [name + "".join(f"-{k}={v}" for k, v in options.items()) for name, options, _ in CASES]


@pytest.mark.parametrize("name, options, expect", CASES, ids=CASE_IDS)
def test_forward_matches_explicit_composition(name, options, expect):
    """The mixer's output (and, for the recurrent ones, its carried memory) equals the hand composition."""
    mixer = build(name, **options)
    x = torch.randn(2, 11, D_MODEL, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    y, state = mixer(x)
    with torch.no_grad():
        expected = expect(mixer, x)
    if isinstance(expected, tuple):
        expected, memory = expected
        torch.testing.assert_close(state.memory, memory, **TOL)
    torch.testing.assert_close(y, expected, **TOL)


def test_every_registered_mixer_is_pinned():
    """A new built-in mixer needs its explicit composition here: its wiring is otherwise checked by nothing.
    (Mixers registered from outside attnlab, such as the example the tests import, are their authors' to pin.)"""
    built_in = [name for name in list_mixers() if mixer_class(name).__module__.startswith("attnlab.")]
    assert sorted({name for name, _, _ in CASES}) == built_in


def test_cases_leave_the_initial_values_and_defaults_that_hide_bugs():
    """A wrong wiring can agree with the right one at the initial parameters (CCQ's lambda weights start at zero,
    norm gains at one) or at a default option (mean-field damping 0.5 weighs the old and new magnetisations
    alike). Every parameter of every case differs from its initial value, and no mean-field case uses 0.5."""
    for name, options, _ in CASES:
        torch.manual_seed(0)
        initial = build_mixer(name, d_model=D_MODEL, n_heads=N_HEADS, **options).double()
        moved = build(name, **options)
        for (pname, p0), p in zip(initial.named_parameters(), moved.parameters(), strict=True):
            assert (p != p0).all(), f"{name}: {pname} keeps (part of) its initial value"
    dampings = [options.get("mean_field_damping", 0.5) for _, options, _ in CASES
                if options.get("inference") == "mean-field"]
    assert dampings and 0.5 not in dampings
