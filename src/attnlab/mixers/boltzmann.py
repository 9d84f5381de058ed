"""Boltzmann attention (Kim & Park 2026): attention weights are the spin marginals of an Ising model. Its fields are
the attention scores, and its couplings are learned.

For query i, key j <= i carries a spin with field h_ij = q_i . k_j / sqrt(d) (plus an optional learned
bias), pairs of keys are coupled by J_jk, and the weight of key j is its marginal alpha_ij =
P_i(s_j = +1), normalised over the visible keys: o_i = sum_j alpha_ij v_j / sum_k alpha_ik.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..errors import ConfigError, UserError
from ..nn import at_least_fp32, causal_mask, no_autocast, overwritten, positions_in_sequences, set_optim
from ..ops import annealing, ising, ising_triton
from ..ops.cp import Context, attend_halo
from ..ops.field_attention import field_attention
from .attention import AttentionConfig, AttentionMixer, KVCache
from .registry import register_mixer

# which terms of the energy each mode keeps: (fields h, pair couplings J, three-body couplings K)
MODES = {
    "h+J": (True, True, False), "h-only": (True, False, False), "j-only": (False, True, False),
    "h+J+K": (True, True, True), "h+K": (True, False, True), "J+K": (False, True, True), "K-only": (False, False, True),
}
INFERENCE = ("exact", "banded", "mean-field", "dqa")
BACKENDS = ("torch", "flex", "triton", "auto")
Mode = Literal[tuple(MODES)]
Inference = Literal[INFERENCE]
Backend = Literal[BACKENDS]
MAX_DQA_WINDOW = 12  # a state vector of 2^window amplitudes per query
# the cheap configuration that runs at any length: banded inference over a sliding window of distance
# couplings, one chain of `window` spins with 2^band states per query (a few times a softmax step)
SLIDING = {"couplings": "distance", "inference": "banded", "band": 2, "window": 16}
IN_A_RUN = "model.mixer_options.boltzmann.<field>=<value> in a run"
EXACT_COPIES = 3  # exact inference holds log-weights, their exp in the backward and slack (as ops.ising budgets)
# banded inference: chains go through in groups whose per-spin messages [group, 2^(band+1)] take at most this many
# bytes, so that they stay in the caches (measured on CPUs: 4096 queries at band 8 in one group take 1.5x as long
# as in groups of 1024)
CHAIN_GROUP_BYTES = 2 * 2**20


def exact_gib(n_heads: int, positions: int, element_size: int = 4) -> float:
    """GiB exact inference needs to enumerate one sequence of `positions`: 2^positions configurations per head."""
    return n_heads * 2**positions * element_size * EXACT_COPIES / 2**30


def max_exact_positions(n_heads: int, memory_budget_gib: float, element_size: int = 4) -> int:
    """The most positions exact inference can enumerate within the memory budget."""
    return int(math.log2(memory_budget_gib * 2**30 / (n_heads * element_size * EXACT_COPIES)))


@dataclass
class BoltzmannConfig(AttentionConfig):
    mode: Mode = "h+J"
    inference: Inference = "exact"
    window: int = 16  # the most positions a query sees; position couplings are a window x window matrix
    # position: J_jk per pair of window positions (the paper) | distance: J by k - j, which also lets
    # banded and mean-field inference run past the window as a sliding window (each query sees its last
    # `window` keys)
    couplings: Literal["position", "distance"] = "position"
    band: int = 8  # banded inference: couplings reach at most this far (others are dropped)
    j_init_std: float = 0.0  # J = 0 at start is h-only attention, and J still gets gradients
    j_lr: float = 3e-5  # the paper's separate learning rate for couplings (LM; 1e-4 for brackets)
    j_weight_decay: float = 0.01
    bias_field: bool = False  # a learned field b_j per window position added to h (not in the paper)
    # o_i = sum_j alpha_ij v_j / sum_k alpha_ik (the paper); false: o_i = sum_j alpha_ij v_j, the marginals
    # themselves (the spec's other reading of the paper's h-only "sigmoid attention": unnormalised sigma(2h))
    normalise: bool = True
    mean_field_iterations: int = 30
    mean_field_damping: float = 0.5
    dqa_tau: float = 2.0  # anneal time of the linear schedule (dimensionless)
    dqa_steps: int = 200  # Trotter steps
    dqa_shots: int = 256  # 0: use the simulated measurement probabilities (infinitely many shots)
    # ste: through the simulated circuit | covariance: sample correlations
    dqa_gradient: Literal["ste", "covariance"] = "ste"
    memory_budget_gib: float = 2.0  # exact inference: log-weights held at once
    # torch (the forms below); flex, fields only (mode=h-only, no bias_field): FlexAttention, softmax of
    # log sigma(2h) over a sliding causal block mask, one fused kernel on a GPU; triton, banded inference: each
    # chain's messages in one Triton kernel per pass; auto: on a CUDA GPU, flex where it applies, else triton
    # for banded inference; torch otherwise
    backend: Backend = "auto"

    def validate(self) -> None:
        super().validate()
        if self.window < 2:
            raise ConfigError(f"window={self.window} must be at least 2")
        uses_K = MODES[self.mode][2]
        if uses_K and self.couplings != "position":
            raise ConfigError(f"mode={self.mode} has three-body couplings, which are indexed by position; "
                              "use couplings=position")
        if uses_K and self.inference == "banded":
            raise ConfigError(f"banded inference handles pair couplings only; mode={self.mode} has three-body "
                              "terms: use inference=exact, mean-field or dqa")
        # exact inference gives the marginals themselves only in its closed forms: fields alone, or pair
        # couplings alone (every marginal 1/2)
        closed_form = self.mode == "h-only" or (self.mode == "j-only" and not self.bias_field)
        if not self.normalise and self.inference == "exact" and not closed_form:
            raise ConfigError(f"normalise=false needs each key's own marginal, and exact inference with mode="
                              f"{self.mode} gives them up to a constant per query: use inference=banded, mean-field "
                              f"or dqa, or normalise=true")
        if self.backend == "flex" and not self.normalise:
            raise ConfigError("backend=flex runs a softmax, whose weights sum to 1: normalise=false needs "
                              "backend=torch or backend=auto")
        if self.backend == "flex" and (MODES[self.mode] != MODES["h-only"] or self.bias_field):
            raise ConfigError(f"backend=flex runs fields only (mode=h-only without bias_field), where every spin "
                              f"is independent; mode={self.mode}{' with bias_field' if self.bias_field else ''} "
                              f"needs Ising inference: use backend=torch or backend=auto")
        if self.backend == "triton":
            if self.inference != "banded":
                raise ConfigError(f"backend=triton runs banded inference, not inference={self.inference}: use "
                                  f"backend=torch or backend=auto")
            ising_triton.require()
        if self.inference == "banded" and not 1 <= self.band < self.window:
            raise ConfigError(f"band={self.band} must be between 1 and window - 1 = {self.window - 1}")
        if self.inference == "dqa":
            if self.window > MAX_DQA_WINDOW:
                raise ConfigError(f"dqa simulates 2^window amplitudes per query; window={self.window} is above "
                                  f"{MAX_DQA_WINDOW}: lower it or use inference=exact, banded or mean-field")
            if self.dqa_gradient == "covariance" and self.dqa_shots < 2:
                raise ConfigError("dqa_gradient=covariance estimates correlations from shots: set dqa_shots >= 2")
        if self.dqa_tau <= 0 or self.dqa_steps < 1 or self.dqa_shots < 0:
            raise ConfigError("need dqa_tau > 0, dqa_steps >= 1 and dqa_shots >= 0")

    def sliding(self) -> bool:
        """Whether contexts past the window are allowed (each query then sees its last `window` keys)."""
        return self.couplings == "distance" and not self.bias_field and self.inference in ("banded", "mean-field")

    def sliding_settings(self) -> str:
        """SLIDING as field=value pairs, with what else this configuration must drop to slide."""
        settings = dict(SLIDING)
        if MODES[self.mode][2]:
            settings["mode"] = "h+J"  # three-body couplings are indexed by position
        if self.bias_field:
            settings["bias_field"] = "false"  # a field per window position does not slide
        return " ".join(f"{field}={value}" for field, value in settings.items())

    @property
    def read_limit(self) -> tuple[int, str] | None:
        return None if self.sliding() else (self.window, f"boltzmann's window={self.window}")

    @property
    def halo(self) -> tuple[int, str] | None:
        """The sliding banded form's chains reach window - 1 keys back (the other forms gather every key)."""
        return (self.window - 1, f"window={self.window}") if self.sliding() and self.inference == "banded" else None

    @property
    def cost_advice(self) -> str:
        """What one query costs in this configuration against the sliding one."""
        work = {"exact": f"enumerates 2^{self.window} configurations",
                "banded": f"runs a chain of {self.window} spins with 2^{self.band} states",
                "mean-field": f"runs {self.mean_field_iterations} sweeps over {self.window} coupled spins",
                "dqa": f"simulates {self.dqa_steps} steps of 2^{self.window} amplitudes"}[self.inference]
        return (f"{self.inference} inference {work} per query; {self.sliding_settings()} runs a chain of "
                f"{SLIDING['window']} spins with 2^{SLIDING['band']} states")


@register_mixer("boltzmann")
class BoltzmannAttention(AttentionMixer):
    """Boltzmann attention (Kim & Park 2026): key j's weight is its spin's marginal in an Ising model whose fields
    are the query-key scores and whose couplings between key positions are learned.

    The inference forms (exact, banded, mean-field, annealing) are those of ``attnlab.ops.ising`` and
    ``attnlab.ops.annealing``; the module docstring gives the equations."""

    config_class = BoltzmannConfig
    backends = ("torch", "flex", "triton")
    deterministic = (("dqa_shots", 0),)  # annealing's simulated probabilities, not sampled shots
    compile_exclusion = ("its inference loops (enumeration in pieces, chain messages, annealing steps) unroll into "
                         "graphs that did not finish compiling in 75 s for one small layer on a 2-core CPU")

    def __init__(self, cfg: BoltzmannConfig):
        super().__init__(cfg)
        self.uses_h, self.uses_J, self.uses_K = MODES[cfg.mode]
        H, W = cfg.n_heads, cfg.window
        self.J = self.K = self.bias = None
        if self.uses_J:
            shape = (H, W, W) if cfg.couplings == "position" else (H, W - 1)
            self.J = set_optim(nn.Parameter(torch.randn(shape) * cfg.j_init_std), lr=cfg.j_lr,
                               weight_decay=cfg.j_weight_decay)
        if self.uses_K:
            self.K = set_optim(nn.Parameter(torch.randn(H, W, W, W) * cfg.j_init_std), lr=cfg.j_lr,
                               weight_decay=cfg.j_weight_decay)
        if cfg.bias_field:
            self.bias = nn.Parameter(torch.zeros(H, W))

    def ablated(self):
        """The couplings J (and three-body K) zeroed: what the fields h alone make of the trained layer."""
        couplings = [p for p in (self.J, self.K) if p is not None]
        return overwritten(*[(p, 0.0) for p in couplings]) if couplings else None

    def coupling_matrix(self, size: int) -> torch.Tensor | None:
        """J over the first `size` positions [H, size, size] (strict upper triangle meaningful), in fp32 or
        wider, as inference runs."""
        if self.J is None:
            return None
        J = at_least_fp32(self.J)
        if self.cfg.couplings == "position":
            return J[:, :size, :size]
        position = torch.arange(size, device=J.device)
        offset = position[None, :] - position[:, None]  # k - j
        reach = J.shape[-1]
        table = torch.cat((J.new_zeros(J.shape[0], 1), J), dim=-1)  # distance 0 -> 0
        index = torch.where((offset >= 1) & (offset <= reach), offset, 0)
        return table[:, index]

    def fields_only(self) -> bool:
        """Whether every spin is independent (fields, no couplings, no bias field) and the weights are normalised:
        FlexAttention's case."""
        return self.uses_h and not self.uses_J and not self.uses_K and self.bias is None and self.cfg.normalise

    def route(self, x: torch.Tensor, machine: dict | None = None) -> tuple[str, str]:
        """backend as set, or under auto on a CUDA GPU: FlexAttention for fields only, else Triton's kernels for
        banded inference where Triton imports; the torch form otherwise."""
        backend = self.cfg.backend
        if backend != "auto":
            return backend, f"backend={backend}"
        if not (x.is_cuda if machine is None else machine["cuda"]):
            return "torch", "not on a CUDA GPU: the torch forms"
        if self.fields_only():
            return "flex", "FlexAttention: fields only, softmax of log sigma(2h) over a sliding causal block mask"
        if self.cfg.inference != "banded":
            return "torch", f"inference={self.cfg.inference}: the torch form (Triton runs banded inference)"
        if not (ising_triton.available() if machine is None else machine["triton"]):
            return "torch", "Triton is not installed: the torch form"
        return "triton", "banded inference: each chain's messages in one Triton kernel per pass"

    @property
    def packs(self) -> str | None:
        """Banded inference over a sliding window runs packed sequences in one call (forward), keeping no states (a
        sliding window's cache keeps a row's last keys, and a padded row's last keys are padding); otherwise,
        FlexAttention too (its route on the layer's device), mix runs them."""
        native = self.cfg.sliding() and self.cfg.inference == "banded" and self.route(self.qkv.weight)[0] != "flex"
        return "outputs" if native else None

    @property
    def splits(self) -> bool:
        """A sequence splits across ranks, packed documents too, but on FlexAttention: banded inference over a
        sliding window reads at most window - 1 keys of the rank before (its halo), every other form the keys
        gathered up to its shard, as attention does."""
        return self.route(self.qkv.weight)[0] != "flex"

    def forward(self, x: torch.Tensor, state: KVCache | None = None, *, cu_seqlens: torch.Tensor | None = None,
                context: Context | None = None):
        """x from the state's KV cache (its last window - 1 keys, sliding); packed sequences, each query's chain
        beginning no earlier than its sequence's start (`packs`); or this rank's shard under a context (cu_seqlens
        then the whole row's boundaries), the sliding banded form over its halo of the previous rank's last window
        - 1 keys and values, every other form over the keys gathered up to its shard, as attention does."""
        if context is not None and self.cfg.halo is None:
            return super().forward(x, cu_seqlens=cu_seqlens, context=context)
        if context is not None:  # a shard keeps no state
            halo, T = self.cfg.halo[0], x.shape[1]
            if T < halo:
                raise UserError(f"a shard of {T} tokens is shorter than Boltzmann attention's halo of window - 1 = "
                                f"{halo} keys: give each rank at least {halo} tokens (train.seq_len / "
                                "train.context_parallel)")
            q, k, v = self.projections(x, positions=context.documents(cu_seqlens, T).positions.to(x.device))
            return self.output(attend_halo(self.attend_banded, q, k, v, context, halo, cu_seqlens), x), None
        if cu_seqlens is not None:  # each query's chain begins no earlier than its own sequence's start
            positions = positions_in_sequences(cu_seqlens, x.device)
            q, k, v = self.projections(x, positions=positions)
            starts = torch.arange(x.shape[1], device=x.device) - positions
            return self.output(self.attend_banded(q, k, v, starts), x), None
        y, state = super().forward(x, state)
        if self.cfg.sliding():  # the next token sees at most the last window - 1 of these keys: keep only those
            state = state.keep_last(self.cfg.window - 1)
        return y, state

    def state_size(self, seq_len: int) -> int:
        return super().state_size(min(seq_len, self.cfg.window - 1) if self.cfg.sliding() else seq_len)

    def attend(self, q, k, v):
        B, H, Tq, D = q.shape
        S = k.shape[-2]
        if S > self.cfg.window and not self.cfg.sliding():
            raise UserError(f"Boltzmann attention with window={self.cfg.window} sees at most {self.cfg.window} "
                            f"positions, but this call reaches {S}; {self.length_advice(S)}")
        if self.route(q)[0] == "flex":
            with no_autocast(q.device):  # fields and partition functions in fp32, as below
                q, k = at_least_fp32(q), at_least_fp32(k)
                try:
                    return field_attention(q, k, v.to(q.dtype), self.cfg.window).to(v.dtype)
                except NotImplementedError as err:  # torch has no FlexAttention backward on a CPU
                    raise UserError(f"backend=flex cannot train on {q.device.type} ({err}); use backend=torch or "
                                    f"backend=auto here") from err
        if self.cfg.inference == "banded":
            return self.attend_banded(q, k, v)
        visible = causal_mask(Tq, S, q.device, window=self.cfg.window)
        with no_autocast(q.device):  # fields and partition functions in fp32
            q, k = at_least_fp32(q), at_least_fp32(k)
            h = q @ k.transpose(-1, -2) / math.sqrt(D) if self.uses_h else q.new_zeros(B, H, Tq, S)
            if self.bias is not None:
                h = h + self.bias[:, None, :S]
            weights = self.weights(self.log_weights(h, visible).masked_fill(~visible, float("-inf")))
        return weights.to(v.dtype) @ v

    def weights(self, log_alpha: torch.Tensor) -> torch.Tensor:
        """The weights of the values from log alpha (-inf for keys not seen): alpha / sum alpha over the seen keys,
        or with normalise=false alpha itself."""
        return torch.softmax(log_alpha, dim=-1) if self.cfg.normalise else log_alpha.exp()

    def length_advice(self, length: int) -> str:
        """How to reach `length` positions, what runs first: the sliding configuration, then a larger window
        only where this inference can hold one that large."""
        cfg = self.cfg
        advice = f"set {cfg.sliding_settings()} ({IN_A_RUN}), which slides over any length"
        if cfg.inference == "exact":
            most = max_exact_positions(cfg.n_heads, cfg.memory_budget_gib)
            if length <= most:
                return advice + (f", or raise window to {length} (exact inference: 2^{length} configurations per "
                                 f"query, {exact_gib(cfg.n_heads, length):.2g} GiB of memory_budget_gib="
                                 f"{cfg.memory_budget_gib:g})")
            return advice + (f"; raising window cannot reach {length}: exact inference enumerates at most {most} "
                             f"positions in memory_budget_gib={cfg.memory_budget_gib:g} "
                             f"({exact_gib(cfg.n_heads, most):.2g} GiB per sequence)")
        if cfg.inference == "dqa":
            return advice + f"; dqa cannot reach {length}: it simulates at most {MAX_DQA_WINDOW} positions"
        return advice + f", or raise window to {length}"

    def check_enumerable(self, positions: int, element_size: int) -> None:
        """Exact inference past its memory budget fails here, with a configuration that runs."""
        cfg = self.cfg
        most = max_exact_positions(cfg.n_heads, cfg.memory_budget_gib, element_size)
        if positions > most:
            raise UserError(
                f"exact Boltzmann inference enumerates 2^{positions} configurations per query, "
                f"{exact_gib(cfg.n_heads, positions, element_size):.3g} GiB per sequence, but memory_budget_gib="
                f"{cfg.memory_budget_gib:g} holds at most {most} positions; set {cfg.sliding_settings()} "
                f"({IN_A_RUN}), which slides over any length, or window={most} with sequences of at most {most}"
            )

    def log_weights(self, h: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """log alpha [B, H, Tq, S] for the visible keys: exact inference with couplings up to a per-query constant
        (BoltzmannConfig.validate keeps it to normalise=true), every other form the marginals themselves."""
        S = h.shape[-1]
        inference = self.cfg.inference
        J = self.coupling_matrix(S)
        K = None if self.K is None else at_least_fp32(self.K[:, :S, :S, :S])
        closed_form = self.closed_form(h, J, K)
        if closed_form is not None:
            return closed_form
        if inference == "exact":
            self.check_enumerable(S, h.element_size())
            return ising.causal_log_weights(h, J, K, int(self.cfg.memory_budget_gib * 2**30))
        h = h * visible  # absent spins: no field ...
        if inference == "mean-field":
            phi = ising.mean_field_fields(h, J, K, visible, self.cfg.mean_field_iterations,
                                          self.cfg.mean_field_damping)
            return torch.nn.functional.logsigmoid(2 * phi)
        return self.dqa_log_weights(h, J, K, visible)

    def closed_form(self, h, J, K) -> torch.Tensor | None:
        """log alpha where no inference is needed, else None."""
        if J is None and K is None:  # independent spins: alpha = sigmoid(2h), whatever the inference
            return torch.nn.functional.logsigmoid(2 * h)
        if not self.uses_h and self.bias is None and K is None:
            # no field and pair couplings only: E(s) = E(-s), so every marginal is exactly 1/2 (uniform
            # attention, as the paper's j-only specifies)
            return torch.full_like(h, -math.log(2))
        return None

    def attend_banded(self, q, k, v, starts: torch.Tensor | None = None):
        """Banded inference touches only each query's visible keys (at most `window`): their fields, one
        chain of spins per query, O(window 2^band), and their values, so time and memory are linear in
        the length. Queries go in groups that fit the memory budget and keep a chain's messages in the
        caches; each group's messages are recomputed in the backward pass instead of kept. starts [Tq]: the
        first key each query may see (its packed sequence's start; default 0)."""
        B, H, Tq, _ = q.shape
        S = k.shape[-2]
        n, w = min(S, self.cfg.window), self.cfg.band
        with no_autocast(q.device):
            J = self.coupling_matrix(n)  # None without couplings
            band = None if J is None else ising.band_couplings(J, w)  # [H, n, w]: the same for every chain
        element = max(4, q.element_size())  # the chains run in fp32 or wider
        budget = int(self.cfg.memory_budget_gib * 2**30)
        marginals = ising.banded_log_marginals
        if self.route(q)[0] == "triton":  # the kernels keep two messages per spin; their programs hold the chains
            marginals = ising_triton.banded_log_marginals
            group = max(1, budget // (n * (2 ** (w + 1) * 4 + q.shape[-1] * element) * B * H))
        else:
            bytes_per_query = n * 2**w * element * 8  # messages both ways and what autograd keeps
            group = max(1, min(budget // (bytes_per_query * B * H),
                               CHAIN_GROUP_BYTES // (2 ** (w + 1) * element * B * H)))
        position = torch.arange(S - Tq, S, device=q.device)  # of each query among the keys
        starts = torch.zeros_like(position) if starts is None else starts
        return torch.cat([self._banded_rows(q[:, :, r0 : r0 + group], k, v, position[r0 : r0 + group],
                                            starts[r0 : r0 + group], n, J, band, marginals)
                          for r0 in range(0, Tq, group)], dim=2)

    def _banded_rows(self, q, k, v, position, starts, n, J, band, marginals):
        """The output of the queries at these positions among the keys, each over its last n keys from its start."""
        B, H, Tq, D = q.shape
        S = k.shape[-2]
        index = torch.maximum(position - n + 1, starts)[:, None] + torch.arange(n, device=q.device)  # [Tq, n]
        present = index <= position[:, None]  # the chain's spins; absent ones (a suffix) are free
        index = index.clamp_max(S - 1)
        with no_autocast(q.device):  # fields and partition functions in fp32
            q, k_seen = at_least_fp32(q), at_least_fp32(k)[:, :, index]  # [B, H, Tq, n, D]
            h = torch.einsum("bhqd,bhqnd->bhqn", q, k_seen) / math.sqrt(D) if self.uses_h else q.new_zeros(B, H, Tq, n)
            if self.bias is not None:
                h = h + self.bias[:, index]
            log_alpha = self.closed_form(h, J, None)
            if log_alpha is None:
                fields = h * present
                couplings = (band[None, :, None] * present[:, :, None]).expand(B, H, -1, -1, -1).flatten(0, 2)
                chains = partial(marginals, fields.flatten(0, 2), couplings)
                # the torch form's messages are recomputed in the backward pass rather than kept (the kernels keep none)
                recompute = torch.is_grad_enabled() and marginals is ising.banded_log_marginals
                log_alpha = (checkpoint(chains, use_reentrant=False) if recompute else chains()).view_as(fields)
            weights = self.weights(log_alpha.masked_fill(~present, float("-inf")))
        return torch.einsum("bhqn,bhqnd->bhqd", weights.to(v.dtype), v[:, :, index])

    def dqa_log_weights(self, h, J, K, visible):
        B, H, Tq, S = h.shape
        spins = ising.configurations(S, h.device, h.dtype)
        pair_mask = visible[:, :, None] & visible[:, None, :]  # [Tq, S, S]: couplings among visible spins
        J_q = None if J is None else J[:, None] * pair_mask  # [H, Tq, S, S]
        K_q = None if K is None else K[:, None] * (pair_mask[..., None] & visible[:, None, None, :])
        energy = ising.coupling_energy(spins, J_q, K_q)  # [H, Tq, 2^S]
        log_weight = h @ spins.T + energy  # [B, H, Tq, 2^S] = -E(s)
        probs = annealing.anneal(-log_weight.flatten(0, 2), self.cfg.dqa_tau, self.cfg.dqa_steps)
        shots = self.cfg.dqa_shots
        if shots == 0:
            m = probs @ spins
        else:
            # training draws fresh shots; evaluation draws the same ones every call, so it is reproducible
            generator = None if self.training else torch.Generator(h.device).manual_seed(0)
            samples = annealing.sample_configurations(probs, shots, generator)
            if self.cfg.dqa_gradient == "ste":
                m = annealing.ste_magnetisation(probs, samples)
            else:
                tau = self.cfg.dqa_tau
                J_full = (J_q if J_q is not None else h.new_zeros(H, Tq, S, S)).expand(B, H, Tq, S, S)
                m = annealing.covariance_magnetisation(h.flatten(0, 2), J_full.flatten(0, 2), samples,
                                                       tau**2 / 6, tau**2 / 3)
        alpha = ((1 + m) / 2).clamp_min(0.5 / max(shots, 1) if shots else 0.0)  # a key never seen: half a shot
        return alpha.log().view(B, H, Tq, S)
