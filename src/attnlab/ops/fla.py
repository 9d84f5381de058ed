"""The chunkwise forms on flash-linear-attention's Triton kernels (the optional `fla` extra).

Each function has the contract of its torch counterpart (`gla_chunk`, `delta_rule_chunk`, `ccq_chunk`,
`interdomain_chunk`, and `gla_chunk` with g = 0 for `linear_fla`): tensors [B, H, T, D], states
[B, H, D_k, D_v] in fp32, outputs in the input's dtype. The states come out in our layout, so the
single-token steps continue from them. fla itself works in [B, T, H, D]; the transposes here are the only glue.

q, k, v may be bf16 (fla's intended use under autocast): the kernels accumulate in fp32, and decays
and states are kept in fp32. Inputs wider than fp32 are computed in fp32, the widest the kernels take;
on a GPU, Triton's fp32 dot products round their operands to TF32 (about 1e-3 relative).
Lengths need not be multiples of the chunk: the kernels mask the last, partial chunk.

cu_seqlens (packed sequences, B = 1, fla's own convention): each sequence starts from a fresh state, and the
final states come one per sequence, [N_seq, H, D_k, D_v].
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
from pathlib import Path

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from .ccq import CCQStats, split_read
from .cp import split
from .interdomain import as_real, beta_map, conjugate_real, rotate
from .packing import autocast_off

INSTALL_HINT = "pip install 'attnlab[fla]'"


@functools.cache
def available() -> bool:
    """Whether flash-linear-attention imports (it needs triton)."""
    try:
        import fla.ops  # noqa: F401
    except ImportError:
        return False
    return True


def installed() -> dict:
    """The versions of fla and Triton installed here (None where missing) and whether fla's TileLang backend
    can run: tilelang, and nvcc, which TileLang compiles its kernels with (without it the route fails at the
    first backward, so it is no fix for the Hopper bug)."""
    from importlib import metadata

    def version(package):
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    fla = version("fla-core") or version("flash-linear-attention")
    tilelang = False
    if (fla is not None and importlib.util.find_spec("tilelang") is not None and nvcc() is not None
            and available()):
        try:
            from fla.ops.common.backends.tilelang import CommonTileLangBackend
            tilelang = CommonTileLangBackend.can_use()
        except ImportError:
            pass
    return {"fla": fla, "triton": version("triton"), "tilelang": tilelang}


def nvcc() -> str | None:
    """The path of CUDA's compiler: on the PATH, or under CUDA_HOME / CUDA_PATH; None where there is none."""
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if home and Path(home, "bin", "nvcc").is_file():
            return str(Path(home, "bin", "nvcc"))
    return shutil.which("nvcc")


def machine() -> dict:
    """This machine's facts, which `mixers.backends` routes backend=auto by: a CUDA GPU, a Hopper one (compute
    capability 9), and `installed()`."""
    cuda = torch.cuda.is_available()
    return {"cuda": cuda, "hopper": cuda and torch.cuda.get_device_capability()[0] == 9, **installed()}


NEEDS_CUDA = "backend=fla runs flash-linear-attention's Triton kernels, which need a CUDA GPU"


def interpreted() -> bool:
    """Whether Triton interprets the kernels (TRITON_INTERPRET=1), which runs them on the CPU."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def require() -> None:
    """Raise a one-line ConfigError naming the fix when fla is missing or this machine has no CUDA GPU."""
    if not available():
        raise ConfigError(f"backend=fla needs flash-linear-attention, which is not installed: {INSTALL_HINT}")
    if not (torch.cuda.is_available() or interpreted()):
        raise ConfigError(f"{NEEDS_CUDA}, and this machine has none; use backend=torch or backend=auto")


def _kernels():
    """fla.ops, imported on first use: the package is optional and takes seconds to import."""
    require()
    import fla.ops

    return fla.ops


def _kernel_chunk(chunk_size: int) -> int:
    """fla's chunk kernels take 16, 32 or 64 tokens a chunk: the largest of these up to chunk_size. The chunk
    size changes speed and memory, not the result."""
    return max(16, min(64, 1 << (chunk_size.bit_length() - 1)))


def _check_device(x: torch.Tensor) -> None:
    if not (x.is_cuda or interpreted()):
        raise ConfigError(f"{NEEDS_CUDA}, and this model runs on {x.device}; use backend=torch or backend=auto")


def _time_major(q, k, v, *gates):
    """[B, H, T, ...] -> fla's [B, T, H, ...]: q, k, v in a dtype the kernels take (fp64 becomes fp32), the
    gates (log-decays, beta) in fp32; a gate that is None stays None."""
    _check_device(q)
    dtype = q.dtype if q.dtype in (torch.bfloat16, torch.float16, torch.float32) else torch.float32
    return [x.transpose(1, 2).to(dtype) for x in (q, k, v)] + [
        None if x is None else x.transpose(1, 2).float() for x in gates]


def _state(initial_state: torch.Tensor | None) -> torch.Tensor | None:
    return None if initial_state is None else initial_state.float()


def _scale(q: torch.Tensor, scale: float | None) -> float:
    return q.shape[-1] ** -0.5 if scale is None else scale


@autocast_off
def gla_fla(q, k, v, g, scale=None, initial_state=None, chunk_size: int = 64, cu_seqlens=None, context=None):
    """`gla_chunk` on fla's chunk_gla: per-channel log-decays g [B, H, T, D_k]. chunk_size is accepted for
    the common signature only: the GLA kernel chooses its own chunk (16 to 64 tokens)."""
    if context is not None:
        return split(gla_fla, (q, k, v, g), context, cu_seqlens, scale=scale)
    o, h = _kernels().chunk_gla(*_time_major(q, k, v, g), scale=_scale(q, scale),
                                initial_state=_state(initial_state), output_final_state=True, cu_seqlens=cu_seqlens)
    return o.transpose(1, 2).to(v.dtype), h


def _simple_gla(q, k, v, g, scale, initial_state, chunk_size, cu_seqlens=None):
    """fla's chunk_simple_gla in our layout: h_t = exp(g_t) h_{t-1} + k_t v_t^T with scalar log-decays
    g [B, H, T] (None: no decay), o_t = h_t^T (scale q_t), and no normaliser."""
    q_, k_, v_, g_ = _time_major(q, k, v, g)
    o, h = _kernels().chunk_simple_gla(q_, k_, v_, g=g_, scale=_scale(q, scale), initial_state=_state(initial_state),
                                       output_final_state=True, chunk_size=_kernel_chunk(chunk_size),
                                       cu_seqlens=cu_seqlens)
    return o.transpose(1, 2).to(v.dtype), h


@autocast_off
def linear_fla(q, k, v, scale=None, initial_state=None, chunk_size: int = 64, cu_seqlens=None, context=None):
    """Plain linear attention, `gla_chunk` with g = 0: h_t = h_{t-1} + k_t v_t^T, o_t = h_t^T (scale q_t).
    fla's chunk_simple_gla without gates; not chunk_linear_attn, which divides by q . sum k by default."""
    if context is not None:
        return split(linear_fla, (q, k, v), context, cu_seqlens, scale=scale, chunk_size=chunk_size)
    return _simple_gla(q, k, v, None, scale, initial_state, chunk_size, cu_seqlens)


@autocast_off
def delta_rule_fla(q, k, v, g, beta, scale=None, initial_state=None, chunk_size: int = 64, cu_seqlens=None,
                   context=None):
    """`delta_rule_chunk` on fla's chunk_gated_delta_rule: scalar log-decays g and write strengths beta
    [B, H, T]. k is used as given (the mixers L2-normalise it), so the kernel's own normalisation stays off."""
    if context is not None:
        return split(delta_rule_fla, (q, k, v, g, beta), context, cu_seqlens, scale=scale,
                     chunk_size=chunk_size)
    o, h = _kernels().chunk_gated_delta_rule(*_time_major(q, k, v, g, beta), scale=_scale(q, scale),
                                             initial_state=_state(initial_state), output_final_state=True,
                                             use_qk_l2norm_in_kernel=False, chunk_size=_kernel_chunk(chunk_size),
                                             cu_seqlens=cu_seqlens)
    return o.transpose(1, 2).to(v.dtype), h


@autocast_off
def ccq_fla(q, k, lam, stats: CCQStats | None = None, log_decay=None, chunk_size: int = 64, cu_seqlens=None,
            context=None):
    """`ccq_chunk` as one linear-attention kernel call. With keys and values x_t = [k_t, 1] (width D + 1) the
    state sum_{j<=t} x_j x_j^T is [[P_t, m_t], [m_t^T, n_t]]: read with [q_t, 0] it gives [P_t q_t, m_t . q_t],
    read with [0, 1] it gives [m_t, n_t]. So 2H heads (the same keys, two queries), scale 1, and
        Sigma_t q_t = P_t q_t / n_t - m_t (m_t . q_t) / n_t^2,    q_clean = q_t - lambda_t Sigma_t q_t.
    log_decay [B, H, T] ages the whole state (P, m and n alike), as in `ccq_chunk`. Everything runs in
    fp32: Sigma q is a difference of two terms that grow with the length."""
    if context is not None:
        return split_read(ccq_fla, q, k, lam, log_decay, context, cu_seqlens, chunk_size=chunk_size)
    B, H, T, D = q.shape
    stats = (stats or CCQStats.empty(B, H, D, q.device)).to(torch.float32)
    q32 = q.float()
    x = F.pad(k.float(), (0, 1), value=1.0)  # [k, 1]
    read_moments = F.pad(q32, (0, 1))  # [q, 0]
    read_sums = F.pad(torch.zeros_like(q32), (0, 1), value=1.0)  # [0, 1]
    # the kernel reads h^T q, so h holds P^T: equal in value (P is symmetric) but not in the gradient
    state = torch.cat((torch.cat((stats.second.transpose(-1, -2), stats.total[..., None]), -1),
                       torch.cat((stats.total, stats.count[..., None]), -1)[..., None, :]), -2)
    x, state = x.repeat(1, 2, 1, 1), state.repeat(1, 2, 1, 1)  # the same keys and state for both reads
    g = None if log_decay is None else log_decay.float().repeat(1, 2, 1)
    if cu_seqlens is not None:  # each packed sequence from empty statistics
        state = None
    o, state = _simple_gla(torch.cat((read_moments, read_sums), 1), x, x, g, 1.0, state, chunk_size, cu_seqlens)
    second_q, total_q = o[:, :H, :, :D], o[:, :H, :, D:]
    total, count = o[:, H:, :, :D], o[:, H:, :, D:]
    sigma_q = second_q / count - total * total_q / count**2
    q_clean = q32 - lam.float()[..., None] * sigma_q
    state = state[:, :H]
    return q_clean.to(q.dtype), CCQStats(state[..., :D, :D].transpose(-1, -2), state[..., :D, D], state[..., D, D])


KERNEL_CHUNK = 64  # the chunk of the value-gated read (fla's gated-slot-attention kernels are written for 64)


class _ValueGatedRead(torch.autograd.Function):
    """o_t[p] = sum_{s<=t} (q_t . k_s) exp(G_t[p] - G_s[p]) v_s[p] + sum_r q_t[r] exp(G_t[p]) h0[r, p], with G the
    running sum of the log-decays g [B, T, H, V]: linear attention whose decay acts on the value channels. fla
    has no public op for it: the first pass of its gated slot attention is this read, and its forward and
    backward (`chunk_gsa_fwd_k`, `chunk_gsa_bwd_k`, fla 0.6.0) are called here as fla's own autograd function
    calls them. Returns (o [B, T, H, V], the final states [N, H, K, V] in fp32)."""

    @staticmethod
    def forward(ctx, q, k, v, g, h0, cu_seqlens):
        from fla.ops.gsa.chunk_fwd import chunk_gsa_fwd_k
        from fla.ops.utils import chunk_local_cumsum, prepare_chunk_indices
        from fla.ops.utils.constant import RCP_LN2

        indices = None if cu_seqlens is None else prepare_chunk_indices(cu_seqlens, KERNEL_CHUNK)
        # the kernels take G within each chunk, in base 2
        G = chunk_local_cumsum(g, chunk_size=KERNEL_CHUNK, scale=RCP_LN2, cu_seqlens=cu_seqlens, chunk_indices=indices)
        h, final, o = chunk_gsa_fwd_k(q, k, v, G, h0=h0, output_final_state=True, scale=1.0, cu_seqlens=cu_seqlens,
                                      chunk_size=KERNEL_CHUNK, chunk_indices=indices)
        ctx.save_for_backward(q, k, v, G, h0, h, o)
        ctx.cu_seqlens, ctx.indices = cu_seqlens, indices
        return o, final

    @staticmethod
    def backward(ctx, do, dfinal):
        from fla.ops.gsa.chunk_bwd import chunk_gsa_bwd_k

        q, k, v, G, h0, h, o = ctx.saved_tensors
        dq, dk, dv, dg, dh0 = chunk_gsa_bwd_k(
            q, k, v, G, h, h0, o, do.contiguous(), None if dfinal is None else dfinal.contiguous(),
            dg=torch.zeros_like(G, dtype=torch.float32),  # the decays' gradient from elsewhere: none
            scale=1.0, cu_seqlens=ctx.cu_seqlens, chunk_size=KERNEL_CHUNK, chunk_indices=ctx.indices)
        return dq, dk, dv, dg, dh0, None


@autocast_off
def interdomain_fla(xi_q, z, lam, B_bar, C, readout="re_first", initial_state=None, chunk_size: int = 64,
                    cu_seqlens=None):
    """`interdomain_chunk` as two fla reads. With lambda = r e^{i theta} and rows counted from t = 0,
        X_t = e^{i theta t} S_t,   S_t = sum_{s<=t} r^(t-s) c_s z_s^T + r^(t+1) e^{i theta} X_0,
        c_s = B_bar e^{-i theta s}:
    a real decay r per mode, the rotation folded into features as RoPE folds it. On the 2M real channels
    kappa_s = [Re c_s ; Im c_s] (log-decays log r twice):
      1. y_t = X_t^k xi_t = e^{i theta t} (A_t + i D_t), where [A_t ; D_t] is a value-gated read with queries
         xi_t, keys k_s and values kappa_s (`_ValueGatedRead`);
      2. beta_t = C^T readout(C y_t) (`beta_map`), and o_t = Re(beta_t . X_t^v) = sum_s (w_t . kappa_s) r^(t-s) v_s
         with w_t = [Re beta'_t ; -Im beta'_t] and beta'_t = beta_t e^{i theta t}: fla's GLA with queries w,
         keys kappa and values v.
    Phases theta t are taken in fp64 (theta t reaches 1e4 radians and more). Everything runs in fp32, as in
    `interdomain_chunk`. chunk_size is accepted for the common signature; the kernels choose theirs.
    cu_seqlens (B = 1): each packed sequence from a zero state (initial_state is not used), and no state returned."""
    chunk_gla = _kernels().chunk_gla
    _check_device(z)
    B, H, T, _ = z.shape
    R, M = xi_q.shape[-1], lam.shape[-1]
    real = torch.float32  # the widest the kernels take
    log_lam = torch.log(lam)
    positions = torch.arange(T, device=z.device, dtype=torch.float64)
    phase = log_lam.imag.double()[..., None] * positions  # [H, M, T]
    turn = torch.polar(torch.ones_like(phase), phase).to(lam.dtype).transpose(-1, -2)  # e^{i theta t}: [H, T, M]
    kappa = as_real(B_bar[:, None] * turn.conj(), -1).to(real)  # [H, T, 2M]
    log_decay = log_lam.real.to(real).repeat(1, 2)[:, None]  # [H, 1, 2M]

    def fla_layout(x):  # [B or 1, H, T, D] -> [B, T, H, D], contiguous fp32
        return x.expand(B, H, T, x.shape[-1]).transpose(1, 2).to(real).contiguous()

    kappa_, g_ = fla_layout(kappa[None]), fla_layout(log_decay[None].expand(1, H, T, 2 * M))
    S0 = None
    if initial_state is not None and cu_seqlens is None:
        # e^{i theta} X_0 as [B, H, 2M, R + D]
        S0 = as_real(torch.exp(1j * log_lam.imag)[..., None] * initial_state, 2).to(real)
    A, S_keys = _ValueGatedRead.apply(fla_layout(xi_q), fla_layout(z[..., :R]), kappa_, g_,
                                      None if S0 is None else S0[..., :R].transpose(-1, -2).contiguous(), cu_seqlens)
    y = rotate(turn[None], A.transpose(1, 2))  # [B, H, T, 2M]
    beta = rotate(turn[None], torch.einsum("hpm,bhtm->bhtp", beta_map(C, readout).to(real), y))
    o, S_values = chunk_gla(fla_layout(conjugate_real(beta)), kappa_, fla_layout(z[..., R:]), g_, scale=1.0,
                            initial_state=None if S0 is None else S0[..., R:].contiguous(), output_final_state=True,
                            cu_seqlens=cu_seqlens)
    o = o.transpose(1, 2).to(z.dtype)
    if cu_seqlens is not None:
        return o, None
    S = torch.cat((S_keys.transpose(-1, -2), S_values), -1)  # [B, H, 2M, R + D]
    final = turn[:, -1, :, None] * torch.complex(*S.to(lam.real.dtype).chunk(2, dim=2))
    return o, final
