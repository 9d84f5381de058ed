"""attnlab in Hugging Face transformers: importing this registers its config, causal LM and tokenizer with the Auto
classes. ``import attnlab`` does it as soon as transformers is imported."""

from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from .modeling import AttnlabConfig, AttnlabForCausalLM, DecoderStates
from .tokenization import AttnlabTokenizer, hf_tokenizer

AutoConfig.register(AttnlabConfig.model_type, AttnlabConfig, exist_ok=True)
AutoModelForCausalLM.register(AttnlabConfig, AttnlabForCausalLM, exist_ok=True)
AutoTokenizer.register(AttnlabConfig, tokenizer_class=AttnlabTokenizer, exist_ok=True)

__all__ = ["AttnlabConfig", "AttnlabForCausalLM", "AttnlabTokenizer", "DecoderStates", "hf_tokenizer"]
