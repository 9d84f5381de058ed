"""The registry of mixers: the names they are built by (the protocol itself is `mixers.base`)."""

from __future__ import annotations

from dataclasses import fields

from ..errors import ConfigError, unknown_name
from ..typed import from_dict
from .base import Mixer, MixerConfig

_REGISTRY: dict[str, type[Mixer]] = {}


def register_mixer(name: str):
    """Class decorator: ``@register_mixer("softmax")`` makes the mixer buildable by name."""

    def add(cls: type[Mixer]) -> type[Mixer]:
        if name in _REGISTRY:
            raise ValueError(f"mixer '{name}' is already registered by {_REGISTRY[name].__qualname__}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return add


def list_mixers() -> list[str]:
    return sorted(_REGISTRY)


def mixer_class(name: str) -> type[Mixer]:
    if name not in _REGISTRY:
        raise ConfigError(unknown_name("mixer", name, _REGISTRY))
    return _REGISTRY[name]


def mixer_fields(name: str) -> list[str]:
    return [f.name for f in fields(mixer_class(name).config_class)]


def mixer_config(name: str, where: str | None = None, **options) -> MixerConfig:
    """The validated, typed config of a registered mixer; `where` names its place in error messages."""
    cfg = from_dict(mixer_class(name).config_class, options, where=where or name)
    try:
        cfg.validate()
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}" if where else str(err)) from None
    return cfg


def build_mixer(name: str, **config) -> Mixer:
    """Build a registered mixer, initialised as one layer, e.g.
    ``build_mixer("softmax", d_model=256, n_heads=4, rope=False)``."""
    mixer = mixer_class(name)(mixer_config(name, **config))
    mixer.reset_parameters()
    return mixer
