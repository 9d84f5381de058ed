"""The gated delta rule (Gated DeltaNet, Yang et al. 2025).

Per head, with state h [D_k, D_v], scalar log-decay g_t <= 0 and write strength beta_t in (0, 1) (or (0, 2),
where the transition's eigenvalue 1 - beta_t along k_t may be negative):
    h' = exp(g_t) h_{t-1};   u_t = beta_t (v_t - h'^T k_t);   h_t = h' + k_t u_t^T;   o_t = h_t^T (scale q_t)
i.e. S_t = exp(g_t) S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T in the layout S = h^T.
Shapes: q, k [B, H, T, D_k] (k normally L2-normalised); v [B, H, T, D_v]; g, beta [B, H, T];
states [B, H, D_k, D_v]. Forms: `delta_rule_reference` (loop over time in the S layout),
`delta_rule_chunk` (WY/UT form, training) and `delta_rule_step` (decoding).
"""

from __future__ import annotations

import torch

from .cp import split
from .packing import SequenceStarts, aligned, autocast_off, chunk_layout, decay_matrix, prepare_memory_inputs, to_chunks


@autocast_off
def delta_rule_reference(q, k, v, g, beta, scale=None, initial_state=None):
    """Loop over time with S = h^T: S_t = exp(g_t) S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T."""
    out_dtype = v.dtype
    q, k, v, g, beta, h0 = prepare_memory_inputs(q, k, v, g, beta, scale=scale, state=initial_state)
    S = h0.transpose(-1, -2)
    eye = torch.eye(q.shape[-1], dtype=q.dtype, device=q.device)
    outputs = []
    for t in range(q.shape[2]):
        k_t, b_t = k[:, :, t], beta[:, :, t, None, None]
        erase = eye - b_t * k_t[..., :, None] * k_t[..., None, :]
        S = g[:, :, t, None, None].exp() * S @ erase + b_t * v[:, :, t, :, None] * k_t[..., None, :]
        outputs.append((S @ q[:, :, t, :, None]).squeeze(-1))
    o = torch.stack(outputs, dim=2) if outputs else v.new_zeros(v.shape)
    return o.to(out_dtype), S.transpose(-1, -2)


@autocast_off
def delta_rule_step(q, k, v, g, beta, state, scale=None):
    """One token: q, k [B, H, D_k], v [B, H, D_v], g, beta [B, H] -> (o [B, H, D_v], state)."""
    q, k, v, g, beta, state = prepare_memory_inputs(q, k, v, g, beta, scale=scale, state=state)
    state = g.exp()[..., None, None] * state
    u = beta[..., None] * (v - torch.einsum("bhkv,bhk->bhv", state, k))
    state = state + k[..., :, None] * u[..., None, :]
    o = torch.einsum("bhk,bhkv->bhv", q, state)
    return o.to(v.dtype), state


@autocast_off
def delta_rule_chunk(q, k, v, g, beta, scale=None, initial_state=None, chunk_size: int = 64, cu_seqlens=None,
                     starts=None, context=None):
    """Chunkwise WY/UT form. Within a chunk with cumulative log-decays b and Gamma_ij = exp(b_i - b_j)
    (j <= i), the corrected values u solve a unit lower-triangular system,
        (I + strict_tril(diag(beta) (K K^T * Gamma))) u = diag(beta) V - diag(beta) (K exp(b)) h_prev,
    so u = U - W h_prev with U, W from one triangular solve per chunk (all chunks in parallel). Then
        o = (Q exp(b)) h_prev + (Q K^T * Gamma) u,    h_next = exp(b_C) h_prev + (K exp(b_C - b))^T u,
    the only part that runs chunk after chunk. Padding uses k = 0, beta = 0, g = 0 (no effect).
    cu_seqlens (and starts): packed sequences; context: a rank's shard of a split sequence; both as in `gla_chunk`.
    """
    if context is not None:
        return split(delta_rule_chunk, (q, k, v, g, beta), context, cu_seqlens, scale=scale,
                     chunk_size=chunk_size)
    if cu_seqlens is not None:
        return aligned(delta_rule_chunk, cu_seqlens, chunk_size, (q, k, v, g, beta), scale)
    out_dtype = v.dtype
    q, k, v, g, beta, h = prepare_memory_inputs(q, k, v, g, beta, scale=scale, state=initial_state)
    T, D_v = q.shape[2], v.shape[-1]
    C, padded = chunk_layout(T, chunk_size)
    q, k, v, g, beta = (to_chunks(x, C, padded) for x in (q, k, v, g, beta))
    b = g.cumsum(dim=-1)  # [B, H, N, C]
    gamma = decay_matrix(b)  # [B, H, N, C, C], lower triangle including the diagonal
    k_beta = k * beta[..., None]
    system = torch.eye(C, dtype=q.dtype, device=q.device) + ((k_beta @ k.transpose(-1, -2)) * gamma).tril(-1)
    rhs = torch.cat((v * beta[..., None], k_beta * b.exp()[..., None]), dim=-1)
    solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    U, W = solved[..., :D_v], solved[..., D_v:]
    scores = (q @ k.transpose(-1, -2)) * gamma
    q_decayed = q * b.exp()[..., None]
    k_to_end = k * (b[..., -1:] - b).exp()[..., None]
    chunk_decay = b[..., -1].exp()  # [B, H, N]

    scan = SequenceStarts(starts, h)
    outputs = []  # unbind once: indexing inside the loop would make the backward quadratic in chunks
    per_chunk = (x.unbind(2) for x in (U, W, q_decayed, scores, k_to_end.transpose(-1, -2), chunk_decay))
    for n, (U_n, W_n, q_n, scores_n, k_n, decay_n) in enumerate(zip(*per_chunk, strict=True)):
        h = scan.entering(n, h)
        u = U_n - W_n @ h
        outputs.append(q_n @ h + scores_n @ u)
        h = decay_n[..., None, None] * h + k_n @ u
    o = torch.cat(outputs, dim=2)[:, :, :T]
    return o.to(out_dtype), scan.final(h)
