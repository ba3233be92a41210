"""PyTorch integration: streams, allocation, and each loaded kernel as a ``torch.library``
custom op (``torch.ops.pipelink.<recipe>_<kernel>_<cubin hash>``) with a fake
implementation that derives output shapes from the launch section, so
``torch.compile(fullgraph=True)`` traces through it.

PyTorch's operator registry is process-wide; so are the two tables here that feed it
(the library objects must stay alive, and a name registered once dispatches to the op
loaded last under it).
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..errors import RuntimeLaunchError
from .tensors import TORCH_DTYPES

if TYPE_CHECKING:
    from .op import Op

NAMESPACE = "pipelink"
_LIBRARIES: dict[str, Any] = {}     # op name -> torch.library.Library that defines it
_OPS: dict[str, Op] = {}            # op name -> the loaded Op its CUDA kernel runs
STREAM_WORKSPACES = 64              # eager workspaces kept, one per (device, stream)
_STREAM_WORKSPACES: dict[tuple[int, int], Any] = {}


def torch_dtype(name: str) -> Any:
    import torch
    return {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16,
            "i32": torch.int32, "u8": torch.uint8, "i8": torch.int8}[name]


def dtype_name(t: Any) -> str:
    name = str(t.dtype).removeprefix("torch.")
    if name not in TORCH_DTYPES:
        raise RuntimeLaunchError(f"unsupported dtype {t.dtype}",
                                 hint="dtypes: " + ", ".join(sorted(TORCH_DTYPES)))
    return TORCH_DTYPES[name]


def empty(shape: list[int], dtype: str, device: int) -> Any:
    import torch
    return torch.empty(shape, dtype=torch_dtype(dtype), device=torch.device("cuda", device))


def workspace(nbytes: int, device: int, stream: int) -> Any:
    """The hand-off workspace for one launch on ``stream`` (None if the kernel has none).

    Eager launches share one workspace per (device, stream), grown to the largest kernel
    launched there: launches on one stream run one after another, and nothing in a
    workspace outlives its launch (counters are zeroed on the stream per launch, split-K
    flags are reset by the launch that set them). While a CUDA graph is being captured
    the launch gets its own, from the graph's pool, so a replay never shares it with
    eager work.
    """
    import torch
    if not nbytes:
        return None
    if torch.cuda.is_current_stream_capturing():
        return empty([nbytes], "u8", device)
    key = (device, stream)
    buffer = _STREAM_WORKSPACES.get(key)
    if buffer is None or buffer.numel() < nbytes:
        # The old buffer (if any) goes back to the allocator stream-ordered, behind the
        # launches already queued here. Streams are bounded (torch pools them); a
        # program cycling external streams evicts the oldest.
        _STREAM_WORKSPACES.pop(key, None)
        while len(_STREAM_WORKSPACES) >= STREAM_WORKSPACES:
            _STREAM_WORKSPACES.pop(next(iter(_STREAM_WORKSPACES)))
        buffer = _STREAM_WORKSPACES[key] = empty([nbytes], "u8", device)
    return buffer


def launched_workspace(device: int, stream: int) -> Any:
    """The eager workspace of (device, stream), which the last launch there used (None
    before any)."""
    return _STREAM_WORKSPACES.get((device, stream))


@contextlib.contextmanager
def on_stream(stream: Any, device: int) -> Iterator[int]:
    """Makes ``device`` and ``stream`` current (so allocations are ordered on it) and
    yields the raw stream handle. ``None`` means torch's current stream."""
    import torch
    if stream is None:
        if torch.cuda.current_device() == device:
            yield torch._C._cuda_getCurrentRawStream(device)
            return
        with torch.cuda.device(device):
            yield torch._C._cuda_getCurrentRawStream(device)
        return
    if isinstance(stream, int):
        stream = torch.cuda.ExternalStream(stream, device=torch.device("cuda", device))
    if not isinstance(stream, torch.cuda.Stream):
        raise RuntimeLaunchError(f"stream= takes a torch.cuda.Stream, got {type(stream).__name__}")
    if stream.device_index != device:
        raise RuntimeLaunchError(f"stream= is on cuda:{stream.device_index}, the kernel on "
                                 f"cuda:{device}")
    with torch.cuda.device(device), torch.cuda.stream(stream):
        yield stream.cuda_stream


def use_dispatcher(inputs: tuple[Any, ...]) -> bool:
    """Whether a call must go through the registered op: while torch.compile traces,
    for tensor subclasses (fake, functional) and meta tensors, or when autograd records.
    Never for a call the dispatcher cannot take (a non-tensor, a CPU tensor): the eager
    path refuses it naming the input, where the dispatcher would fail inside PyTorch
    ("Could not run ... with arguments from the 'CPU' backend")."""
    import torch
    if torch.compiler.is_compiling():
        return True
    if not all(isinstance(t, torch.Tensor) and t.device.type != "cpu" for t in inputs):
        return False
    grad = torch.is_grad_enabled()
    for t in inputs:
        if type(t) is not torch.Tensor or t.is_meta or (grad and t.requires_grad):
            return True
    return False


def op_name(meta: dict[str, Any]) -> str:
    """A name per distinct cubin: the same build loaded twice shares one op."""
    base = f"{meta['recipe']}_{meta.get('kernel') or 'main'}_{meta['cubin_sha256'][:12]}"
    return re.sub(r"\W", "_", base)


def register(op: Op) -> Any:
    """Registers ``op`` as a custom op (once per name) and returns its overload."""
    import torch
    name = op_name(op.kernel.meta)
    _OPS[name] = op
    if name not in _LIBRARIES:
        if any(o.inplace for o in op.spec.outputs):
            return None                 # in-place kernels run eagerly only (docs/pytorch.md)
        lib = torch.library.Library(NAMESPACE, "FRAGMENT")
        lib.define(schema(name, op))
        lib.impl(name, functools.partial(_run, name), "CUDA")
        torch.library.register_fake(f"{NAMESPACE}::{name}", functools.partial(_fake, name),
                                    lib=lib)
        _LIBRARIES[name] = lib
    return getattr(getattr(torch.ops, NAMESPACE), name).default


FORWARD_ONLY = "it was loaded as a forward-only op"


def refuse_backward(op: Op, why: str = FORWARD_ONLY) -> None:
    """Makes backpropagation through a forward-only op an error naming it (and `why` it
    has no gradients). Without an autograd formula, PyTorch would hand back no gradient
    for its inputs and warn at most: a model would train with q.grad silently None.

    Every :class:`Op` refuses so when it is built (with the plain `why`); a formula set
    for the op (set_autograd: its recipe's gradient kernels, loaded before or after)
    wins, and a refusal with a reason of its own (gradient kernels built for another
    arch) replaces the plain one."""
    name = op_name(op.kernel.meta)
    if name not in _LIBRARIES:
        return
    if any(t.writes for t in op.spec.inputs):
        return      # torch takes no autograd formula for an op that mutates an input
    if name in _AUTOGRAD:
        _, _, refusal = _AUTOGRAD[name]
        if refusal is None or why == FORWARD_ONLY:
            return  # a formula wins, and so does a refusal that says more than the plain one
    message = (f"{op.name} has no backward kernel: {why}, and gradients cannot flow "
               "through it", str(op.kernel.folder))
    _AUTOGRAD[name] = (None, None, message)
    _install_autograd(name)


def set_autograd(name: str, backward: Any, setup_context: Any) -> None:
    """The autograd formula of op `name` (registered with torch once per process: later
    calls replace what it runs)."""
    _AUTOGRAD[name] = (backward, setup_context, None)
    _install_autograd(name)


# op name -> (backward, setup_context, refusal (message, where) when it has none).
_AUTOGRAD: dict[str, tuple[Any, Any, tuple[str, str] | None]] = {}
_INSTALLED: set[str] = set()


def _install_autograd(name: str) -> None:
    """torch.library takes one formula per op: it looks up _AUTOGRAD when it runs."""
    import torch
    if name in _INSTALLED:
        return

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        _, setup, _ = _AUTOGRAD[name]
        if setup is not None:
            setup(ctx, inputs, output)

    def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
        run, _, refusal = _AUTOGRAD[name]
        if refusal is not None:
            message, where = refusal
            raise RuntimeLaunchError(
                message, where=where,
                hint="call it under torch.no_grad() or on detached inputs, or build a recipe "
                     "with an autograd: section (kernels for the gradients)")
        return run(ctx, *grads)

    torch.library.register_autograd(f"{NAMESPACE}::{name}", backward,
                                    setup_context=setup_context, lib=_LIBRARIES[name])
    _INSTALLED.add(name)


def library(name: str) -> Any:
    return _LIBRARIES[name]


def schema(name: str, op: Op) -> str:
    """Tensors (an input the kernel writes into marked mutated, so functionalization
    orders and copies around it), then the launch's scalars as ints with their defaults
    (by position: the Python op takes them by keyword and passes them on in name order)."""
    tensors = [f"Tensor(a{i}!) {t.name}" if t.writes else f"Tensor {t.name}"
               for i, t in enumerate(op.spec.inputs)]
    args = ", ".join([*tensors, *(f"int {n}={d}" for n, d in op.spec.scalar_inputs)])
    outs = len(op.spec.outputs)
    returns = "Tensor" if outs == 1 else "(" + ", ".join(["Tensor"] * outs) + ")"
    return f"{name}({args}) -> {returns}"


def _run(name: str, *args: Any) -> Any:
    op = _OPS[name]
    count = len(op.spec.inputs)
    return op.run(args[:count], op.spec.trailing_scalars(args[count:]))


def _fake(name: str, *args: Any) -> Any:
    """Output tensors of the right shape and dtype, from the input shapes (and the
    scalars) alone."""
    op = _OPS[name]
    try:
        return _fake_outputs(op, *args)
    except RuntimeLaunchError as exc:
        raise op.named(exc) from None


def _fake_outputs(op: Op, *args: Any) -> Any:
    spec = op.spec
    inputs = args[:len(spec.inputs)]
    values = spec.trailing_scalars(args[len(spec.inputs):])
    shapes = {n: tuple(t.shape) for n, t in zip(spec.input_names, inputs, strict=True)}
    dtypes = {n: dtype_name(t) for n, t in zip(spec.input_names, inputs, strict=True)}
    sizes = spec.sizes(shapes, dtypes, {**dict(zip(spec.scalar_names, values, strict=True)),
                                        **op.host_sizes})
    out_shapes = spec.output_shapes(sizes)
    outs = tuple(inputs[0].new_empty(out_shapes[o.name], dtype=torch_dtype(o.dtype))
                 for o in spec.outputs)
    return outs[0] if len(outs) == 1 else outs
