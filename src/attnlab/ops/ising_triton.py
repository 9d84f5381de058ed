"""Banded Ising marginals in Triton: `ising.banded_log_marginals`'s contract, one kernel launch per pass.

The torch form runs the chain's forward and backward messages as a loop of small kernels per spin, in log
space, and autograd keeps every message. Here a program holds a block of chains with their 2^w states in
registers and runs every spin in one launch, in probability space: each step's messages are rescaled to sum
to one, since the marginals are ratios of them,
    P(s_j = +1) = sum_{x: newest spin +1} alpha_{j+1}(x) beta_j(x) / sum_x alpha_{j+1}(x) beta_j(x),
and each step's weights exp(s (h_j + sum_d J_{j-d,j} s_{j-d})) are divided by their largest, so nothing
overflows. A state x holds the last w spins, bit d = spin j - d; the step to x' = (2x + new bit) mod 2^w
drops the top bit, so x' = 2y + b comes from x = y and x = y + 2^(w-1).

The backward pass does not differentiate the loop: for L = sum_j g_j log P(s_j = +1), the exponential
family gives
    dL/dh_k = E[s_k F] - G E[s_k],    dL/dJ_{k-d,k} = E[s_k s_{k-d} F] - G E[s_k s_{k-d}],
with F = sum_j c_j [s_j = +1], c_j = g_j / P(s_j = +1) and G = sum_j g_j. E[. F] comes from first-moment
messages carried beside the messages, alpha'_{k+1} = T_k alpha'_k + c_k [s_k = +1] alpha_{k+1} (beta' alike),
and the expectations at spin k from the transition's weight times the messages on either side of it.
Memory: the forward messages of every spin (twice in the backward pass), fp32, where autograd over the
torch form keeps several times that.

Needs Triton (a CUDA GPU, or its interpreter on a CPU); `available()` says whether it imports.
"""

from __future__ import annotations

import torch

from ..errors import ConfigError
from .fla import interpreted

try:
    import triton
    import triton.language as tl
except ImportError:  # optional: without it `available()` is false and nothing below is defined
    triton = None


def available() -> bool:
    """Whether Triton imports here."""
    return triton is not None


def require() -> None:
    """Raise a one-line ConfigError naming the fix where the kernels cannot run: no Triton, or no CUDA GPU
    (Triton's interpreter, TRITON_INTERPRET=1, runs them on a CPU for tests)."""
    if not available():
        raise ConfigError("backend=triton needs Triton, which comes with PyTorch's CUDA builds and is not "
                          "installed here: use backend=torch or backend=auto")
    if not (torch.cuda.is_available() or interpreted()):
        raise ConfigError("backend=triton runs Triton kernels, which need a CUDA GPU, and this machine has none; "
                          "use backend=torch or backend=auto")


if triton is not None:

    @triton.jit
    def fields(h, J, rows, mask, k, n, stride_jq, W: tl.constexpr, S: tl.constexpr, BQ: tl.constexpr):
        """u(x) = h_k + sum_d J[k, d] spin_d(x) [BQ, S]: the field on spin k in each state x of the spins before
        it (bit d = spin k - 1 - d). The new spin s adds s u(x) to the log-weight."""
        x = tl.arange(0, S)
        u = tl.load(h + rows * n + k, mask=mask, other=0.0)[:, None] + tl.zeros((BQ, S), tl.float32)
        for d in tl.static_range(W):
            coupling = tl.load(J + rows * stride_jq + k * W + d, mask=mask, other=0.0)
            u += coupling[:, None] * (((x >> d) & 1) * 2 - 1).to(tl.float32)[None, :]
        return u

    @triton.jit
    def pair_lse(t, BQ: tl.constexpr, S: tl.constexpr):
        """[BQ, S] -> [BQ, S/2]: logaddexp of t[y] and t[y + S/2], the two states that step to 2y + b."""
        t = tl.reshape(t, (BQ, 2, S // 2))
        top = tl.max(t, axis=1)
        return top + tl.log(tl.sum(tl.exp(t - top[:, None, :]), axis=1))

    @triton.jit
    def pair_sum(t, BQ: tl.constexpr, S: tl.constexpr):
        return tl.sum(tl.reshape(t, (BQ, 2, S // 2)), axis=1)

    @triton.jit
    def interleave(even, odd, BQ: tl.constexpr, S: tl.constexpr):
        """[BQ, S/2] twice -> [BQ, S] with state 2y + b from (even, odd)[b][y]."""
        return tl.reshape(tl.join(even, odd), (BQ, S))

    @triton.jit
    def after(b, BQ: tl.constexpr, S: tl.constexpr):
        """Values over the states after a spin, read at each state x before it: (at x' for a down spin, at x'
        for an up spin), [BQ, S] each; x = e S/2 + y steps to x' = 2y + b."""
        at_down, at_up = tl.split(tl.reshape(b, (BQ, S // 2, 2)))
        at_down = tl.reshape(tl.broadcast_to(at_down[:, None, :], (BQ, 2, S // 2)), (BQ, S))
        at_up = tl.reshape(tl.broadcast_to(at_up[:, None, :], (BQ, 2, S // 2)), (BQ, S))
        return at_down, at_up

    @triton.jit
    def row_lse(t):
        top = tl.max(t, axis=1)
        return top + tl.log(tl.sum(tl.exp(t - top[:, None]), axis=1))

    @triton.jit
    def step_forward(a, u, BQ: tl.constexpr, S: tl.constexpr):
        """Log-messages over the state before a spin -> after it (unnormalised): x' = 2y + b sums the two
        states y and y + S/2 that step to it, each weighted by exp(s u(x)) for the new spin s."""
        return interleave(pair_lse(a - u, BQ, S), pair_lse(a + u, BQ, S), BQ, S)

    @triton.jit
    def step_backward(b, u, BQ: tl.constexpr, S: tl.constexpr):
        """Log-messages over the state after a spin -> before it (unnormalised), and the messages after it read
        at each state before it, for a down and an up spin."""
        b_down, b_up = after(b, BQ, S)
        top = tl.maximum(b_down - u, b_up + u)
        return top + tl.log(tl.exp(b_down - u - top) + tl.exp(b_up + u - top)), b_down, b_up

    @triton.jit
    def forward_sweep(h, J, alpha, rows, mask, at, n, stride_jq, W: tl.constexpr, S: tl.constexpr,
                      BQ: tl.constexpr):
        """alpha after every spin k, normalised, stored at alpha[k]. Before the first spin the w earlier ones
        are free: log-messages 0."""
        a = tl.zeros((BQ, S), tl.float32)
        for k in range(0, n):
            a = step_forward(a, fields(h, J, rows, mask, k, n, stride_jq, W, S, BQ), BQ, S)
            a = a - row_lse(a)[:, None]
            tl.store(alpha + at + k * S, a, mask=mask[:, None])

    @triton.jit
    def marginals(h, J, alpha, out, Q, n, stride_jq, W: tl.constexpr, S: tl.constexpr, BQ: tl.constexpr):
        """log P(s_k = +1) = LSE over the states whose newest spin is up of alpha_k + beta_k, minus the LSE
        over all, with beta (after spin k) swept down from the last spin."""
        rows = tl.program_id(0) * BQ + tl.arange(0, BQ)
        mask = rows < Q
        x = tl.arange(0, S)
        at = (rows[:, None] * n) * S + x[None, :]
        forward_sweep(h, J, alpha, rows, mask, at, n, stride_jq, W, S, BQ)
        tl.debug_barrier()
        b = tl.zeros((BQ, S), tl.float32)
        newest_up = (x & 1)[None, :] == 1
        for i in range(0, n):
            k = n - 1 - i
            joint = tl.load(alpha + at + k * S, mask=mask[:, None], other=0.0) + b
            log_p = row_lse(tl.where(newest_up, joint, float("-inf"))) - row_lse(joint)
            tl.store(out + rows * n + k, log_p, mask=mask)
            b, _, _ = step_backward(b, fields(h, J, rows, mask, k, n, stride_jq, W, S, BQ), BQ, S)
            b = b - row_lse(b)[:, None]

    @triton.jit
    def marginal_adjoint(a, b, g, newest_up):
        """d log P / d(alpha + beta) times g for log P = LSE_up(alpha + beta) - LSE(alpha + beta): the softmax over
        the up states minus the softmax over all, [BQ, S]."""
        t = a + b
        every = tl.exp(t - row_lse(t)[:, None])
        t_up = tl.where(newest_up, t, float("-inf"))
        up = tl.exp(t_up - row_lse(t_up)[:, None])
        return g[:, None] * (up - every)

    @triton.jit
    def add_field_gradient(dh, dJ, rows, mask, k, n, d_u, accumulate: tl.constexpr, W: tl.constexpr,
                           S: tl.constexpr):
        """dL/dh_k = sum_x dL/du(x) and dL/dJ[k, d] = sum_x dL/du(x) spin_d(x), stored or added."""
        x = tl.arange(0, S)
        d_field = tl.sum(d_u, axis=1)
        if accumulate:
            d_field += tl.load(dh + rows * n + k, mask=mask, other=0.0)
        tl.store(dh + rows * n + k, d_field, mask=mask)
        for d in tl.static_range(W):
            earlier = (((x >> d) & 1) * 2 - 1).to(tl.float32)[None, :]
            d_coupling = tl.sum(d_u * earlier, axis=1)
            if accumulate:
                d_coupling += tl.load(dJ + (rows * n + k) * W + d, mask=mask, other=0.0)
            tl.store(dJ + (rows * n + k) * W + d, d_coupling, mask=mask)

    @triton.jit
    def beta_adjoints(h, J, grad, alpha, beta, dh, dJ, rows, mask, at, n, stride_jq, W: tl.constexpr,
                      S: tl.constexpr, BQ: tl.constexpr):
        """Ascending: the adjoint of beta after spin k takes its successors' shares of the adjoint before it and
        the marginal's own term; u's gradient through the backward messages is stored."""
        newest_up = (tl.arange(0, S) & 1)[None, :] == 1
        b_adj = tl.zeros((BQ, S), tl.float32)  # the adjoint of beta before spin k (after spin k - 1)
        for k in range(0, n):
            b = tl.load(beta + at + k * S, mask=mask[:, None], other=0.0)
            u = fields(h, J, rows, mask, k, n, stride_jq, W, S, BQ)
            before, b_down, b_up = step_backward(b, u, BQ, S)
            to_down, to_up = tl.exp(b_down - u - before), tl.exp(b_up + u - before)  # each successor's share
            add_field_gradient(dh, dJ, rows, mask, k, n, b_adj * (to_up - to_down), False, W, S)
            b_adj = interleave(pair_sum(b_adj * to_down, BQ, S), pair_sum(b_adj * to_up, BQ, S), BQ, S)
            g = tl.load(grad + rows * n + k, mask=mask, other=0.0)
            b_adj += marginal_adjoint(tl.load(alpha + at + k * S, mask=mask[:, None], other=0.0), b, g, newest_up)

    @triton.jit
    def alpha_adjoints(h, J, grad, alpha, beta, dh, dJ, rows, mask, at, n, stride_jq, W: tl.constexpr,
                       S: tl.constexpr, BQ: tl.constexpr):
        """Descending: the adjoint of alpha after spin k takes the marginal's term and passes to each predecessor
        its share; u's gradient through the forward messages is added to what beta_adjoints stored."""
        newest_up = (tl.arange(0, S) & 1)[None, :] == 1
        a_adj = tl.zeros((BQ, S), tl.float32)  # the adjoint of alpha after spin k
        for i in range(0, n):
            k = n - 1 - i
            g = tl.load(grad + rows * n + k, mask=mask, other=0.0)
            a_adj += marginal_adjoint(tl.load(alpha + at + k * S, mask=mask[:, None], other=0.0),
                                      tl.load(beta + at + k * S, mask=mask[:, None], other=0.0), g, newest_up)
            a = tl.load(alpha + at + tl.maximum(k - 1, 0) * S, mask=mask[:, None], other=0.0)
            a = tl.where(k > 0, a, 0.0)  # alpha before spin k: zeros (the free earlier spins) before the first
            u = fields(h, J, rows, mask, k, n, stride_jq, W, S, BQ)
            next_down, next_up = after(step_forward(a, u, BQ, S), BQ, S)
            from_down, from_up = tl.exp(a - u - next_down), tl.exp(a + u - next_up)  # each predecessor's share
            adj_down, adj_up = after(a_adj, BQ, S)
            add_field_gradient(dh, dJ, rows, mask, k, n, adj_up * from_up - adj_down * from_down, True, W, S)
            a_adj = adj_down * from_down + adj_up * from_up

    @triton.jit
    def marginals_backward(h, J, grad, alpha, beta, dh, dJ, Q, n, stride_jq,
                           W: tl.constexpr, S: tl.constexpr, BQ: tl.constexpr):
        """Reverse mode through the log-space messages: every local derivative is a softmax weight (at most 1),
        so no ratio of small probabilities is formed. The messages both ways are stored, then their adjoints
        swept."""
        rows = tl.program_id(0) * BQ + tl.arange(0, BQ)
        mask = rows < Q
        at = (rows[:, None] * n) * S + tl.arange(0, S)[None, :]
        forward_sweep(h, J, alpha, rows, mask, at, n, stride_jq, W, S, BQ)
        b = tl.zeros((BQ, S), tl.float32)
        for i in range(0, n):  # beta after spin k
            k = n - 1 - i
            tl.store(beta + at + k * S, b, mask=mask[:, None])
            b, _, _ = step_backward(b, fields(h, J, rows, mask, k, n, stride_jq, W, S, BQ), BQ, S)
            b = b - row_lse(b)[:, None]
        tl.debug_barrier()
        beta_adjoints(h, J, grad, alpha, beta, dh, dJ, rows, mask, at, n, stride_jq, W, S, BQ)
        tl.debug_barrier()
        alpha_adjoints(h, J, grad, alpha, beta, dh, dJ, rows, mask, at, n, stride_jq, W, S, BQ)


def _launch(h: torch.Tensor, J: torch.Tensor) -> tuple:
    """(grid, then the kernels' trailing arguments Q, n, the couplings' stride between chains, W, S, BQ) for
    fields h [Q, n] and couplings J [Q or 1, n, W]. BQ chains per program: about 2,048 state values in registers
    per message."""
    (Q, n), W = h.shape, J.shape[-1]
    S = 2**W
    BQ = max(1, min(16, 2048 // S))
    return (-(-Q // BQ),), Q, n, n * W if J.shape[0] > 1 else 0, W, S, BQ


class _BandedLogMarginals(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, Jb):
        h32, J32 = h.float().contiguous(), Jb.float().contiguous()
        grid, *shape = _launch(h32, J32)
        Q, n, _, _, S, _ = shape
        log_p = torch.empty(Q, n, device=h.device)
        alpha = torch.empty(Q, n, S, device=h.device)  # the forward messages, read back by the same program
        marginals[grid](h32, J32, alpha, log_p, *shape)
        ctx.save_for_backward(h32, J32)
        ctx.dtypes = h.dtype, Jb.dtype
        return log_p.to(h.dtype)

    @staticmethod
    def backward(ctx, grad):
        h32, J32 = ctx.saved_tensors
        grid, *shape = _launch(h32, J32)
        Q, n, _, W, S, _ = shape
        alpha, beta = (torch.empty(Q, n, S, device=h32.device) for _ in range(2))
        dh, dJ = torch.empty_like(h32), torch.empty(Q, n, W, device=h32.device)
        marginals_backward[grid](h32, J32, grad.float().contiguous(), alpha, beta, dh, dJ, *shape)
        if J32.shape[0] == 1:
            dJ = dJ.sum(0, keepdim=True)
        return dh.to(ctx.dtypes[0]), dJ.to(ctx.dtypes[1])


def banded_log_marginals(h: torch.Tensor, Jb: torch.Tensor) -> torch.Tensor:
    """`ising.banded_log_marginals` on the Triton kernels: h [Q, n], Jb [Q or 1, n, w] -> log P(s_j = +1)
    [Q, n], computed in fp32."""
    if not (h.is_cuda or interpreted()):
        raise ConfigError(f"backend=triton runs Triton kernels, which need a CUDA GPU, and this model runs on "
                          f"{h.device}; use backend=torch or backend=auto")
    return _BandedLogMarginals.apply(h, Jb)
