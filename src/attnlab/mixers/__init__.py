"""Token mixers. Importing this package registers every built-in mixer."""

from . import boltzmann, coupled_qk, differential, interdomain, linear, s4d, softmax  # noqa: F401  (registration)
from .attention import AttentionConfig, AttentionMixer, KVCache
from .base import Mixer, MixerConfig
from .registry import (
    build_mixer,
    list_mixers,
    mixer_class,
    mixer_config,
    mixer_fields,
    register_mixer,
)

__all__ = [
    "AttentionConfig", "AttentionMixer", "KVCache", "Mixer", "MixerConfig", "build_mixer", "list_mixers",
    "mixer_class", "mixer_config", "mixer_fields", "register_mixer",
]
