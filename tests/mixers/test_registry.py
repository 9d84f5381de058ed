import pytest

from attnlab.errors import ConfigError
from attnlab.mixers import Mixer, build_mixer, list_mixers, mixer_class, mixer_fields, register_mixer


def test_builtin_mixers_are_registered():
    assert {"softmax", "sigmoid", "differential"} <= set(list_mixers())


def test_unknown_mixer_lists_known_and_suggests():
    with pytest.raises(ConfigError) as err:
        build_mixer("sofmax")
    message = str(err.value)
    assert "did you mean 'softmax'" in message and "differential" in message


def test_unknown_field_suggests_closest():
    with pytest.raises(ConfigError, match=r"softmax\.rop'; did you mean 'softmax\.rope'"):
        build_mixer("softmax", rop=False)


def test_field_type_is_checked():
    with pytest.raises(ConfigError, match="softmax.rope='yes' must be of type bool"):
        build_mixer("softmax", rope="yes")


def test_heads_must_divide_width():
    with pytest.raises(ConfigError, match="n_heads=5 must be positive and divide d_model=32"):
        build_mixer("softmax", d_model=32, n_heads=5)


def test_fields_are_listed():
    assert {"d_model", "n_heads", "rope", "bias"} <= set(mixer_fields("sigmoid"))


def test_duplicate_registration_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        register_mixer("softmax")(type("Other", (Mixer,), {}))


def test_a_mixer_from_one_file_is_covered_by_the_registry_tests():
    """examples/ema_mixer.py, imported by conftest.py and edited nowhere else, is in the registry and in
    the cases every contract and property test enumerates."""
    import ema_mixer

    from helpers import CASE_IDS
    assert mixer_class("ema") is ema_mixer.ExponentialMovingAverage
    assert "ema" in CASE_IDS
