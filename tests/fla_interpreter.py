"""Patches that let fla-core 0.6.0's Triton kernels run under Triton 3.9.0's interpreter, on a CPU.

Test-only. tests/triton_worker.py calls `apply()` in its own process, with TRITON_INTERPRET=1 set before triton
and fla were imported, and before any kernel runs. Each patch closes a gap between the interpreter and
compiled Triton that fla's kernels fall into:

1. Autotuning: the autotuner times every config through the active GPU driver, and there is none. The
   configs differ in speed only, so the first one left after pruning is used without timing.
2. Loop variables: compiled Triton makes the variable of a `range` / `tl.range` loop a tensor, the
   interpreter leaves it a Python int, and fla calls `.to(tl.int64)` on it. The rewrite the interpreter
   already applies to every kernel's source now also rebinds such a variable as a tensor at the top of the
   loop body (`tl.static_range` variables stay compile-time ints, as when compiled).
3. bf16 arithmetic: the interpreter holds bf16 values as their raw uint16 bits, and its elementwise ops,
   reductions, scans and `tl.dot` apply numpy's arithmetic to those bits as integers. Triton keeps bf16 op
   bf16 (and bf16 op Python float, e.g. `b_q * scale`) in bf16, and fla's backward kernels take bf16 sums
   (`tl.sum(b_h * b_dh)`). Here bf16 operands are widened to fp32 and the results rounded back to bf16,
   as the GPU rounds them; a dot product keeps its fp32 accumulator.

One more saves time only: every call of a `@triton.jit` helper from inside a kernel re-patches triton.language
(the `inspect.getmembers` of tl, tl.core, tl.tensor and tl.math), which the running kernel has already patched;
fla's kernels make thousands of such calls, and the repeats took about a third of the worker's time. A helper
whose language modules are already patched now skips the repeat; the patched functions are the same ones.
"""

import ast
import os

import triton
import triton.language as tl
from triton.runtime import autotuner, interpreter

TRITON_VERSION = "3.9.0"  # the interpreter these patches were written against (pinned in pyproject's dev extras)


def apply() -> None:
    if triton.__version__ != TRITON_VERSION:
        raise RuntimeError(f"tests/fla_interpreter.py patches the interpreter of triton {TRITON_VERSION}, found "
                           f"{triton.__version__}: check each patch against it, then update TRITON_VERSION and the pin")
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("set TRITON_INTERPRET=1 before importing triton or fla")
    autotuner.Autotuner.prune_configs = _first_config(autotuner.Autotuner.prune_configs)
    interpreter.FunctionRewriter.ast_transformer = _TensorLoopVariables()
    builder = interpreter.InterpreterBuilder
    builder.binary_op = _bf16_through_fp32(builder.binary_op)
    builder.unary_op = _bf16_through_fp32(builder.unary_op)
    builder.create_dot = _bf16_dot(builder.create_dot)
    interpreter.ReduceScanOpInterface.apply = _bf16_reduce_scan(interpreter.ReduceScanOpInterface.apply)
    interpreter._patch_lang = _patch_lang_once(interpreter._patch_lang)


def _first_config(prune_configs):
    def first(self, kwargs):
        return prune_configs(self, kwargs)[:1]

    return first


class _TensorLoopVariables(interpreter.ASTTransformer):
    def visit_For(self, node: ast.For) -> ast.For:
        node = self.generic_visit(node)
        loop = node.iter
        dynamic = isinstance(loop, ast.Call) and (
            (isinstance(loop.func, ast.Name) and loop.func.id == "range")
            or (isinstance(loop.func, ast.Attribute) and loop.func.attr == "range"))
        if dynamic and isinstance(node.target, ast.Name):
            name = node.target.id
            # `i = i`, which the base class's visit_Assign turns into `i = to_tensor(i)`
            rebind = ast.Assign(targets=[ast.Name(name, ast.Store())], value=ast.Name(name, ast.Load()))
            node.body.insert(0, self.visit_Assign(rebind))
        return node


def _patch_lang_once(patch_lang):
    """patch_lang(fn) -> a scope to restore: called by a kernel's launch (outside any kernel) and by each helper's
    call inside one. Inside a kernel whose patches already cover the helper's language modules, it patches
    nothing. The kernel's scope restores what the kernel patched when it ends; what a helper patched stays
    patched, as it did before."""
    patched = set()  # ids of the language modules the running kernel patched

    class KernelScope(interpreter._LangPatchScope):
        def restore(self):
            super().restore()
            patched.clear()

    def langs(fn):
        return {id(value) for value in fn.__globals__.values() if value is tl or value is tl.core}

    def patch(fn):
        if patched:  # a helper, inside a kernel
            if langs(fn) <= patched:
                return interpreter._LangPatchScope()
            patched.update(langs(fn))  # e.g. tl.core, which tl.sum's module reads: patched as before, once
            return patch_lang(fn)
        scope = patch_lang(fn)
        kernel_scope = KernelScope()
        kernel_scope._changes = scope._changes
        patched.update(langs(fn))
        return kernel_scope

    return patch


def _is_bf16(x) -> bool:
    return isinstance(x, interpreter.TensorHandle) and x.dtype.scalar == tl.bfloat16


def _bf16_through_fp32(op):
    """op(self, x, *rest), whose result has x's type: for bf16 x, computed in fp32 and rounded back to bf16."""

    def run(self, x, *rest):
        if not _is_bf16(x):
            return op(self, x, *rest)
        rest = [self.cast_impl(r, tl.float32) if _is_bf16(r) else r for r in rest]
        out = op(self, self.cast_impl(x, tl.float32), *rest)
        return self.cast_impl(out, tl.bfloat16) if out.dtype.scalar == tl.float32 else out  # comparisons: int1

    return run


def _bf16_dot(create_dot):
    def dot(self, a, b, acc, *args):
        a, b = (self.cast_impl(x, tl.float32) if _is_bf16(x) else x for x in (a, b))
        return create_dot(self, a, b, acc, *args)

    return dot


def _convert(x, dtype):
    """The tl.tensor x converted to dtype by the interpreter's own (correct) cast."""
    handle = interpreter.interpreter_builder.cast_impl(x.handle, dtype)
    return tl.core.tensor(handle, tl.block_type(dtype, x.shape) if x.type.is_block() else dtype)


def _bf16_reduce_scan(apply):
    """Reductions and scans over bf16 tensors, computed in fp32; each bf16 input's result rounded to bf16."""

    def run(self, inputs):
        if not isinstance(inputs, tuple):
            return run(self, (inputs,))[0]
        bf16 = [x.dtype == tl.bfloat16 for x in inputs]
        if not any(bf16):
            return apply(self, inputs)
        outputs = apply(self, tuple(_convert(x, tl.float32) if b else x for x, b in zip(inputs, bf16, strict=True)))
        return tuple(_convert(y, tl.bfloat16) if i < len(bf16) and bf16[i] and y.dtype == tl.float32 else y
                     for i, y in enumerate(outputs))

    return run
