"""attnlab's decoder as a transformers model: a config, a causal LM and the mixer states as its cache.

The model holds attnlab's own `Decoder`, so its logits are attnlab's. `generate` carries every layer's
mixer state between steps (a KV cache for attention, a fixed-size recurrent state for the linear and
state-space mixers): one prefill, then one token per step.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedConfig, PreTrainedModel
from transformers.utils import ModelOutput
from transformers.utils import logging as hf_logging

from ..config import ModelConfig
from ..errors import UserError
from ..model import Decoder, next_token_loss
from ..typed import from_dict
from .remote import MODEL_AUTO_MAP, SavesRemoteModule, write_module


@contextmanager
def progress_bars_on_terminals_only():
    """transformers' progress bars ("Writing model shards", "Loading weights") off while stderr is not a terminal:
    in a log or a pipe every redraw of a bar is a line of noise. Left as they are on a terminal, or where the user
    turned them off."""
    if getattr(sys.stderr, "isatty", lambda: False)() or not hf_logging.is_progress_bar_enabled():
        yield
        return
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars

    hub_bars_off = are_progress_bars_disabled()
    hf_logging.disable_progress_bar()  # transformers' bars and the Hub's downloads alike
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()
        if hub_bars_off:
            disable_progress_bars()


class AttnlabConfig(SavesRemoteModule, PreTrainedConfig):
    """attnlab's model section (`attnlab`), plus the few fields transformers' tools read by name."""

    model_type = "attnlab"

    def __init__(self, attnlab: dict | None = None, max_position_embeddings: int | None = None, **kwargs):
        self.attnlab = dict(attnlab or {})
        # the longest sequence the model was trained on: tools (lm-eval) read it as the model's window
        self.max_position_embeddings = max_position_embeddings
        model = self.model_config()
        kwargs.setdefault("tie_word_embeddings", model.tie_embeddings)
        super().__init__(**kwargs)
        self.vocab_size = model.vocab_size
        self.hidden_size = model.d_model
        self.num_hidden_layers = model.n_layers
        self.num_attention_heads = model.n_heads

    def save_pretrained(self, save_directory, **kwargs):
        self.auto_map = dict(MODEL_AUTO_MAP)
        super().save_pretrained(save_directory, **kwargs)
        write_module(save_directory)

    def model_config(self) -> ModelConfig:
        cfg = from_dict(ModelConfig, self.attnlab, "attnlab")
        cfg.validate()
        return cfg


@dataclass
class DecoderStates:
    """Every layer's mixer state after `seen` columns of input: generate's cache. tokens: the tokens each row's
    states have read, [B] after a padded prompt (its padding is not read), else the same as seen."""

    layers: list
    seen: int
    tokens: int | torch.Tensor


@dataclass
class AttnlabOutput(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    states: DecoderStates | None = None


class AttnlabForCausalLM(SavesRemoteModule, PreTrainedModel, GenerationMixin):
    config_class = AttnlabConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _tied_weights_keys = {"model.head.weight": "model.embed.weight"}

    def __init__(self, config: AttnlabConfig):
        super().__init__(config)
        self.model = Decoder(config.model_config())
        self.post_init()
        # the eos token is the newline, which ends a line rather than a text: generate runs for max_new_tokens,
        # as attnlab's own does, unless given eos_token_id
        self.generation_config.eos_token_id = None

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        with progress_bars_on_terminals_only():
            return super().from_pretrained(*args, **kwargs)

    def save_pretrained(self, *args, **kwargs):
        with progress_bars_on_terminals_only():
            return super().save_pretrained(*args, **kwargs)

    def _init_weights(self, module):
        """The decoder initialises its parameters when built; only computed buffers (RoPE's frequencies)
        are filled here, for when transformers builds the model on the meta device and loads the weights."""
        if hasattr(module, "reset_buffers"):
            module.reset_buffers()

    def get_input_embeddings(self):
        return self.model.embed

    def set_input_embeddings(self, value):
        self.model.embed = value

    def get_output_embeddings(self):
        return self.model.head

    def set_output_embeddings(self, value):
        self.model.head = value

    def forward(self, input_ids: torch.LongTensor, states: DecoderStates | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.LongTensor | None = None,
                use_cache: bool = True, return_dict: bool | None = None, **kwargs) -> AttnlabOutput:
        """input_ids [B, T] continue `states` (None: a fresh sequence). labels: the inputs themselves, as in
        transformers (the model shifts them); -100 is ignored. attention_mask: rows padded on the left or the
        right, each read on its own (Decoder.forward_padded): padding never enters the states, a pad's logits are
        those of the row's last token before it, and no label is predicted from or at a pad."""
        seen = states.seen if states is not None else 0
        mask = _padding(attention_mask, seen + input_ids.shape[1])
        if states is None and mask is not None:
            logits, layers = self.model.forward_padded(input_ids, mask)
            read = mask.sum(1)
        else:
            if mask is not None and not bool(mask[:, seen:].all()):
                raise UserError("attention_mask marks padding among the new tokens of a continued sequence; pad only "
                                "the prompt (the first call), on the left or the right")
            start = states.tokens if states is not None else 0
            logits, layers = self.model(input_ids, states.layers if states is not None else None, start=start)
            read = start + input_ids.shape[1]
        loss = None
        if labels is not None:
            if mask is not None:  # a label at a pad, or after one, has nothing of its own row to predict it from
                unread = ~(mask[:, seen:].bool() & F.pad(mask[:, seen:], (1, 0))[:, :-1].bool())
                labels = labels.masked_fill(unread, -100)
            loss = next_token_loss(logits[:, :-1], labels[:, 1:])
        states = DecoderStates(layers, seen + input_ids.shape[1], read) if use_cache else None
        output = AttnlabOutput(loss=loss, logits=logits, states=states)
        return output if return_dict is not False else output.to_tuple()

    # generate: the mixer states are the cache, under their own name (not a transformers Cache)

    def generate(self, *args, **kwargs):
        """transformers' generate: greedy search and sampling. Beam search is refused: it would have to
        reorder every mixer's state between steps, which transformers does only for its own caches."""
        config = kwargs.get("generation_config") or self.generation_config
        if max(kwargs.get("num_beams") or 1, config.num_beams or 1) > 1:
            raise UserError("attnlab models generate by greedy search or sampling; beam search (num_beams > 1) is "
                            "not supported: drop num_beams")
        return super().generate(*args, **kwargs)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False

    def prepare_inputs_for_generation(self, input_ids, states: DecoderStates | None = None, attention_mask=None,
                                      use_cache: bool = True, **kwargs):
        """Only the tokens the states have not seen: the whole prompt first, then one token per step."""
        if states is not None:
            input_ids = input_ids[:, states.seen:]
        return {"input_ids": input_ids, "states": states, "attention_mask": attention_mask, "use_cache": use_cache}

    def _update_model_kwargs_for_generation(self, outputs, model_kwargs, is_encoder_decoder=False,
                                            num_new_tokens: int = 1):
        model_kwargs["states"] = outputs.states
        return super()._update_model_kwargs_for_generation(outputs, model_kwargs, is_encoder_decoder, num_new_tokens)


def _padding(mask: torch.Tensor | None, length: int) -> torch.Tensor | None:
    """The attention mask of the sequence so far if it marks any padding, else None."""
    if mask is None or bool(mask.all()):
        return None
    if mask.shape[1] != length:
        raise UserError(f"attention_mask covers {mask.shape[1]} tokens where the model has seen {length}; pass the "
                        "mask of the whole sequence so far")
    return mask
