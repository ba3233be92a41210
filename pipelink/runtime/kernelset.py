"""A multi-kernel recipe loaded whole: each kernel an :class:`~pipelink.runtime.op.Op`,
and, where the recipe has an ``autograd:`` section, the forward kernel's op made
differentiable, its backward running the recipe's gradient kernels.

``kernels.json`` (written by the link step beside the kernels' folders) says which
kernel lives where and how gradients follow::

    "autograd": {"forward": "forward",
                 "grads": {"x": {"kernel": "dgrad", "inputs": ["grad.y", "w"],
                                 "output": "dx"}}}

An input reference names a forward input or output, or ``grad.<output>``; a ``.T``
suffix passes a contiguous transpose of that 2-D tensor. Grads naming the same kernel
and inputs come from one launch of it (a backward kernel that writes every gradient);
``returns`` (optional) lists the forward outputs the call hands back, the rest being
kept for the backward.

A ``dispatch`` list makes the set one op over kernels of the same signature: a call
runs the first entry whose conditions hold on its sizes (the last has none)::

    "dispatch": [{"kernel": "short", "when": ["M <= 512"]}, {"kernel": "tall"}]
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import RuntimeLaunchError, did_you_mean
from . import torch_ops
from .kernel import MISSING, refused
from .op import MAX_PLANS, Op
from .spec import LaunchSpec, condition

KERNELS_JSON = "kernels.json"
GRAD_PREFIX = "grad."
TRANSPOSE_SUFFIX = ".T"

# What the runtime reads of kernels.json, key -> type ("?": a key it may lack), as
# kernel.json's are (kernel.check_meta): a file edited by hand or cut short is refused
# naming the key, never met as a KeyError or TypeError while the set loads.
_NULL = type(None)
_INDEX = {"kernels": dict, "recipe?": str, "arch?": str, "autograd?": (dict, _NULL),
          "elsewhere?": (dict, _NULL), "dispatch?": (list, _NULL)}
_AUTOGRAD = {"forward": str, "grads": dict, "returns?": (list, _NULL),
             "scratch?": (list, _NULL), "launches?": (list, _NULL)}
_GRAD = {"kernel": str, "inputs": list, "output?": (str, _NULL)}
_LAUNCH = {"kernel": str, "inputs": list}
_DISPATCH = {"kernel": str, "when?": (list, _NULL)}


def check_index(index: Any, where: Path) -> None:
    """kernels.json has every key the runtime reads, of the type it reads (the link step
    writes it so; this refuses a hand-edited or truncated one before any kernel loads)."""
    def fields(data: Any, key: str, spec: dict[str, Any]) -> None:
        if not isinstance(data, dict):
            raise refused(where, key or "<top>", dict, data)
        for name, types in spec.items():
            value = data.get(name.rstrip("?"), MISSING)
            if value is MISSING and name.endswith("?"):
                continue
            if not isinstance(value, types):
                raise refused(where, f"{key}.{name.rstrip('?')}".lstrip("."), types, value)

    def strings(values: Any, key: str) -> None:
        """Every entry of a list (or every value of a mapping) is a string."""
        entries = values.items() if isinstance(values, dict) else enumerate(values or ())
        for k, value in entries:
            if not isinstance(value, str):
                raise refused(where, f"{key}.{k}" if isinstance(values, dict) else f"{key}[{k}]",
                              str, value)

    fields(index, "", _INDEX)
    if not index["kernels"]:
        raise RuntimeLaunchError("key 'kernels' lists no kernel", where=str(where),
                                 hint="rebuild the folder (scons or pipelink link) instead "
                                      f"of editing {KERNELS_JSON}")
    strings(index["kernels"], "kernels")
    for name, archs in (index.get("elsewhere") or {}).items():
        if not isinstance(archs, list):
            raise refused(where, f"elsewhere.{name}", list, archs)
        strings(archs, f"elsewhere.{name}")
    autograd = index.get("autograd")
    if autograd is not None:
        fields(autograd, "autograd", _AUTOGRAD)
        for x, grad in autograd["grads"].items():
            fields(grad, f"autograd.grads.{x}", _GRAD)
            strings(grad["inputs"], f"autograd.grads.{x}.inputs")
        strings(autograd.get("returns"), "autograd.returns")
        strings(autograd.get("scratch"), "autograd.scratch")
        for i, launch in enumerate(autograd.get("launches") or ()):
            fields(launch, f"autograd.launches[{i}]", _LAUNCH)
            strings(launch["inputs"], f"autograd.launches[{i}].inputs")
    for i, entry in enumerate(index.get("dispatch") or ()):
        fields(entry, f"dispatch[{i}]", _DISPATCH)
        strings(entry.get("when"), f"dispatch[{i}].when")


class KernelSet:
    """The kernels of one recipe: ``ks.forward(x, w)``, ``ks["dgrad"]``, and ``ks(x, w)``
    (the differentiable forward) where the recipe defines autograd, or the one kernel
    where it has one, or the kernel its ``dispatch`` picks for the call's sizes."""

    # (op, its conditions as (text, function of the sizes)), in order; empty: no dispatch
    dispatch: tuple[tuple[Op, tuple[tuple[str, Callable[[dict[str, Any]], Any]], ...]], ...] = ()
    forward_op: Op | None = None              # what a call runs without dispatch
    _returns: tuple[int, ...] | None = None   # the forward outputs a call hands back

    def __init__(self, folder: Path | str) -> None:
        folder = Path(folder)
        try:
            index = json.loads((folder / KERNELS_JSON).read_text())
        except (OSError, ValueError) as exc:
            raise RuntimeLaunchError(f"not a built multi-kernel folder: {exc}",
                                     where=str(folder / KERNELS_JSON),
                                     hint="build it with scons or 'pipelink link'") from None
        check_index(index, folder / KERNELS_JSON)
        self._set_up(folder, index, {name: Op(folder / sub)
                                     for name, sub in sorted(index["kernels"].items())})

    def _set_up(self, folder: Path, index: dict[str, Any], kernels: dict[str, Op]) -> None:
        """The set from its kernels.json (`index`) and its loaded kernels."""
        self.folder, self.recipe = folder, index.get("recipe", folder.name)
        self.kernels = kernels
        self.autograd = index.get("autograd")
        self._set_dispatch(index.get("dispatch") or ())
        if self.autograd:
            self.forward_op = self._kernel(self.autograd["forward"], "autograd.forward")
            self._check_tensor_names()
            # Gradient kernels built for other archs only (kernels.<k>.arch): the forward
            # runs here, backpropagation through it is refused, naming them.
            unbuilt = "; ".join(
                f"kernel '{n}' is built for {', '.join(archs)} only, not for "
                f"{index.get('arch', 'this arch')}"
                for n, archs in _unbuilt_gradients(self.autograd, index.get("elsewhere") or {}))
            # Every kernel a call may run forward has the recipe's gradients (the checker
            # gave the dispatched kernels one signature).
            for op in {id(op): op for op in (self.forward_op, *self._dispatched())}.values():
                if unbuilt:
                    torch_ops.refuse_backward(op, unbuilt)
                else:
                    _register_backward(op, self.autograd, self)
            names = [o.name for o in self.forward_op.spec.outputs]
            if self.autograd.get("returns"):
                self._returns = tuple(names.index(n) for n in self.autograd["returns"])
        elif len(self.kernels) == 1 and not self.dispatch:
            # One kernel and no gradients (a recipe that removed the rest, e.g. a
            # forward-only variant): calling the set calls it, as a one-kernel recipe's op
            # (which, like every op without gradient kernels, refuses backward).
            self.forward_op = next(iter(self.kernels.values()))

    def _check_tensor_names(self) -> None:
        """The autograd section names tensors the kernels have (the checker saw to it; a
        hand edit may not): each gradient is of a forward input, each input reference a
        forward tensor or the gradient of a forward output, each gradient output and
        each returned output one the kernel has."""
        section, spec = self.autograd, self.forward_op.spec
        forward = f"kernel '{section['forward']}'"
        inputs, outputs = list(spec.input_names), [o.name for o in spec.outputs]
        refs = {f"autograd.launches[{i}].inputs": launch["inputs"]
                for i, launch in enumerate(section.get("launches") or ())}
        for x, grad in section["grads"].items():
            key = f"autograd.grads.{x}"
            if x not in inputs:
                raise self._refuse(key, x, f"is not an input of {forward}", inputs)
            refs[f"{key}.inputs"] = grad["inputs"]
            op = self.kernels.get(grad["kernel"])    # absent: built elsewhere, or refused
            if op is None:
                continue
            theirs = [o.name for o in op.spec.outputs]
            if not theirs:
                raise self._refuse(f"{key}.kernel", grad["kernel"], "has no output to be "
                                   f"the gradient of '{x}'", list(self.kernels))
            output = grad.get("output") or theirs[0]
            if output not in theirs:
                raise self._refuse(f"{key}.output", output,
                                   f"is not an output of kernel '{grad['kernel']}'", theirs)
        tensors = [*inputs, *outputs, *(GRAD_PREFIX + o for o in outputs)]
        for key, names in refs.items():
            for i, ref in enumerate(names):
                if ref.removesuffix(TRANSPOSE_SUFFIX) not in tensors:
                    raise self._refuse(f"{key}[{i}]", ref, f"names no tensor of {forward}",
                                       tensors)
        for i, name in enumerate(section.get("returns") or ()):
            if name not in outputs:
                raise self._refuse(f"autograd.returns[{i}]", name,
                                   f"is not an output of {forward}", outputs)

    def _refuse(self, key: str, name: str, message: str, known: list[str]) -> RuntimeLaunchError:
        """kernels.json's ``key`` names ``name``, which ``message`` says is wrong."""
        return RuntimeLaunchError(f"key '{key}': '{name}' {message}",
                                  where=str(self.folder / KERNELS_JSON),
                                  hint=did_you_mean(name, known) + "known: "
                                  + (", ".join(known) or "none") + "; rebuild the folder "
                                  f"(scons or pipelink link) instead of editing {KERNELS_JSON}")

    def _dispatched(self) -> list[Op]:
        return [op for op, _ in self.dispatch]

    def _kernel(self, name: str, key: str) -> Op:
        if name not in self.kernels:
            raise RuntimeLaunchError(f"{key} names kernel '{name}', which {self.recipe} does "
                                     "not have", where=str(self.folder / KERNELS_JSON),
                                     hint=did_you_mean(name, self.kernels) + "kernels: "
                                     + ", ".join(self.kernels))
        return self.kernels[name]

    @property
    def check_contents(self) -> bool:
        """Whether every kernel checks its index inputs' values (``launch.contents``)
        before a launch; setting it sets it on each kernel of the set (on the set alone
        it would reach none of them)."""
        return all(op.check_contents for op in self.kernels.values())

    @check_contents.setter
    def check_contents(self, value: bool) -> None:
        for op in self.kernels.values():
            op.check_contents = bool(value)

    def __getitem__(self, name: str) -> Op:
        return self._kernel(name, "kernel")

    def __getattr__(self, name: str) -> Op:
        kernels = self.__dict__.get("kernels", {})
        if name in kernels:
            return kernels[name]
        raise AttributeError(name)

    def _set_dispatch(self, entries: Any) -> None:
        """The dispatch rules as (op, conditions parsed once), in order."""
        self.dispatch = tuple(
            (self._kernel(d["kernel"], f"dispatch[{i}].kernel"),
             tuple((text, self._condition(text, f"dispatch[{i}].when[{j}]"))
                   for j, text in enumerate(d.get("when") or ())))
            for i, d in enumerate(entries))
        self._chosen: dict[tuple, Op] = {}

    def _condition(self, text: str, key: str) -> Callable[[dict[str, Any]], Any]:
        """A dispatch condition parsed; one the host cannot evaluate is refused naming
        kernels.json and the key."""
        try:
            return condition(text, key)
        except RuntimeLaunchError as exc:
            raise RuntimeLaunchError(exc.message, where=f"{self.folder / KERNELS_JSON}: {key}",
                                     hint=exc.hint) from None

    def choose(self, *inputs: Any, **kw: Any) -> Op:
        """The kernel a call with these arguments runs (``dispatch``): the first whose
        conditions hold on the sizes the inputs' shapes bind. A call whose inputs do not
        fit the signature goes to the last kernel, whose checks then name the mistake."""
        spec = self.dispatch[0][0].spec
        shapes = []
        for i, want in enumerate(spec.inputs):
            tensor = inputs[i] if i < len(inputs) else kw.get(want.name)
            shape = getattr(tensor, "shape", None)
            if shape is None or len(shape) != len(want.shape):
                return self.dispatch[-1][0]
            shapes.append(tuple(shape))
        given = inputs[len(spec.inputs):]       # scalars may follow the tensors by position
        scalars = tuple(given[j] if j < len(given) else kw.get(name, default)
                        for j, (name, default) in enumerate(spec.scalar_inputs))
        if self.dispatch[0][0]._is_compiling():
            # Traced: the conditions become guards on the sizes, nothing is cached.
            return self._first_that_holds(spec, shapes, scalars)
        key = (*shapes, scalars)
        op = self._chosen.get(key)
        if op is None:
            if len(self._chosen) >= MAX_PLANS:          # as an op's plans: the oldest goes
                self._chosen.pop(next(iter(self._chosen)), None)
            op = self._chosen[key] = self._first_that_holds(spec, shapes, scalars)
        return op

    def _first_that_holds(self, spec: LaunchSpec, shapes: list[tuple[Any, ...]],
                          scalars: tuple[Any, ...]) -> Op:
        sizes: dict[str, Any] = dict(self.dispatch[0][0].host_sizes)
        sizes.update(zip((name for name, _ in spec.scalar_inputs), scalars, strict=True))
        for want, shape in zip(spec.inputs, shapes, strict=True):
            for dim, name in zip(shape, want.shape, strict=True):
                if isinstance(name, str) and name.isidentifier():
                    sizes.setdefault(name, dim)
        for op, conditions in self.dispatch:
            if all(holds(sizes) for _, holds in conditions):
                return op
        return self.dispatch[-1][0]

    def __call__(self, *inputs: Any, **kw: Any) -> Any:
        op = self.choose(*inputs, **kw) if self.dispatch else self.forward_op
        if op is None:
            raise RuntimeLaunchError(f"{self.recipe} has several kernels and no autograd: "
                                     "section; call one of them",
                                     hint="kernels: " + ", ".join(self.kernels))
        result = op(*inputs, **kw)
        if self._returns is None:
            return result
        outputs = result if isinstance(result, (tuple, list)) else (result,)   # one: a tensor
        picked = tuple(outputs[i] for i in self._returns)
        return picked[0] if len(picked) == 1 else picked

    def __repr__(self) -> str:
        if self.dispatch:
            names = {id(op): name for name, op in self.kernels.items()}
            rules = ", ".join(
                f"{names[id(op)]} when {' and '.join(t for t, _ in conditions)}"
                if conditions else f"{names[id(op)]} otherwise"
                for op, conditions in self.dispatch)
            return f"<pipelink kernels {self.recipe}: {rules}>"
        return f"<pipelink kernels {self.recipe}: {', '.join(self.kernels)}>"


def _unbuilt_gradients(section: dict[str, Any] | None, elsewhere: dict[str, Any]
                       ) -> list[tuple[str, list[str]]]:
    """(kernel, the archs it is built for) of each gradient kernel kernels.json says was
    not built for its arch."""
    if not section:
        return []
    names = [g["kernel"] for g in section["grads"].values()]
    names += [ln["kernel"] for ln in section.get("launches") or ()]
    return [(n, list(elsewhere[n])) for n in dict.fromkeys(names) if n in elsewhere]


def _register_backward(forward: Op, section: dict[str, Any], kernels: KernelSet) -> None:
    """Registers the gradient kernels as the forward op's autograd formula."""
    grads = section["grads"]
    scratch = tuple(section.get("scratch") or ())
    # With scratch, every launch runs, in the checker's order (a writer before its
    # readers), and a scratch tensor is released after the last launch that reads it.
    order = [(kernels._kernel(ln["kernel"], "autograd.launches"), tuple(ln["inputs"]))
             for ln in section.get("launches") or ()]
    input_names = forward.spec.input_names
    outputs = tuple(o.name for o in forward.spec.outputs)
    refs = {r for g in grads.values() for r in g["inputs"]}
    saved = [n for n in (*input_names, *outputs)
             if any(r.removesuffix(TRANSPOSE_SUFFIX) == n for r in refs)]
    name = torch_ops.op_name(forward.kernel.meta)
    # (input position, kernel, its input references, which of its outputs)
    steps = []
    for x, g in grads.items():
        op = kernels._kernel(g["kernel"], f"autograd.grads.{x}")
        out_names = [o.name for o in op.spec.outputs]
        steps.append((input_names.index(x), op, tuple(g["inputs"]),
                      out_names.index(g.get("output") or out_names[0])))

    # Outputs whose gradient no formula reads (what the forward keeps for the backward,
    # index tensors) are not differentiable: autograd neither builds zero gradients for
    # them (at MoE shapes those zeros were 1.6 GB and a memset per step) nor lets a loss
    # through them pretend to backpropagate.
    differentiable = {r.removeprefix(GRAD_PREFIX).removesuffix(TRANSPOSE_SUFFIX)
                      for r in refs if r.startswith(GRAD_PREFIX)}

    # torch.library calls these with keywords: the parameter names are its.
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        values = dict(zip(input_names, inputs[:len(input_names)], strict=True))
        values.update(zip(outputs, output if len(outputs) > 1 else (output,), strict=True))
        ctx.save_for_backward(*(values[n] for n in saved))
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(*(values[o] for o in outputs if o not in differentiable))
        ctx.grad_like = {o: (values[o].shape, values[o].dtype, values[o].device)
                         for o in differentiable}

    def backward(ctx: Any, *grad_outputs: Any) -> tuple[Any, ...]:
        import torch
        if scratch and getattr(ctx, "used_up", False):
            raise RuntimeLaunchError(
                f"{name}'s backward ran once already: it writes into and releases the "
                f"tensors its forward kept ({', '.join(scratch)})",
                hint="run the forward again for another backward (retain_graph=True "
                     "cannot reuse this graph)")
        env = dict(zip(saved, ctx.saved_tensors, strict=True))
        for o, g in zip(outputs, grad_outputs, strict=True):
            if o in differentiable:    # None when the loss did not use it: zeros
                shape, dtype, device = ctx.grad_like[o]
                env[GRAD_PREFIX + o] = g if g is not None else torch.zeros(
                    shape, dtype=dtype, device=device)
        # One per argument the op was called with: its scalars (after the tensors, the
        # dispatcher dropping those left at their defaults) get none.
        result: list[Any] = [None] * len(ctx.needs_input_grad)
        launched: dict[tuple[int, tuple[str, ...]], Any] = {}   # one launch per kernel call
        if scratch:
            ctx.used_up = True
            _run_in_order(order, env, launched, scratch)
        for position, op, args, index in steps:
            if not ctx.needs_input_grad[position]:
                continue
            key = (id(op), args)
            if key not in launched:
                launched[key] = op.torch_op(*(_resolve(r, env) for r in args))
            outs = launched[key]
            result[position] = outs[index] if isinstance(outs, (tuple, list)) else outs
        return tuple(result)

    torch_ops.set_autograd(name, backward, setup_context)


def _run_in_order(order: list[tuple[Op, tuple[str, ...]]], env: dict[str, Any],
                  launched: dict[tuple[int, tuple[str, ...]], Any],
                  scratch: tuple[str, ...]) -> None:
    """Every gradient launch in order; each scratch tensor's memory goes back to the
    allocator after the last launch that reads it (as autograd frees what a node saved,
    only earlier), so later launches' outputs can take it."""
    last = {r: i for i, (_, args) in enumerate(order) for r in args if r in scratch}
    for i, (op, args) in enumerate(order):
        launched[(id(op), args)] = op.torch_op(*(_resolve(r, env) for r in args))
        for r in (r for r, at in last.items() if at == i):
            if not _traced(env[r]):
                env[r].untyped_storage().resize_(0)


def _traced(tensor: Any) -> bool:
    """A tensor that torch.compile traces with (dynamo's, or AOTAutograd's fake and
    functional tensors while it traces the backward): it has no memory to release, and
    the compiled graph frees the real one when its last use is done."""
    import torch
    from torch._subclasses.fake_tensor import is_fake
    return torch.compiler.is_compiling() or is_fake(tensor) or \
        torch._is_functional_tensor(tensor)


def _resolve(ref: str, env: dict[str, Any]) -> Any:
    transpose = ref.endswith(TRANSPOSE_SUFFIX)
    tensor = env[ref.removesuffix(TRANSPOSE_SUFFIX)]
    if transpose:
        tensor = tensor.t()
    return tensor.contiguous()
