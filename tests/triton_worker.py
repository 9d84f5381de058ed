"""Run by the tests of Triton kernels (tests/ops/test_fla_backend.py, tests/ops/test_ising_triton.py) in a
process of its own: fla's kernels and ours against the torch forms, on the CPU under Triton's interpreter.
TRITON_INTERPRET has to be set before triton and fla are imported, and it must not reach the rest of the test
session, hence the separate process.

Usage: triton_worker.py CHECK [CHECK ...]. Prints one JSON line mapping each check to null (passed) or its error.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"

import json
import sys
import tempfile
import traceback

import torch

import fla_interpreter
from attnlab.mixers import build_mixer
from attnlab.ops import fla, ising, ising_triton
from attnlab.ops.ccq import CCQStats, ccq_chunk, ccq_reference
from attnlab.ops.delta_rule import delta_rule_chunk
from attnlab.ops.gla import gla_chunk
from attnlab.ops.interdomain import READOUTS, interdomain_chunk
from helpers import grads_of, random_linear_inputs

fla_interpreter.apply()
# the interpreter runs the kernels as Python on one core, between torch ops on small tensors, where intra-op threads
# only contend: with the default (a thread a core) the worker took twice as long on two cores
torch.set_num_threads(1)

T = 37  # not a multiple of any chunk the kernels use
CHUNK = 16
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}  # fp32


def fp32_inputs(per_channel_decay=True, T=T, max_beta=1.0):
    """q, k (unit), v, log-decay, beta in (0, max_beta), initial state: fp32 leaves, B=1, H=2, D=16."""
    tensors = random_linear_inputs(B=1, H=2, T=T, K=16, V=16, per_channel_decay=per_channel_decay, max_beta=max_beta)
    return [t.detach().float().requires_grad_() for t in tensors]


def assert_forms_agree(torch_form, fla_form, inputs, names):
    """Outputs, final states and the gradient of every input (the initial state's included) agree."""
    o, state, grads = grads_of(torch_form, inputs)
    o_fla, state_fla, grads_fla = grads_of(fla_form, inputs)
    torch.testing.assert_close(o_fla, o, **TOLERANCE, msg=lambda m: f"output: {m}")
    torch.testing.assert_close(state_fla, state, **TOLERANCE, msg=lambda m: f"final state: {m}")
    for name, g_fla, g in zip(names, grads_fla, grads, strict=True):
        torch.testing.assert_close(g_fla, g, **TOLERANCE, msg=lambda m, name=name: f"gradient of {name}: {m}")


def check_gla():
    q, k, v, g, _, h0 = fp32_inputs(T=70)  # the GLA kernel picks its own chunk (64 here): two, the last partial
    assert_forms_agree(lambda q, k, v, g, h0: gla_chunk(q, k, v, g, initial_state=h0, chunk_size=CHUNK),
                       lambda q, k, v, g, h0: fla.gla_fla(q, k, v, g, initial_state=h0),
                       [q, k, v, g, h0], ["q", "k", "v", "g", "h0"])


def check_linear():
    q, k, v, g, _, h0 = fp32_inputs()
    zero = torch.zeros_like(g)
    assert_forms_agree(lambda q, k, v, h0: gla_chunk(q, k, v, zero, initial_state=h0, chunk_size=CHUNK),
                       lambda q, k, v, h0: fla.linear_fla(q, k, v, initial_state=h0, chunk_size=CHUNK),
                       [q, k, v, h0], ["q", "k", "v", "h0"])


def check_delta_rule():
    inputs = fp32_inputs(per_channel_decay=False, max_beta=2.0)  # beta past 1 too: GDN's negative_eigenvalues
    assert_forms_agree(lambda *x: delta_rule_chunk(*x[:5], initial_state=x[5], chunk_size=CHUNK),
                       lambda *x: fla.delta_rule_fla(*x[:5], initial_state=x[5], chunk_size=CHUNK),
                       inputs, ["q", "k", "v", "g", "beta", "h0"])


def ccq_form(ccq_op):
    """ccq_op over (q, k, lambda, P, m, n[, log_decay]) -> (q_clean, the final statistics in one tensor)."""

    def run(q, k, lam, second, total, count, *log_decay):
        q_clean, out = ccq_op(q, k, lam, CCQStats(second, total, count), *log_decay, chunk_size=CHUNK)
        return q_clean, torch.cat((out.second.flatten(2), out.total, out.count[..., None]), -1)

    return run


def ccq_check(decay: bool):
    q, k, _, g, _, _ = fp32_inputs(per_channel_decay=False)
    lam = torch.rand(q.shape[:3], generator=torch.Generator().manual_seed(2)).requires_grad_()
    # carried statistics as a sequence leaves them: those of 5 earlier keys
    earlier = torch.randn(1, 2, 5, 16, generator=torch.Generator().manual_seed(3))
    earlier = torch.nn.functional.normalize(earlier, dim=-1)
    _, stats = ccq_reference(earlier, earlier, torch.zeros(1, 2, 5))
    stats = [t.requires_grad_() for t in (stats.second, stats.total, stats.count)]
    inputs, names = [q, k, lam, *stats], ["q", "k", "lambda", "P", "m", "n"]
    if decay:
        inputs, names = [*inputs, g], [*names, "log_decay"]
    assert_forms_agree(ccq_form(ccq_chunk), ccq_form(fla.ccq_fla), inputs, names)


def check_ccq():
    ccq_check(decay=False)


def check_ccq_decay():
    ccq_check(decay=True)


def interdomain_inputs(T=70, B=2, H=2, M=8, R=16, D=16):
    """xi(q) (unit), z = [k ; v], lambda and B_bar (ZOH) from a random A and dt, C and a complex initial state:
    fp32 and complex64 leaves. M = 8 complex modes are 16 real channels, the narrowest the kernels take."""
    g = torch.Generator().manual_seed(7)
    xi_q = torch.nn.functional.normalize(torch.randn(B, H, T, R, generator=g), dim=-1)
    z = torch.randn(B, H, T, R + D, generator=g)
    A = torch.complex(-0.05 - 0.5 * torch.rand(H, M, generator=g), 3 * torch.randn(H, M, generator=g))
    dt = torch.tensor([[0.1], [0.02]])
    lam, B_bar = torch.exp(dt * A), (torch.exp(dt * A) - 1) / A
    C = torch.randn(H, M, M, dtype=torch.complex64, generator=g) / M**0.5
    X0 = torch.randn(B, H, M, R + D, dtype=torch.complex64, generator=g)
    return [t.requires_grad_() for t in (xi_q, z, lam, B_bar, C, X0)]


def real_state(form):
    """form -> (o, final state) with the complex state as a real view, for `grads_of`."""

    def run(*args):
        o, state = form(*args)
        return o, torch.view_as_real(state)

    return run


def check_interdomain():
    """Interdomain's query read on two fla reads against `interdomain_chunk`, every readout: T = 70 (two kernel
    chunks, the last partial), an initial state; every gradient, those of lambda, B_bar and C included."""
    inputs = interdomain_inputs()
    for readout in READOUTS:
        assert_forms_agree(real_state(lambda *x, r=readout: interdomain_chunk(*x[:5], r, x[5], chunk_size=CHUNK)),
                           real_state(lambda *x, r=readout: fla.interdomain_fla(*x[:5], r, x[5])),
                           inputs, [f"{name} ({readout})" for name in ("xi_q", "z", "lambda", "B_bar", "C", "X0")])


def check_bf16():
    """bf16 q, k, v (fp32 decays, beta and states), as under autocast: the outputs and gradients keep their
    dtypes, the states stay fp32, and the values agree with the torch forms to a few bf16 roundings."""
    q, k, v, g, beta, h0 = fp32_inputs(per_channel_decay=False)
    q, k, v = (x.detach().bfloat16().requires_grad_() for x in (q, k, v))
    g_channels = g.detach()[..., None].expand(q.shape).contiguous().requires_grad_()
    lam = torch.full(q.shape[:3], 0.5, requires_grad=True)
    empty = [t.requires_grad_() for t in (torch.zeros(1, 2, 16, 16), torch.zeros(1, 2, 16), torch.zeros(1, 2))]
    cases = [
        (lambda *x: gla_chunk(*x[:4], initial_state=x[4]), lambda *x: fla.gla_fla(*x[:4], initial_state=x[4]),
         [q, k, v, g_channels, h0]),
        (lambda q, k, v, h0: gla_chunk(q, k, v, torch.zeros(q.shape), initial_state=h0),
         lambda q, k, v, h0: fla.linear_fla(q, k, v, initial_state=h0, chunk_size=CHUNK), [q, k, v, h0]),
        (lambda *x: delta_rule_chunk(*x[:5], initial_state=x[5]),
         lambda *x: fla.delta_rule_fla(*x[:5], initial_state=x[5], chunk_size=CHUNK), [q, k, v, g, beta, h0]),
        (ccq_form(ccq_chunk), ccq_form(fla.ccq_fla), [q, k, lam, *empty, g]),
    ]
    for torch_form, fla_form, inputs in cases:
        expected, got = grads_of(torch_form, inputs), grads_of(fla_form, inputs)
        assert got[0].dtype == torch.bfloat16 and got[1].dtype == torch.float32, (got[0].dtype, got[1].dtype)
        assert [g.dtype for g in got[2]] == [x.dtype for x in inputs]
        for a, b in zip([got[0], got[1], *got[2]], [expected[0], expected[1], *expected[2]], strict=True):
            torch.testing.assert_close(a.float(), b.float(), rtol=0, atol=0.03 * b.float().abs().max().item())


def mixer_pair(name, **options):
    """The same mixer (the same parameters) with backend=torch and backend=fla."""
    config = dict(d_model=64, n_heads=2, chunk_size=CHUNK, **options)
    torch_mixer = build_mixer(name, backend="torch", **config)
    fla_mixer = build_mixer(name, backend="fla", **config)
    fla_mixer.load_state_dict(torch_mixer.state_dict())
    return torch_mixer, fla_mixer


def state_tensors(state):
    ccq = getattr(state, "ccq", None)
    ccq = [] if ccq is None else [ccq.second, ccq.total, ccq.count]
    return [t for t in (state.memory, state.conv, *ccq) if t is not None]


def assert_same_parameter_gradients(torch_mixer, fla_mixer, y, y_fla, what: str):
    """The gradients of a random projection of y and y_fla with respect to each mixer's parameters agree, to
    fp32's rounding of the largest element where it exceeds 1 (interdomain's time constants reach 1e3)."""
    weights = torch.randn(y.shape, generator=torch.Generator().manual_seed(5))
    grads = torch.autograd.grad((y * weights).sum(), list(torch_mixer.parameters()))
    grads_fla = torch.autograd.grad((y_fla * weights).sum(), list(fla_mixer.parameters()))
    for (param, _), g_fla, g in zip(torch_mixer.named_parameters(), grads_fla, grads, strict=True):
        atol = TOLERANCE["atol"] * max(1.0, g.abs().max().item())
        torch.testing.assert_close(g_fla, g, rtol=TOLERANCE["rtol"], atol=atol,
                                   msg=lambda m, n=f"{what} {param}": f"{n} gradient: {m}")


# every mixer with an fla backend (interdomain with another readout and the output gate too)
FLA_MIXERS = [("linear", {}), ("gla", {}), ("gdn", {}), ("ccq-gla", {}), ("ccq-gdn", {"ccq_decay": True}),
              ("interdomain", {"modes": 8}), ("interdomain", {"modes": 8, "readout": "bilinear", "gate": True})]


def check_mixers():
    """Each linear-attention mixer: forward, final state and parameter gradients with backend=fla equal those
    with backend=torch, and an fla prefill continued by single-token steps equals the full forward."""
    x = torch.randn(1, T, 64, generator=torch.Generator().manual_seed(4))
    for name, options in FLA_MIXERS:
        torch_mixer, fla_mixer = mixer_pair(name, **options)
        (y, state), (y_fla, state_fla) = torch_mixer(x), fla_mixer(x)
        torch.testing.assert_close(y_fla, y, **TOLERANCE, msg=lambda m, name=name: f"{name} forward: {m}")
        for s_fla, s in zip(state_tensors(state_fla), state_tensors(state), strict=True):
            torch.testing.assert_close(s_fla, s, **TOLERANCE, msg=lambda m, name=name: f"{name} state: {m}")
        assert_same_parameter_gradients(torch_mixer, fla_mixer, y, y_fla, name)

        with torch.no_grad():
            outputs, state = [], None
            for part in (x[:, :30], *x[:, 30:].split(1, dim=1)):
                y_part, state = fla_mixer(part, state)
                outputs.append(y_part)
        torch.testing.assert_close(torch.cat(outputs, 1), y.detach(), **TOLERANCE,
                                   msg=lambda m, name=name: f"{name} prefill then decode: {m}")


def check_packed():
    """Each linear-attention mixer with backend=fla on a packed row (fla's kernels given cu_seqlens, the short
    convolution restarted at each start): outputs, each sequence's final state and the parameter gradients
    equal backend=torch on every sequence alone, lengths 1 and odd ones included."""
    lengths = [1, 5, 20, 7]
    cu_seqlens = torch.tensor([0, 1, 6, 26, 33])
    x = torch.randn(1, sum(lengths), 64, generator=torch.Generator().manual_seed(6))
    for name, options in FLA_MIXERS:
        torch_mixer, fla_mixer = mixer_pair(name, **options)
        y_fla, states_fla = fla_mixer(x, cu_seqlens=cu_seqlens)
        alone = [torch_mixer(piece) for piece in x.split(lengths, dim=1)]
        y = torch.cat([y_piece for y_piece, _ in alone], 1)
        torch.testing.assert_close(y_fla, y, **TOLERANCE, msg=lambda m, name=name: f"{name} packed forward: {m}")
        for s_fla, (_, s) in zip(states_fla, alone, strict=True):
            for a, b in zip(state_tensors(s_fla), state_tensors(s), strict=True):
                torch.testing.assert_close(a, b, **TOLERANCE, msg=lambda m, name=name: f"{name} packed state: {m}")
        y_out, _ = fla_mixer(x, cu_seqlens=cu_seqlens, keep_state=False)  # the training path: no states
        torch.testing.assert_close(y_out, y, **TOLERANCE, msg=lambda m, name=name: f"{name} outputs: {m}")
        assert_same_parameter_gradients(torch_mixer, fla_mixer, y, y_out, f"{name} packed")


# each fla form a shard runs once: GLA's kernel on packed documents, the delta rule's, CCQ's read with decayed
# statistics, interdomain's query read (the interpreter takes seconds a case)
CONTEXT_PARALLEL_CASES = [("gla", {}, [0, 5, 20, 34]), ("gdn", {}, None), ("ccq-gdn", {"ccq_decay": True}, None),
                          ("interdomain", {"modes": 8}, None)]


def check_context_parallel():
    """Linear-attention mixers with backend=fla split across two gloo ranks (ops.cp.Context, shards of
    17 tokens against fla's chunks of 16 and more): each rank's outputs are the whole sequence's there, its final
    state the whole sequence's, and the parameters' gradients summed over the ranks the whole sequence's; on a
    packed row, its middle document across the cut, the outputs and gradients."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(context_parallel_rank, args=(f"{folder}/store",), nprocs=2)


def context_parallel_rank(rank: int, store: str):
    import torch.distributed as dist

    from attnlab.ops.cp import Context

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        T_whole, part = 34, slice(17 * rank, 17 * (rank + 1))
        x = torch.randn(1, T_whole, 64, generator=torch.Generator().manual_seed(7))
        weights = torch.randn(1, T_whole, 64, generator=torch.Generator().manual_seed(8))

        def case(i):
            """The case's mixer (the same parameters on both ranks) and cu_seqlens."""
            name, options, documents = CONTEXT_PARALLEL_CASES[i]
            torch.manual_seed(0)
            return mixer_pair(name, **options)[1], None if documents is None else torch.tensor(documents)

        def whole(i):
            """The whole sequence in one call: outputs, final state and the parameters' gradients."""
            mixer, cu_seqlens = case(i)
            y, state = mixer(x, cu_seqlens=cu_seqlens, keep_state=cu_seqlens is None)
            grads = torch.autograd.grad((y * weights).sum(), list(mixer.parameters()))
            return y.detach(), None if state is None else [t.detach() for t in state_tensors(state)], grads

        # the whole sequences' results, the same on both ranks: each rank computes every other case's, and they swap
        ours = {i: whole(i) for i in range(rank, len(CONTEXT_PARALLEL_CASES), 2)}
        both = [None, None]
        dist.all_gather_object(both, ours)
        wholes = {**both[0], **both[1]}
        for i, (name, options, documents) in enumerate(CONTEXT_PARALLEL_CASES):
            what = f"{name} {options}" + ("" if documents is None else f" packed {documents}")
            mixer, cu_seqlens = case(i)
            y, state, grads = wholes[i]
            y_shard, state_shard = mixer(x[:, part], cu_seqlens=cu_seqlens, context=Context())
            torch.testing.assert_close(y_shard, y[:, part], **TOLERANCE, msg=lambda m, w=what: f"{w}: {m}")
            if cu_seqlens is None:
                for a, b in zip(state_tensors(state_shard), state, strict=True):
                    torch.testing.assert_close(a, b, **TOLERANCE, msg=lambda m, w=what: f"{w} state: {m}")
            split = torch.autograd.grad((y_shard * weights[:, part]).sum(), list(mixer.parameters()))
            for (param, _), g_split, g in zip(mixer.named_parameters(), split, grads, strict=True):
                g_split = g_split.contiguous()
                dist.all_reduce(g_split)  # the ranks' gradients summed, as data parallelism sums them
                torch.testing.assert_close(g_split, g, rtol=TOLERANCE["rtol"],
                                           atol=TOLERANCE["atol"] * max(1.0, g.abs().max().item()),
                                           msg=lambda m, w=what, p=param: f"{w}: the gradient of {p}: {m}")
    finally:
        dist.destroy_process_group()


def check_banded():
    """The banded Ising marginals' kernels against the torch form in fp64: log-marginals and the gradients of
    the fields and couplings, bands 1 to 5, couplings per chain or shared, odd lengths, absent spins at the
    end of some chains (fields and couplings 0, as the mixer passes them) and fields up to about 60, where
    probabilities fall far below fp32's range."""
    g = torch.Generator().manual_seed(8)
    for Q, n, w, shared, field_scale in [(5, 13, 3, False, 2.0), (3, 9, 1, True, 2.0), (19, 20, 4, False, 2.0),
                                         (2, 11, 5, True, 2.0), (6, 17, 4, False, 20.0)]:
        h = field_scale * torch.randn(Q, n, generator=g, dtype=torch.float64)
        Jb = 0.7 * torch.randn(1 if shared else Q, n, w, generator=g, dtype=torch.float64)
        present = torch.arange(n) < torch.randint(1, n + 1, (Q, 1), generator=g)
        h = (h * present).requires_grad_()
        if not shared:
            Jb = Jb * present[..., None]
        Jb.requires_grad_()
        weights = torch.randn(Q, n, generator=g, dtype=torch.float64)
        expected = ising.banded_log_marginals(h, Jb)
        got = ising_triton.banded_log_marginals(h.float(), Jb.float())
        grads = torch.autograd.grad((expected * weights).sum(), (h, Jb))
        grads_kernel = torch.autograd.grad((got * weights.float()).sum(), (h, Jb))
        case = f"Q={Q} n={n} band={w} {'shared' if shared else 'per chain'} fields x{field_scale}"
        for name, a, b in [("log-marginals", got, expected), ("fields' gradient", grads_kernel[0], grads[0]),
                           ("couplings' gradient", grads_kernel[1], grads[1])]:
            torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=2e-5 * max(1.0, b.abs().max().item()),
                                       msg=lambda m, what=f"{case}: {name}": f"{what}: {m}")


def check_boltzmann_triton():
    """Boltzmann attention with banded inference over a sliding window, backend=triton against backend=torch:
    outputs and parameter gradients (one stream, and packed sequences in one call), and prefill then decode."""
    options = dict(d_model=32, n_heads=2, inference="banded", couplings="distance", band=3, window=6,
                   j_init_std=0.3, mode="h+J")
    torch_mixer = build_mixer("boltzmann", backend="torch", **options)
    triton_mixer = build_mixer("boltzmann", backend="triton", **options)
    triton_mixer.load_state_dict(torch_mixer.state_dict())
    x = torch.randn(2, 15, 32, generator=torch.Generator().manual_seed(9))
    (y, _), (y_triton, _) = torch_mixer(x), triton_mixer(x)
    torch.testing.assert_close(y_triton, y, **TOLERANCE, msg=lambda m: f"forward: {m}")
    assert_same_parameter_gradients(torch_mixer, triton_mixer, y, y_triton, "boltzmann")
    cu_seqlens = torch.tensor([0, 1, 8, 15])
    packed = x[:1]
    y = torch_mixer(packed, cu_seqlens=cu_seqlens, keep_state=False)[0]
    y_triton = triton_mixer(packed, cu_seqlens=cu_seqlens, keep_state=False)[0]
    torch.testing.assert_close(y_triton, y, **TOLERANCE, msg=lambda m: f"packed forward: {m}")
    assert_same_parameter_gradients(torch_mixer, triton_mixer, y, y_triton, "boltzmann packed")
    with torch.no_grad():
        outputs, state = [], None
        for part in (x[:, :9], *x[:, 9:].split(1, dim=1)):
            y_part, state = triton_mixer(part, state)
            outputs.append(y_part)
        full = torch_mixer(x)[0]
    torch.testing.assert_close(torch.cat(outputs, 1), full, **TOLERANCE, msg=lambda m: f"prefill then decode: {m}")


def check_doctor_dry_run():
    """`attnlab doctor --dry-run` on the CPU: the GPU run's sections (the fused backends against the torch forms,
    every mixer timed against softmax at two lengths, the goals) at tiny sizes, the kernels interpreted."""
    import tempfile

    import attnlab.papers  # noqa: F401  (the papers: their variants and speed goals)
    from attnlab.bench.registry import SPEED_GOALS
    from attnlab.lab.doctor import run_doctor

    with tempfile.TemporaryDirectory() as out:
        report = run_doctor(out, train_steps=0, dry_run=True, log=lambda line: None)
    assert list(report["speed"]) == list(report["fused"]) == ["8", "16"], report.keys()
    for seq_len, compared in report["fused"].items():
        assert set(compared) == {"linear, fla", "gla, fla", "gdn, fla", "ccq-gla, fla", "ccq-gdn, fla",
                                 "interdomain, fla", "boltzmann (banded 4, window 64), triton",
                                 "boltzmann (h-only, window 64), triton"}, compared
        for name, row in compared.items():
            assert "error" not in row and row["difference"] < 1e-3, (seq_len, name, row)
    speed_goals = report["goals"][: len(SPEED_GOALS)]
    assert all(goal["verdict"] == "not judged" and goal["value"] > 0 for goal in speed_goals), speed_goals
    assert all(goal["verdict"] == "not judged" for goal in report["goals"]) and report["failed"] == []


CHECKS = {name.removeprefix("check_"): fn for name, fn in globals().items() if name.startswith("check_")}

if __name__ == "__main__":
    torch.manual_seed(0)
    results = {}
    for check in sys.argv[1:]:
        try:
            CHECKS[check]()
            results[check] = None
        except Exception:
            results[check] = traceback.format_exc()
    print(json.dumps(results))
