"""A built kernel as a PyTorch operator: ``op(*inputs) -> outputs`` per the recipe's
``launch:`` section.

- It launches on ``torch.cuda.current_stream()`` (or ``stream=``), so it orders with the
  work around it and is captured by ``torch.cuda.graph``.
- A kernel's hand-off workspace is kept per stream (one per call while a CUDA graph is
  captured), so concurrent launches never share one.
- It is a ``torch.library`` custom op with a fake implementation, so
  ``torch.compile(fullgraph=True)`` traces it without a graph break.
- Backpropagating through it is refused, naming it, unless its recipe's gradient
  kernels were loaded with it (:class:`~pipelink.runtime.kernelset.KernelSet`).
- Every argument is checked before a launch (shape, strides, alignment, dtype, device,
  overlap); a mistake is a :class:`RuntimeLaunchError` naming the argument, never a CUDA
  error or an out-of-bounds write.

Checks that depend only on layouts run once per layout (a :class:`Plan`), which also
keeps one packed launch; what a cached call still does is read the addresses, check
their alignment, allocate the outputs, point the launch's fields at any tensor that
moved, and launch. Anything unusual (a new layout, a misaligned address, ``out=``) takes the
checked path, which raises the error or fills the caches.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import RuntimeLaunchError
from . import contents, torch_ops
from .driver import l2_size, max_active_clusters, sm_count
from .kernel import DEFAULT_PTR_ALIGN, Launch, LinkedKernel
from .spec import H100_HOST_SIZES, LaunchSpec, evaluate
from .tensors import (
    TMA_ALIGN,
    TensorInfo,
    address,
    overlaps_itself,
    require_aligned,
    require_cuda,
    require_dense,
    require_tma_layout,
    spans_overlap,
    tensor_info,
)

# Plans an op keeps, one per layout of its arguments, the oldest dropped first: a model
# whose shapes vary (packed documents of another total length every batch) would keep
# every plan it ever made. A layout that comes back is planned (checked, packed) again.
MAX_PLANS = 256


@dataclass
class Plan:
    """What one layout of the arguments (shapes, strides, dtypes, device) resolves to."""

    grid: list[int]
    scalars: dict[str, int]
    alloc: tuple[tuple[str, tuple[int, ...], Any], ...]   # fresh outputs: name, shape, dtype
    aligns: tuple[tuple[str, int], ...]       # tensor name -> byte alignment its fields need
    # The same by position among the inputs, then the given outputs (in output order).
    positional_aligns: tuple[tuple[int, int], ...]
    spans: dict[str, int]                      # bytes each input and given output spans
    # Given outputs that must not overlap another tensor: (position, its span, the
    # other's position, its span), positions as in positional_aligns.
    disjoint: tuple[tuple[int, int, int, int], ...] = ()
    # The layout's packed launch (made by its first call), each tensor field's setter by
    # the tensor's position among the call's inputs then outputs, and the address each
    # field holds now: a call moves only the fields whose tensor moved. The lock keeps
    # a move and its launch together when threads share the op.
    launch: Launch | None = None
    moves: tuple[tuple[int, Callable[[int], None]], ...] = ()
    addresses: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Every output has zero elements: the kernel would write nothing, so no launch is
    # made (nor tensor maps, which cannot describe an empty tensor).
    noop: bool = False
    sizes: dict[str, Any] = field(default_factory=dict)   # for launch.contents' bounds


class Op:
    """A built kernel folder as a callable PyTorch operator."""

    def __init__(self, folder: Path | str) -> None:
        self.kernel = LinkedKernel(folder)
        self.spec = LaunchSpec.from_meta(self.kernel.meta)
        if not self.spec.inputs:
            raise RuntimeLaunchError("the recipe states no host-side launch (launch.inputs)",
                                     where=str(folder),
                                     hint="use LinkedKernel.launch with explicit arguments")
        self._setup(self._resident_ctas(), l2_size(self.kernel.device))

    def _resident_ctas(self) -> int:
        """The CTAs a persistent grid may have, all resident at once (the schedulers
        count on it): one per SM, or, for a clustered kernel, as many whole clusters as
        the GPCs hold together."""
        sms = sm_count(self.kernel.device)
        size = self.spec.cluster[0] * self.spec.cluster[1] * self.spec.cluster[2]
        if size == 1:
            return sms
        meta = self.kernel.meta
        clusters = max_active_clusters(self.kernel.function, meta["block"][0],
                                       meta["dynamic_smem"], size)
        return max(min(sms, clusters * size), size)

    @classmethod
    def from_meta(cls, meta: dict[str, Any], num_sms: int,
                  l2_bytes: int = H100_HOST_SIZES["l2_bytes"]) -> Op:
        """The op's checks, shapes and torch registration from kernel.json alone, with no
        driver (for tools and tests; it cannot launch)."""
        op = object.__new__(cls)
        op.kernel = LinkedKernel.from_meta(meta)
        op.spec = LaunchSpec.from_meta(meta)
        op._setup(num_sms, l2_bytes)
        return op

    def _setup(self, num_sms: int, l2_bytes: int) -> None:
        import torch
        self._torch = torch
        # What every cached call asks of torch, looked up once.
        self._empty = torch.empty
        self._grad_enabled = torch.is_grad_enabled
        self._any_requires_grad = getattr(torch._C, "_any_requires_grad",
                                          lambda *ts: any(t.requires_grad for t in ts))
        self._is_compiling = torch.compiler.is_compiling
        # (absent from CPU-only builds of torch, where an op is checks and shapes only)
        self._raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self._num_sms = num_sms
        # The sizes binds and conditions may name besides the inputs' (check.HOST_SIZES).
        self.host_sizes = {"num_sms": num_sms, "l2_bytes": l2_bytes}
        self._plans: dict[tuple, Plan] = {}
        self._device = torch.device("cuda", self.kernel.device or 0)
        self._out_names = tuple(o.name for o in self.spec.outputs)
        self._inplace = any(o.inplace for o in self.spec.outputs)
        self._defaults = self.spec.scalar_values({})
        # launch.contents are checked on every call unless the caller vouches for its
        # index tensors (pipelink/runtime/contents.py)
        self.check_contents = True
        self.torch_op = torch_ops.register(self)
        # No gradients until its recipe's gradient kernels give it some (KernelSet):
        # backpropagating through it is an error, not a gradient silently left None.
        torch_ops.refuse_backward(self)

    @property
    def name(self) -> str:
        return self.kernel.name

    def __repr__(self) -> str:
        ins = ", ".join(self.spec.input_names)
        return (f"<pipelink op {self.name}({ins}) -> ({', '.join(self._out_names)}) "
                f"from {self.kernel.folder}>")

    def __call__(self, *inputs: Any, out: Any = None, stream: Any = None,
                 **scalars: Any) -> Any:
        """Runs the kernel on ``inputs`` and returns the outputs (a tensor, or a tuple).

        ``out=`` (a tensor, a tuple, or a dict by output name) writes into given tensors;
        ``stream=`` (a ``torch.cuda.Stream``) launches there instead of the current
        stream; other keywords are the recipe's ``launch.scalars`` (``top_k=6``).
        Without ``out=`` or ``stream=``, the call goes through the registered custom op
        when torch.compile traces it or autograd needs it.
        """
        try:   # free unless raised: the cached path pays nothing for it
            values = self.spec.scalar_values(scalars) if scalars else self._defaults
            if stream is None:
                if out is None and self.torch_op is not None and self._is_compiling():
                    if len(inputs) != len(self.spec.inputs):
                        # A builtin error traces through torch.compile (fullgraph too);
                        # the schema would refuse the call in PyTorch's own words.
                        raise TypeError(self._count_message(len(inputs)))
                    return self.torch_op(*inputs, *values)
                result = self._cached_call(inputs, out, values)
                if result is not None:
                    return result
                if (out is None and self.torch_op is not None
                        and len(inputs) == len(self.spec.inputs)  # else refused, naming them
                        and torch_ops.use_dispatcher(inputs)):
                    return self.torch_op(*inputs, *values)
            return self._checked_call(inputs, out, stream, values)
        except RuntimeLaunchError as exc:
            raise self.named(exc) from None

    def run(self, inputs: tuple[Any, ...], values: tuple[Any, ...] = (), *,
            out: Any = None, stream: Any = None) -> Any:
        """The eager launch (what the custom op's CUDA kernel calls), scalars by position."""
        try:
            values = self.spec.trailing_scalars(tuple(values))
            if stream is None:
                result = self._cached_call(inputs, out, values)
                if result is not None:
                    return result
            return self._checked_call(inputs, out, stream, values)
        except RuntimeLaunchError as exc:
            raise self.named(exc) from None

    # -- the cached path ---------------------------------------------------------------

    def _cached_call(self, inputs: tuple[Any, ...], out: Any, values: tuple[Any, ...]) -> Any:
        """A plain-tensor call whose layout has a plan, whose addresses are aligned and
        whose given outputs (a tensor, or one per output in order) overlap nothing;
        None sends it on (to the dispatcher or the checked path, which explains any
        problem)."""
        try:
            key = tuple([(type(t), t.shape, t.stride(), t.dtype, t.get_device())
                         for t in inputs])
            given = () if out is None else self._given_in_order(out)
            if given is None:
                return None
            if given:
                key += tuple([(n, (type(t), t.shape, t.stride(), t.dtype, t.get_device()))
                              for n, t in zip(self._out_names, given, strict=True)])
            if values:
                key += (values,)
            plan = self._plans.get(key)
            if plan is None or (self._grad_enabled() and self._any_requires_grad(*inputs)):
                return None     # autograd records it through the dispatcher
        except (AttributeError, TypeError, RuntimeError):   # RuntimeError: a nested tensor's shape
            return None
        ptrs = [t.data_ptr() for t in (*inputs, *given)]
        for i, align in plan.positional_aligns:
            if ptrs[i] % align:
                return None
        for i, i_bytes, j, j_bytes in plan.disjoint:
            if spans_overlap(ptrs[i], i_bytes, ptrs[j], j_bytes):
                return None
        if self.spec.contents and self.check_contents:
            self._check_contents(plan, inputs)
        device = self._device
        outs = list(given) or [self._empty(shape, dtype=dtype, device=device)
                               for _, shape, dtype in plan.alloc]
        if plan.noop:
            return outs[0] if len(outs) == 1 else tuple(outs)
        if not given:
            ptrs += [o.data_ptr() for o in outs]
        stream = self._raw_stream(device.index)
        workspace = (torch_ops.workspace(self.kernel.workspace_bytes, device.index, stream)
                     if self.kernel.workspace_bytes else None)
        with plan.lock:
            launch = plan.launch
            if launch is None:
                values = dict(zip(self.spec.input_names, inputs, strict=True))
                values.update(zip(self._out_names, outs, strict=True))
                launch = self._first_launch(plan, values)
            held = plan.addresses
            for i, (position, move) in enumerate(plan.moves):
                if held[i] != ptrs[position]:
                    move(ptrs[position])
                    held[i] = ptrs[position]
            if workspace is None:
                launch.fire(stream)
            else:
                launch(stream, workspace.data_ptr())
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _given_in_order(self, out: Any) -> tuple[Any, ...] | None:
        """``out=`` as one tensor per output in output order, where it is that simply
        (None otherwise: the checked path reads dicts, partial sets, in-place kernels)."""
        if self._inplace or isinstance(out, dict):
            return None
        if isinstance(out, (tuple, list)):
            return tuple(out) if len(out) == len(self._out_names) else None
        return (out,) if len(self._out_names) == 1 else None

    # -- the checked path --------------------------------------------------------------

    def _checked_call(self, inputs: tuple[Any, ...], out: Any, stream: Any,
                      values: tuple[Any, ...]) -> Any:
        tensors = self._named_inputs(inputs)
        given = self._named_outputs(out)
        plan = self._plan(tensors, given, values)
        self._check_addresses(plan, tensors, given)
        if self.spec.contents and self.check_contents:
            self._check_contents(plan, tuple(tensors.values()))
        if stream is None:      # the common case, without a context manager's cost
            import torch
            outputs = self._launch_checked(plan, tensors, given,
                                           torch._C._cuda_getCurrentRawStream(self._device.index))
        else:
            with torch_ops.on_stream(stream, self._device.index) as handle:
                outputs = self._launch_checked(plan, tensors, given, handle)
        result = tuple(outputs[name] for name in self._out_names)
        return result[0] if len(result) == 1 else result

    def _launch_checked(self, plan: Plan, tensors: dict[str, Any], given: dict[str, Any],
                        stream: int) -> dict[str, Any]:
        outputs = self._outputs(plan, given)
        if plan.noop:
            return outputs
        values = {**tensors, **outputs}
        ptrs = [address(t) for t in values.values()]
        workspace = torch_ops.workspace(self.kernel.workspace_bytes, self._device.index, stream)
        with plan.lock:
            launch = plan.launch or self._first_launch(plan, values)
            for i, (position, move) in enumerate(plan.moves):
                if plan.addresses[i] != ptrs[position]:
                    move(ptrs[position])
                    plan.addresses[i] = ptrs[position]
            launch(stream, None if workspace is None else workspace.data_ptr())
        return outputs

    def prepare(self, *inputs: Any, out: Any = None, stream: Any = None,
                **scalars: Any) -> PreparedCall:
        """Checks and packs one call's arguments once: the result relaunches on the same
        tensors, on the stream it was prepared for, with nothing but ``cuLaunchKernel``
        (the lowest overhead)."""
        try:
            return self._prepared(inputs, out, stream, scalars)
        except RuntimeLaunchError as exc:
            raise self.named(exc) from None

    def _prepared(self, inputs: tuple[Any, ...], out: Any, stream: Any,
                  scalars: dict[str, Any]) -> PreparedCall:
        tensors = self._named_inputs(inputs)
        given = self._named_outputs(out)
        plan = self._plan(tensors, given, self.spec.scalar_values(scalars))
        if plan.noop:
            raise RuntimeLaunchError("every output of this call is empty, so there is no "
                                     "launch to prepare",
                                     hint="call the op instead (it returns the empty outputs)")
        self._check_addresses(plan, tensors, given)
        with torch_ops.on_stream(stream, self._device.index) as handle:
            outputs = self._outputs(plan, given)
            workspace = torch_ops.workspace(self.kernel.workspace_bytes, self._device.index,
                                            handle)
        launch = self.kernel.prepare(plan.grid, self._bound(plan, {**tensors, **outputs}))
        result = tuple(outputs[name] for name in self._out_names)
        return PreparedCall(launch, handle, workspace, result[0] if len(result) == 1 else result,
                            (tensors, outputs))

    def phase_times(self, stream: Any = None) -> dict[str, float]:
        """Where the last launch on ``stream`` (the current one by default; the last
        PipeLink launch there must be this op's: they share the stream's workspace)
        spent its time, phase by phase, in ms: from the moment the last CTA finished the phase
        before (or the first CTA started) to the moment the last CTA finished this one,
        read from the phase clocks a build linked with ``--phase-clock`` records
        (``total``: first start to last end). Waits for the stream."""
        clock = self.kernel.meta.get("phase_clock")
        if not clock:
            raise RuntimeLaunchError(f"{self.name} was linked without phase clocks",
                                     where=str(self.kernel.folder),
                                     hint="link it with 'pipelink link --phase-clock' "
                                          "(LinkOptions(phase_clock=True))")
        torch = self._torch
        with torch_ops.on_stream(stream, self._device.index) as handle:
            torch.cuda.current_stream(self._device).synchronize()
            workspace = torch_ops.launched_workspace(self._device.index, handle)
        if workspace is None:
            raise RuntimeLaunchError(f"no launch of {self.name} on this stream to read",
                                     hint="call the op (eagerly, not in a CUDA graph) first")
        rows = workspace[clock["offset"]:clock["offset"] + clock["ctas"] * clock["slots"] * 8]
        ns = rows.view(torch.int64).view(clock["ctas"], clock["slots"]).cpu()
        ns = ns[ns[:, 0] != 0].double()          # CTAs the launch ran (the rest are zeroed)
        ends = ns.max(dim=0).values
        times = {name: float(ends[i + 1] - ends[i]) / 1e6
                 for i, name in enumerate(clock["phases"])}
        times[next(iter(times))] = float(ends[1] - ns[:, 0].min()) / 1e6
        times["total"] = float(ends[-1] - ns[:, 0].min()) / 1e6
        return times

    def named(self, exc: RuntimeLaunchError) -> RuntimeLaunchError:
        """A refusal that names this op: a model calls many, and "input 'x' is f32" alone
        does not say which."""
        if exc.message.startswith(self.name):
            return exc
        return RuntimeLaunchError(f"{self.name}: {exc.message}", where=exc.where,
                                  hint=exc.hint)

    def _count_message(self, given: int) -> str:
        names = self.spec.input_names
        return f"{self.name} takes {len(names)} inputs ({', '.join(names)}), got {given}"

    def _named_inputs(self, inputs: tuple[Any, ...]) -> dict[str, Any]:
        if len(inputs) != len(self.spec.input_names):
            raise RuntimeLaunchError(self._count_message(len(inputs)))
        return dict(zip(self.spec.input_names, inputs, strict=True))

    def _named_outputs(self, out: Any) -> dict[str, Any]:
        names = self._out_names
        if out is None:
            given = {}
        elif isinstance(out, dict):
            given = dict(out)
        elif isinstance(out, (tuple, list)):
            if len(out) != len(names):
                raise RuntimeLaunchError(f"out= has {len(out)} tensors, {self.name} writes "
                                         f"{len(names)} ({', '.join(names)})")
            given = dict(zip(names, out, strict=True))
        elif len(names) == 1:
            given = {names[0]: out}
        else:
            raise RuntimeLaunchError(f"{self.name} writes {len(names)} outputs; pass out= as a "
                                     f"dict or tuple ({', '.join(names)})")
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise RuntimeLaunchError(f"out= names {unknown}, which {self.name} does not write",
                                     hint="outputs: " + ", ".join(names))
        return given

    def _plan(self, tensors: dict[str, Any], given: dict[str, Any],
              values: tuple[Any, ...]) -> Plan:
        for o in self.spec.outputs:
            if o.inplace:
                if given.get(o.name) is not None and given[o.name] is not tensors[o.inplace]:
                    raise RuntimeLaunchError(f"output '{o.name}' is written in place over "
                                             f"input '{o.inplace}'; out= must be that tensor")
                given[o.name] = tensors[o.inplace]
        key = tuple(_layout(t) for t in tensors.values())
        if given:
            key += tuple((n, _layout(t)) for n, t in given.items())
        if values:
            key += (values,)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= MAX_PLANS:                     # the oldest goes
                self._plans.pop(next(iter(self._plans)), None)
            plan = self._plans[key] = self._make_plan(tensors, given, values)
        return plan

    def _make_plan(self, tensors: dict[str, Any], given: dict[str, Any],
                   values: tuple[Any, ...]) -> Plan:
        expected = {spec.name: spec.dtype for spec in self.spec.inputs}
        infos = {n: tensor_info(t, f"input '{n}'", expected.get(n))
                 for n, t in tensors.items()}
        for name, info in infos.items():
            self._check_device(f"input '{name}'", info)
        sizes = self.spec.sizes({n: i.shape for n, i in infos.items()},
                                {n: i.dtype for n, i in infos.items()},
                                {**dict(zip(self.spec.scalar_names, values, strict=True)),
                                 **self.host_sizes})
        shapes = self.spec.output_shapes(sizes)
        alloc = []
        for o in self.spec.outputs:
            if o.name not in given:
                alloc.append((o.name, tuple(shapes[o.name]), torch_ops.torch_dtype(o.dtype)))
                continue
            info = tensor_info(given[o.name], f"out '{o.name}'")
            self._check_device(f"out '{o.name}'", info)
            if list(info.shape) != list(shapes[o.name]) or info.dtype != o.dtype:
                raise RuntimeLaunchError(f"out '{o.name}' is {info.dtype} {list(info.shape)}, "
                                         f"the kernel writes {o.dtype} {shapes[o.name]}")
            infos[o.name] = info
        # A tensor the kernel writes must give each element its own address: CTAs writing
        # one address from different tiles race, and the result depends on the order.
        written = {*given, *(s.name for s in self.spec.inputs if s.writes)}
        for name in written:
            if overlaps_itself(infos[name]):
                what = f"out '{name}'" if name in given else f"input '{name}'"
                raise RuntimeLaunchError(
                    f"{what} has strides {list(infos[name].strides)} for shape "
                    f"{list(infos[name].shape)}, so some of its elements share memory, and "
                    "the kernel writes it", hint="write into a tensor with storage of its "
                    "own (torch.empty), not an expand()ed or as_strided view")
        aligns = []
        for name, info in infos.items():
            aligns += self._check_layout(name, info)
        order = [*self.spec.input_names, *[n for n in self._out_names if n in given]]
        position = {n: i for i, n in enumerate(order)}
        spans = {n: info.nbytes_spanned for n, info in infos.items()}
        return Plan(self.spec.grid_for(sizes, self._num_sms), self.spec.scalars(sizes),
                    tuple(alloc), tuple(aligns), tuple((position[n], a) for n, a in aligns),
                    spans, tuple((position[o], spans[o], position[other], spans[other])
                                 for o, other in self._must_not_overlap(given)),
                    noop=all(0 in shapes[o.name] for o in self.spec.outputs), sizes=sizes)

    def _check_contents(self, plan: Plan, inputs: tuple[Any, ...]) -> None:
        """launch.contents on this call's index tensors (one synchronisation)."""
        contents.check(self.spec.contents, dict(zip(self.spec.input_names, inputs, strict=True)),
                       plan.sizes, evaluate)

    def _check_device(self, what: str, info: TensorInfo) -> None:
        require_cuda(info, what)
        if info.device is not None and info.device != self._device.index:
            raise RuntimeLaunchError(f"{what} is on cuda:{info.device}, {self.name} was loaded "
                                     f"on cuda:{self._device.index}",
                                     hint="load the op under torch.cuda.device(...) of the "
                                          "tensors, or move them")

    def _check_layout(self, name: str, info: TensorInfo) -> list[tuple[str, int]]:
        """Strides against what each kernel argument fed by this tensor reads; returns
        the alignment its address must have (checked per call)."""
        aligns = []
        for f in self.spec.fields_of.get(name, ()):
            what = f"tensor '{name}' (passed as {f['instance']}.{f['arg']})"
            if f["type"] == "tensormap":
                require_tma_layout(info, what)
                aligns.append((name, TMA_ALIGN))
            else:
                require_dense(info, what, f"{f['instance']}.{f['arg']}")
                aligns.append((name, int(f.get("align", DEFAULT_PTR_ALIGN))))
        return aligns

    def _check_addresses(self, plan: Plan, tensors: dict[str, Any],
                         given: dict[str, Any]) -> None:
        """Alignment of every address a field needs aligned, and overlap of every given
        output with the inputs and the other outputs (fresh outputs overlap nothing)."""
        values = {**tensors, **given}
        for name, align in plan.aligns:
            if address(values[name]) % align:
                require_aligned(tensor_info(values[name], f"tensor '{name}'"), align,
                                f"tensor '{name}'")
        if not given:
            return
        starts = {n: address(t) for n, t in values.items()}
        for out_name, other in self._must_not_overlap(given):
            if spans_overlap(starts[out_name], plan.spans[out_name], starts[other],
                             plan.spans[other]):
                raise RuntimeLaunchError(
                    f"output '{out_name}' overlaps '{other}' in memory; {self.name} "
                    "does not compute in place",
                    hint=f"give '{out_name}' its own storage (or .clone() '{other}')")

    def _must_not_overlap(self, given: dict[str, Any]) -> list[tuple[str, str]]:
        """(given output, another input or given output) pairs that must be disjoint:
        all but an in-place output and the input it is written over."""
        inplace = {(o.name, o.inplace) for o in self.spec.outputs if o.inplace}
        written = [n for n in self._out_names if n in given]
        return [(out_name, other) for i, out_name in enumerate(written)
                for other in (*self.spec.input_names, *written[i + 1:])
                if (out_name, other) not in inplace]

    def _outputs(self, plan: Plan, given: dict[str, Any]) -> dict[str, Any]:
        """The given outputs plus fresh ones (on the current stream's allocator)."""
        import torch
        outputs = dict(given)
        for name, shape, dtype in plan.alloc:
            outputs[name] = torch.empty(shape, dtype=dtype, device=self._device)
        return outputs

    # -- launching ------------------------------------------------------------------------

    def _slots(self, values: dict[str, Any]) -> tuple[tuple[int, str], ...]:
        """(position in ``values``, kernel field) of every field a tensor is bound to."""
        position = {name: i for i, name in enumerate(values)}
        field_of = {f"{f['instance']}.{f['arg']}": f["name"]
                    for f in self.kernel.meta["params"]["fields"] if f["instance"] is not None}
        return tuple((position[name], field_of[arg]) for arg, name in self.spec.bind.items()
                     if isinstance(name, str) and name in position)

    def _bound(self, plan: Plan, values: dict[str, Any]) -> dict[str, Any]:
        bound: dict[str, Any] = dict(plan.scalars)
        for arg, name in self.spec.bind.items():
            if isinstance(name, str) and name in values:
                bound[arg] = values[name]
        return bound

    def _first_launch(self, plan: Plan, values: dict[str, Any]) -> Launch:
        """The layout's launch, packed and checked in full from its first call's tensors
        (``values``: inputs, then outputs, in the order every call of the plan uses)."""
        launch = self.kernel.prepare(plan.grid, self._bound(plan, values))
        ptrs = [address(t) for t in values.values()]
        slots = self._slots(values)
        plan.moves = tuple((position, launch.mover(name)) for position, name in slots)
        plan.addresses = [ptrs[position] for position, _ in slots]
        plan.launch = launch
        return launch


class PreparedCall:
    """One checked, packed call: ``prepared()`` relaunches it on the same tensors (write
    new data into ``prepared.inputs``/``prepared.outputs`` between calls)."""

    def __init__(self, launch: Launch, stream: int, workspace: Any, result: Any,
                 tensors: tuple[dict[str, Any], dict[str, Any]]) -> None:
        self._launch, self._stream, self._workspace = launch, stream, workspace
        self._ws_ptr = None if workspace is None else workspace.data_ptr()
        self.result = result
        self.inputs, self.outputs = tensors

    def __call__(self) -> Any:
        self._launch(self._stream, self._ws_ptr)
        return self.result


def _layout(t: Any) -> tuple:
    """A tensor's layout as the plans key it (the cached path builds the same key for
    PyTorch tensors). Never an object's id: a freed array's id comes back with another
    array, which would find the freed one's plan (its grid, its tensor maps' shapes)."""
    try:
        return (type(t), t.shape, t.stride(), t.dtype, t.get_device())
    except (AttributeError, TypeError, RuntimeError):   # RuntimeError: a nested tensor's shape
        cai = getattr(t, "__cuda_array_interface__", None)
        if cai is None:
            return (type(t).__name__,)        # no plan is made for it: tensor_info refuses it
        return (type(t).__name__, tuple(cai["shape"]), tuple(cai.get("strides") or ()),
                cai["typestr"])
