"""The KV cache grows in place: no copy of the cache per token, branches stay intact, sliding windows trim."""

import pytest
import torch

from attnlab.mixers import KVCache, build_mixer
from helpers import CASE_IDS, CASES

ATTENTION = [(case_id, name, options) for case_id, (name, options) in zip(CASE_IDS, CASES, strict=True)
             if isinstance(build_mixer(name, d_model=16, n_heads=2, **options).init_state(1), KVCache)]


@pytest.mark.parametrize("name, options", [case[1:] for case in ATTENTION], ids=[case[0] for case in ATTENTION])
@torch.no_grad()
def test_decoding_moves_the_cache_a_logarithmic_number_of_times(name, options):
    torch.manual_seed(0)
    mixer = build_mixer(name, d_model=16, n_heads=2, **options).double()
    steps = 9 if name == "boltzmann" and not _slides(mixer) else 200  # exact windows hold 12 keys here
    x = torch.randn(1, steps + 3, 16, dtype=torch.float64)
    _, state = mixer(x[:, :3])
    moves = 0
    for t in range(3, steps + 3):
        before = state.k_buffer.data_ptr()
        _, state = mixer(x[:, t : t + 1], state)
        moves += state.k_buffer.data_ptr() != before
    # a copy per token would move it every step; doubling moves it about log2(steps) times (a sliding window
    # moves its few keys to the front once per window instead)
    limit = steps / (mixer.cfg.window - 1) + 2 if _slides(mixer) else steps.bit_length() + 1
    assert moves <= limit


def _slides(mixer) -> bool:
    return getattr(mixer.cfg, "sliding", lambda: False)()


@torch.no_grad()
def test_two_continuations_of_one_prefix_do_not_overwrite_each_other():
    torch.manual_seed(0)
    mixer = build_mixer("softmax", d_model=16, n_heads=2).double()
    x = torch.randn(1, 7, 16, dtype=torch.float64)
    a, b = torch.randn(2, 1, 1, 16, dtype=torch.float64)
    _, prefix = mixer(x)
    y_a, after_a = mixer(a, prefix)
    keys_a = after_a.k.clone()
    y_b, after_b = mixer(b, prefix)  # the same prefix again: must not write over a's token
    assert torch.equal(after_a.k, keys_a)
    torch.testing.assert_close(y_a, mixer(torch.cat((x, a), 1))[0][:, -1:], rtol=0, atol=1e-12)
    torch.testing.assert_close(y_b, mixer(torch.cat((x, b), 1))[0][:, -1:], rtol=0, atol=1e-12)


@torch.no_grad()
def test_a_sliding_boltzmann_cache_keeps_its_window_and_says_so():
    torch.manual_seed(0)
    options = dict(inference="banded", couplings="distance", band=2, window=6, j_init_std=0.3)
    mixer = build_mixer("boltzmann", d_model=16, n_heads=2, **options).double()
    x = torch.randn(1, 40, 16, dtype=torch.float64)
    full, _ = mixer(x)
    y, state = mixer(x[:, :10])
    outputs = [y]
    for t in range(10, 40):
        y, state = mixer(x[:, t : t + 1], state)
        outputs.append(y)
        assert state.length == 5  # window - 1 keys: all the next token can see
    torch.testing.assert_close(torch.cat(outputs, 1), full, rtol=0, atol=1e-10)
    assert mixer.state_size(40) == state.k.numel() + state.v.numel() == 2 * 16 * 5


@torch.no_grad()
def test_narrower_keys_are_widened_into_the_cache_and_wider_ones_widen_it():
    bf16 = torch.ones(1, 2, 1, 4, dtype=torch.bfloat16)
    cache = KVCache.holding(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4)).extend(bf16, bf16)  # full: moved
    narrow = cache.extend(bf16, bf16)
    assert narrow.k.dtype == narrow.v.dtype == torch.float32 and narrow.k_buffer.data_ptr() == cache.k_buffer.data_ptr()
    assert torch.equal(narrow.v[:, :, -2:], torch.ones(1, 2, 2, 4))
    wide = narrow.extend(torch.ones(1, 2, 1, 4), torch.ones(1, 2, 1, 4, dtype=torch.float64))
    assert wide.k.dtype == torch.float32 and wide.v.dtype == torch.float64  # as torch.cat would give each
    assert wide.v.shape[2] == 6


def test_a_cache_written_in_inference_mode_extends_outside_it():
    token = torch.ones(1, 2, 1, 4)
    with torch.inference_mode():  # moved into buffers with room to spare, made in inference mode
        cache = KVCache.holding(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4)).extend(token, token)
    with torch.no_grad():
        longer = cache.extend(token, token)
    assert longer.k.shape[2] == 5 and not longer.k_buffer.is_inference()
