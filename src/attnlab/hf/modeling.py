"""attnlab's decoder as a transformers model: a config, a causal LM and the mixer states as its cache.

The model holds attnlab's own `Decoder`, so its logits are attnlab's. `generate` carries every layer's
mixer state between steps (a KV cache for attention, a fixed-size recurrent state for the linear, SSM and
interdomain mixers): one prefill, then one token per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import GenerationMixin, PreTrainedConfig, PreTrainedModel
from transformers.utils import ModelOutput

from ..config import ModelConfig
from ..errors import UserError
from ..model import Decoder, next_token_loss
from ..typed import from_dict
from .remote import MODEL_AUTO_MAP, SavesRemoteModule, write_module


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
    """Every layer's mixer state after `seen` tokens of each sequence: generate's cache."""

    layers: list
    seen: int


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
        transformers (the model shifts them); -100 is ignored. attention_mask may only mark right padding:
        the mixers are causal, so padding after a sequence cannot change its logits."""
        _check_right_padded(attention_mask, input_ids.shape[1] + (states.seen if states else 0))
        start = states.seen if states is not None else 0
        logits, layers = self.model(input_ids, states.layers if states is not None else None, start=start)
        loss = None
        if labels is not None:
            loss = next_token_loss(logits[:, :-1], labels[:, 1:])
        states = DecoderStates(layers, start + input_ids.shape[1]) if use_cache else None
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


def _check_right_padded(mask: torch.Tensor | None, length: int) -> None:
    """Left padding would put pad tokens inside the mixers' states; refuse it rather than return wrong logits.
    generate appends each new token's mask after the padding, so a padded batch cannot be generated either."""
    if mask is None or bool(mask.all()):
        return
    if mask.shape[1] != length:
        raise UserError(f"attention_mask covers {mask.shape[1]} tokens where the model has seen {length}; pass the "
                        "mask of the whole sequence so far")
    if bool((mask[:, 1:] > mask[:, :-1]).any()):
        if bool(mask[:, 0].all()):  # right-padded prompts with generated tokens appended after the padding
            raise UserError("attnlab models cannot generate from a padded batch (the new tokens would follow the "
                            "padding); generate one prompt at a time, or prompts of one length")
        raise UserError("attnlab models take padding only on the right (tokenizer.padding_side='right'): their "
                        "mixers carry state from token to token, so left padding would change the result")
