"""A Llama-style pre-norm decoder around any registered token mixer."""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .errors import ConfigError, UserError
from .mixers import Mixer, mixer_class
from .nn import FFNS, NORMS, at_least_fp32, positions_in_sequences


def ffn_width(cfg: ModelConfig) -> int:
    """4 * d_model for the GELU MLP; 8/3 * d_model keeps SwiGLU's three matrices at its parameter count."""
    if cfg.ffn_hidden is not None:
        return cfg.ffn_hidden
    if cfg.ffn_kind == "gelu":
        return 4 * cfg.d_model
    return 32 * math.ceil(8 * cfg.d_model / 3 / 32)


def norm(cfg: ModelConfig) -> nn.Module:
    return NORMS[cfg.norm](cfg.d_model, eps=cfg.norm_eps)


class Block(nn.Module):
    """x + mixer(norm(x)), then x + FFN(norm(x)) (SwiGLU unless model.ffn_kind says otherwise)."""

    def __init__(self, cfg: ModelConfig, mixer: Mixer):
        super().__init__()
        self.mixer_norm = norm(cfg)
        self.mixer = mixer
        self.mlp_norm = norm(cfg) if cfg.ffn else None
        self.mlp = FFNS[cfg.ffn_kind](cfg.d_model, ffn_width(cfg)) if cfg.ffn else None
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, state=None, cu_seqlens: torch.Tensor | None = None, keep_state: bool = True,
                context=None):
        y, state = self.mixer(self.mixer_norm(x), state, cu_seqlens, keep_state, context)
        x = x + self.dropout(y)
        if self.mlp is not None:
            x = x + self.dropout(self.mlp(self.mlp_norm(x)))
        return x, state


def build_layer_mixer(cfg: ModelConfig, name: str, layer_idx: int) -> Mixer:
    """The mixer of layer layer_idx, built but not yet initialised (the decoder initialises every layer)."""
    return mixer_class(name)(cfg.mixer_config(name, layer_idx))


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy in nats of logits [B, T, V] against targets [B, T], in fp32 or wider, the mean over the
    targets (or, with reduction="sum", their sum); targets of -100 are ignored."""
    return F.cross_entropy(at_least_fp32(logits).flatten(0, 1), targets.flatten(), ignore_index=-100,
                           reduction=reduction)


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.vocab_size <= 0:
            raise ConfigError("model.vocab_size must be set (the training entry point takes it from the tokenizer)")
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.position = nn.Embedding(cfg.positions, cfg.d_model) if cfg.positions else None
        self.dropout = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(
            Block(cfg, build_layer_mixer(cfg, name, i)) for i, name in enumerate(cfg.layer_mixers())
        )
        self.norm = norm(cfg)
        self.head = nn.Linear(cfg.d_model, cfg.output_size or cfg.vocab_size, bias=False)
        self._init_weights()
        if cfg.tie_embeddings:
            if cfg.output_size not in (0, cfg.vocab_size):
                raise ConfigError(f"model.output_size={cfg.output_size} differs from the vocabulary, so the head "
                                  "cannot be tied to the embedding: set model.tie_embeddings=false")
            self.head.weight = self.embed.weight

    def _init_weights(self) -> None:
        """N(0, 0.02) for the embeddings and the head; each mixer initialises itself for this depth
        (Mixer.reset_parameters), and the feed-forward blocks alike: their down projection, which writes into
        the residual stream, gets 0.02 / sqrt(2 n_layers) (GPT-2). In module order, so that a seed gives the
        same weights it always has."""
        nn.init.normal_(self.embed.weight, std=0.02)
        if self.position is not None:
            nn.init.normal_(self.position.weight, std=0.02)
        for block in self.blocks:
            block.mixer.reset_parameters(self.cfg.n_layers)
            if block.mlp is not None:
                block.mlp.reset_parameters(self.cfg.n_layers)
        nn.init.normal_(self.head.weight, std=0.02)

    def forward(self, tokens: torch.Tensor, states: list | None = None, start: int | torch.Tensor = 0,
                cu_seqlens: torch.Tensor | None = None, keep_states: bool = True, context=None):
        """tokens [B, T] -> (logits [B, T, vocab], per-layer states to continue from).

        start: the position of tokens[:, 0] in its sequence (the tokens the states have seen), or one per row
        [B] where rows have seen different numbers (after a padded prompt); only learned position embeddings
        need it.
        states: a layer's state may be a list of one state per row, as packed and padded reads return them.
        cu_seqlens: packed sequences, tokens [1, N] holding sequences that start at cu_seqlens (0, ...,
        N; flash-linear-attention's convention): each is read from a fresh state and its positions count from
        0, and every layer's state is a list, one per sequence (None without keep_states: training and
        scoring need no states, and the mixers then take their fastest packed form).
        context: this rank holds one shard of every sequence (ops.cp.Context; tokens [B, T_shard], the
        shards of equal length), the ranks of its group the others: the logits are those of the whole sequences at
        this shard's positions, and a recurrent layer's state is the whole sequences' final one on every rank
        (attention, which would need every rank's keys, and packed documents keep none).
        """
        x = self.embed(tokens)
        if self.position is not None:
            x = x + self.position(self._positions(tokens, start, cu_seqlens, context))
        x = self.dropout(x)
        states = states if states is not None else [None] * len(self.blocks)
        if len(states) != len(self.blocks):
            raise UserError(f"states holds {len(states)} layers' states, the model {len(self.blocks)}: give it the "
                            "states this model returned, or None to start afresh")
        new_states = []
        for block, state in zip(self.blocks, states, strict=True):
            x, state = block(x, state, cu_seqlens, keep_states, context)
            new_states.append(state)
        return self.head(self.norm(x)), new_states

    def _positions(self, tokens: torch.Tensor, start: int | torch.Tensor, cu_seqlens: torch.Tensor | None,
                   context=None) -> torch.Tensor:
        """The position of every token in its sequence, for the learned position embeddings: [T], or [B, T] given
        a start per row (a shard's: in its sequence or document)."""
        if context is not None:
            position = context.documents(cu_seqlens, tokens.shape[1]).positions.to(tokens.device)
            first, last = int(position.min()), int(position.max())
        elif cu_seqlens is None:
            position = torch.as_tensor(start, device=tokens.device)[..., None] + torch.arange(
                tokens.shape[1], device=tokens.device)
            first, last = int(position.min()), int(position.max())
        else:  # counted from each sequence's start
            first, last = 0, int(cu_seqlens.diff().max()) - 1
            position = positions_in_sequences(cu_seqlens, tokens.device)
        if last >= self.cfg.positions:
            raise ConfigError(f"positions {first}..{last} are beyond the model's {self.cfg.positions} "
                              "learned position embeddings (model.positions): give it at most "
                              f"{self.cfg.positions} tokens per sequence")
        return position

    def forward_padded(self, tokens: torch.Tensor, attention_mask: torch.Tensor):
        """tokens [B, T] padded on the left or the right, attention_mask [B, T] (1: a token, 0: padding, one run of
        tokens per row) -> (logits [B, T, vocab], per-layer states, one per row): every row read on its own, as one
        packed forward of the rows' tokens. The states have seen only the tokens, so padding changes nothing; a
        pad's logits are those of the last token before it (zero before the first)."""
        lengths = check_padding(attention_mask, tokens.shape)
        keep = attention_mask.bool()
        cu_seqlens = F.pad(lengths.cumsum(0), (1, 0))
        logits, states = self(tokens[keep][None], cu_seqlens=cu_seqlens)
        # each position's last token at or before it: its index in the packed row, or -1 before the first
        last = (keep.long().cumsum(1) - 1 + cu_seqlens[:-1, None]).masked_fill(keep.long().cummax(1).values == 0, -1)
        padded = F.pad(logits[0], (0, 0, 0, 1))  # a row of zeros at index -1
        return padded[last], states

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """Mean next-token cross-entropy in nats; targets of -100 are ignored (a packed row's caller sets the
        target of each sequence's last token to -100: nothing is predicted across a boundary)."""
        logits, _ = self(tokens, cu_seqlens=cu_seqlens, keep_states=False)
        return next_token_loss(logits, targets)

    def compile_blocks(self, log=print) -> None:
        """torch.compile each block in place (parameter names unchanged), except those whose mixer
        declares a compile_exclusion: they stay eager and the reason is logged. Dynamo's caches are emptied
        first: to dynamo every block of every model is one function, Block.forward, which it stops compiling
        after recompile_limit (8) variants, so a process that trains model after model (a suite) would
        otherwise train its later models eagerly. Models compiled earlier recompile when next called."""
        torch._dynamo.reset()
        for i, block in enumerate(self.blocks):
            reason = block.mixer.compile_exclusion
            if reason:
                log(f"block {i} ({block.mixer.name}) runs eagerly under train.compile: {reason}")
            else:
                block.compile()

    def read_limit(self) -> tuple[int, str] | None:
        """(the most tokens one read can hold, what sets it): the learned position embeddings or a mixer's own
        limit (its config's read_limit), the smallest; None where reads are unbounded."""
        limits = [block.mixer.cfg.read_limit for block in self.blocks]
        limits.append((self.cfg.positions, f"model.positions={self.cfg.positions}") if self.cfg.positions else None)
        return min((limit for limit in limits if limit is not None), default=None)

    def init_states(self, batch: int, device=None, dtype=None) -> list:
        return [block.mixer.init_state(batch, device, dtype) for block in self.blocks]

    def state_size(self, seq_len: int) -> int:
        """Numbers held per sequence by all mixers after seq_len tokens."""
        return sum(block.mixer.state_size(seq_len) for block in self.blocks)

    @contextmanager
    def ablated(self):
        """Every layer's mixer without its paper's own component (Mixer.ablated) while the block runs."""
        with ExitStack() as stack:
            for block in self.blocks:
                if (ablation := block.mixer.ablated()) is not None:
                    stack.enter_context(ablation)
            yield

    def ablates(self) -> bool:
        """Whether any layer's mixer has a component to ablate."""
        return any(block.mixer.ablated() is not None for block in self.blocks)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @torch.no_grad()
    def generate(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        context: int | None = None,
        top_p: float | None = None,
        repetition_penalty: float = 1.0,
        num_samples: int = 1,
        finished: Callable[[torch.Tensor], torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
        on_token: Callable[[torch.Tensor], None] | None = None,
    ) -> torch.Tensor:
        """Continue prompt [B, T0] by up to max_new_tokens tokens, decoding incrementally through the mixer
        states (one prefill, then one token per step). The sampling options are those of transformers'
        generate (see Sampling); temperature 0 picks the most likely token.

        num_samples: independent continuations of each prompt row, as consecutive rows of the result
        [B * num_samples, T0 + new tokens] (transformers' num_return_sequences).
        finished: called after each new token with the rows so far; returns which rows are done (bool
        [rows]). Generation ends once all are; rows done earlier go on sampling until then, for the caller
        to cut.
        on_token: called after each new token with the rows so far, before `finished` (to show them as they
        come; an interrupted caller keeps the last rows it was given).
        context: the most tokens the model sees at once, for models trained on shorter windows than the
        text to generate. When the view grows past it, the model re-reads the newest context // 2
        tokens from a fresh state and continues incrementally from there. None: the view is unbounded.
        attention_mask: prompts of different lengths padded on the left or the right [B, T0] (1: a token,
        0: padding): every row's next-token distributions are those it has alone (so greedy decoding gives it
        exactly its own continuation). The result keeps the prompt's layout, padding
        included, and appends the new tokens (as transformers' generate does): its tokens are where
        cat(attention_mask, ones) is 1.
        """
        sampling = Sampling(temperature, top_k, top_p, repetition_penalty)
        _check_generate_arguments(prompt, max_new_tokens, num_samples, context)
        out = prompt.repeat_interleave(num_samples, dim=0)
        lengths = None if attention_mask is None else check_padding(attention_mask, prompt.shape)
        self._check_reach(prompt.shape[1] if lengths is None else int(lengths.max()), max_new_tokens, context)
        if lengths is not None and bool((lengths < prompt.shape[1]).any()):
            if context is not None:
                raise ConfigError("context (a sliding view) is not available for a padded batch: pass context=None, "
                                  "or generate the prompts one at a time")
            mask, seen = (t.repeat_interleave(num_samples, dim=0) for t in (attention_mask, lengths))
            return self._generate_padded(out, mask, seen, max_new_tokens, sampling, generator, finished, on_token)
        return self._generate_rows(out, max_new_tokens, sampling, generator, finished, context, on_token)

    def _check_reach(self, prompt_length: int, max_new_tokens: int, context: int | None) -> None:
        """A ConfigError, before any work, where generating would read more tokens at once than the model can
        (read_limit): its last token is sampled, not read."""
        limit = self.read_limit()
        reach = prompt_length + max(max_new_tokens - 1, 0)
        if limit is None or min(reach, context or reach) <= limit[0]:
            return
        most, why = limit
        fixes = [f"max_new_tokens at most {most - prompt_length + 1}"] if prompt_length <= most else []
        raise ConfigError(f"generating {max_new_tokens} tokens after a prompt of {prompt_length} would read "
                          f"{min(reach, context or reach)} tokens at once, beyond the {most} this model can read "
                          f"({why}); give {', or '.join([*fixes, f'a context of at most {most}'])}")

    def _generate_rows(self, out: torch.Tensor, max_new_tokens: int, sampling: Sampling, generator, finished,
                       context: int | None, on_token=None) -> torch.Tensor:
        """generate over rows without padding: one prefill of the view, then one token per step (the view
        re-read from a fresh state when it grows past context)."""
        view_start = 0 if context is None else max(0, out.shape[1] - context)
        logits, states = self(out[:, view_start:])
        rows = Rows(out)
        for i in range(max_new_tokens):
            token = sampling.pick(logits[:, -1].float(), out, generator)
            out = rows.append(token)
            if on_token is not None:
                on_token(out)
            if i + 1 == max_new_tokens or (finished is not None and bool(finished(out).all())):
                break
            if context is not None and out.shape[1] - view_start > context:
                view_start = out.shape[1] - context // 2
                logits, states = self(out[:, view_start:])
            else:  # the token's position counts from the start of the current view
                logits, states = self(token, states, start=out.shape[1] - 1 - view_start)
        return out.contiguous()  # the rows without the buffer's room

    def _generate_padded(self, out: torch.Tensor, mask: torch.Tensor, seen: torch.Tensor, max_new_tokens: int,
                         sampling: Sampling, generator, finished, on_token=None) -> torch.Tensor:
        """generate for rows padded as `mask` marks: one padded read (each row alone), then one token per row and
        step, each continuing its own row's states (batched where they stack)."""
        logits, states = self.forward_padded(out, mask)
        last_token = out.gather(1, (mask.long().cumsum(1).argmax(1))[:, None])  # stands in for pads in the penalty
        for i in range(max_new_tokens):
            token = sampling.pick(logits[:, -1].float(), torch.where(mask.bool(), out, last_token), generator)
            out, mask = torch.cat((out, token), dim=1), F.pad(mask, (0, 1), value=1)
            if on_token is not None:
                on_token(out)
            if i + 1 == max_new_tokens or (finished is not None and bool(finished(out).all())):
                break
            logits, states = self(token, states, start=seen + i)
        return out


class Rows:
    """Token rows [B, T] that grow by one column at a time in a buffer that doubles when full: concatenating
    would copy every row at every token, a cost quadratic in the length of long generations."""

    def __init__(self, rows: torch.Tensor):
        self.buffer, self.length = rows, rows.shape[1]

    def append(self, column: torch.Tensor) -> torch.Tensor:
        """The rows with column [B, 1] after them (a view: earlier views keep what they held)."""
        if self.length == self.buffer.shape[1]:
            grown = self.buffer.new_empty(self.buffer.shape[0], 2 * self.length + 1)
            grown[:, : self.length] = self.buffer[:, : self.length]
            self.buffer = grown
        self.buffer[:, self.length] = column[:, 0]
        self.length += 1
        return self.buffer[:, : self.length]


def check_padding(attention_mask: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """The number of tokens in each row of a padded batch of this shape; a ConfigError unless attention_mask
    [B, T] has the shape, holds only 0 and 1, and marks one run of at least one token per row."""
    if attention_mask.shape != shape:
        raise ConfigError(f"attention_mask has shape {list(attention_mask.shape)}, the tokens {list(shape)}: give "
                          "one entry per token (1: a token, 0: padding)")
    if bool(((attention_mask != 0) & (attention_mask != 1)).any()):
        raise ConfigError("attention_mask must hold only 1 (a token) and 0 (padding)")
    mask = attention_mask.long()
    runs = (mask[:, 1:] > mask[:, :-1]).sum(1) + mask[:, 0]
    if bool((runs != 1).any()):
        row = int((runs != 1).nonzero()[0])
        raise ConfigError(f"attention_mask row {row} marks {int(runs[row])} runs of tokens: each row must hold one, "
                          "padded on the left or the right")
    return mask.sum(1)


def _check_generate_arguments(prompt: torch.Tensor, max_new_tokens: int, num_samples: int, context: int | None):
    if prompt.ndim != 2 or prompt.shape[1] == 0:
        raise ConfigError("prompt must be a non-empty [batch, length] tensor of token ids")
    if max_new_tokens < 0:
        raise ConfigError(f"max_new_tokens={max_new_tokens} must be 0 or more")
    if num_samples < 1:
        raise ConfigError(f"num_samples={num_samples} must be 1 or more")
    if context is not None and context < 2:
        raise ConfigError(f"context={context} must be 2 or more (the view re-reads its newest half when full), "
                          "or None for an unbounded view")


@dataclass(frozen=True)
class Sampling:
    """How generate picks each token, as transformers' generate does: the repetition penalty on the logits,
    then the temperature, then top-k, then top-p.

    temperature: the logits are divided by it; 0 picks the most likely token (after the penalty).
    top_k: only the k most likely tokens can be drawn (None: all).
    top_p: only the smallest set of most likely tokens whose probability reaches top_p, and always the most
    likely one (nucleus sampling, Holtzman et al. 2020; None or 1: all).
    repetition_penalty: CTRL's (Keskar et al. 2019): the logit of every token already in the row, prompt
    included, is divided by it where positive and multiplied by it where negative (1: none; above 1
    discourages repeats).
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float = 1.0

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ConfigError(f"temperature={self.temperature} must be 0 (the most likely token) or more")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"top_k={self.top_k} must be 1 or more, or None for every token")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p={self.top_p} must be above 0 and at most 1, or None for every token")
        if not self.repetition_penalty > 0:
            raise ConfigError(f"repetition_penalty={self.repetition_penalty} must be above 0 (1: no penalty)")

    def pick(self, logits: torch.Tensor, seen: torch.Tensor, generator=None) -> torch.Tensor:
        """One token id per row of logits [B, vocab], given the tokens of each row so far, seen [B, S]."""
        if self.repetition_penalty != 1:
            logits = penalize_repeats(logits, seen, self.repetition_penalty)
        if self.temperature == 0:
            return logits.argmax(-1, keepdim=True)
        logits = (logits - logits.amax(-1, keepdim=True)) / self.temperature  # shifted first: no overflow when small
        if self.top_k is not None and self.top_k < logits.shape[-1]:
            logits = keep_top_k(logits, self.top_k)
        if self.top_p is not None and self.top_p < 1:
            logits = keep_top_p(logits, self.top_p)
        return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)


def penalize_repeats(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """logits [B, vocab] with the logit l of every token in seen [B, S] made l / penalty if l > 0, else
    l * penalty."""
    scores = logits.gather(1, seen)
    penalized = torch.where(scores > 0, scores / penalty, scores * penalty)
    finite = torch.finfo(logits.dtype)  # a penalty far from 1 would overflow to inf, and the softmax to nan
    return logits.scatter(1, seen, penalized.clamp(finite.min, finite.max))


def keep_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """logits [B, vocab] with -inf for all but the k largest of each row (ties with the k-th stay)."""
    kth = torch.topk(logits, k).values[:, -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def keep_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """logits [B, vocab] with -inf for all but the smallest set of most likely tokens whose probability
    reaches p, in transformers' form: drop the least likely tokens while their probabilities sum to at most
    1 - p, and never the most likely one."""
    ascending, order = logits.sort(dim=-1)
    dropped = torch.softmax(ascending, dim=-1).cumsum(dim=-1) <= 1 - p
    dropped[:, -1] = False
    return logits.masked_fill(dropped.scatter(1, order, dropped), float("-inf"))
