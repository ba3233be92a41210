"""The ``pipelink`` command line.

    pipelink compile components/tile_loader/contract.yaml --arch sm_90a -o x.o [-p k=v]
    pipelink inspect x.o [--json]
    pipelink check recipes/gemm.yaml --arch sm_90a [--build build/dev/sm_90a/gemm]
    pipelink place recipes/gemm.yaml --arch sm_90a [--json]
    pipelink explain recipes/gemm.yaml --arch sm_90a [--svg out.svg]
    pipelink link recipes/gemm.yaml --arch sm_90a -o build/... [--mode mono]
    pipelink dispatch recipes/gemm_auto.yaml M=256 N=22016 K=4096 [--num-sms 132]
    pipelink schema [--markdown]

check, place, explain and link take ``--kernel NAME`` (repeatable) for a multi-kernel
recipe; without it they handle every kernel.

Commands that take a recipe compile what they need into ``--build`` (default
``build/cli/<arch>/<recipe>/obj``), so ``check`` and ``place`` work on a fresh tree.
User mistakes print one message and exit 2; they never print a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import PipeLinkError
from .work import accepted_records

if TYPE_CHECKING:
    from .recipe import ComponentIndex, Recipe

EXIT_USER = 2          # a user mistake: one message, no traceback
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C


class UsageError(PipeLinkError):
    """A command-line argument names something unusable (a file where a folder goes)."""


def _params(pairs: list[str]) -> dict[str, int | str]:
    out: dict[str, int | str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise UsageError(f"-p {pair!r}: write name=value", where="command line",
                             hint="e.g. -p tile_m=128")
        out[key] = int(value) if value.lstrip("-").isdigit() else value
    return out


def _nearest_existing(path: Path) -> Path | None:
    """``path``, or the nearest folder above it, that exists."""
    return next((at for at in (path, *path.parents) if at.exists()), None)


def _folder(path: Path, flag: str) -> Path:
    """``path`` where a folder goes: refused if it, or a folder above it, is a file."""
    at = _nearest_existing(path)
    if at is not None and not at.is_dir():
        what = "is" if at == path else f"is inside {at}, which is"
        raise UsageError(f"{flag} {path} {what} a file, not a folder", where="command line",
                         hint=f"give {flag} a folder (it is created if missing)")
    return path


def _file(path: Path, flag: str) -> Path:
    """``path`` where a file goes: refused if it is a folder (the write would fail on a
    temporary name beside it), or inside a file."""
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a folder, not a file", where="command line",
                         hint=f"give {flag} a file name, e.g. {path / 'map.svg'}")
    at = _nearest_existing(path.parent)
    if at is not None and not at.is_dir():
        raise UsageError(f"{flag} {path} is inside {at}, which is a file",
                         where="command line",
                         hint=f"give {flag} a path in a folder (created if missing)")
    return path


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return value


def cmd_compile(a: argparse.Namespace) -> int:
    from .compile import CompileOptions, compile_component
    obj = compile_component(a.contract, _params(a.param), CompileOptions(a.arch), a.output)
    print(f"{a.output}: {obj.component} for {obj.arch}, {len(obj.ltoir)} bytes of LTO-IR")
    return 0


def cmd_inspect(a: argparse.Namespace) -> int:
    from .objfile import read_object
    obj = read_object(a.object)
    h = obj.header
    if a.json:
        print(json.dumps(h, sort_keys=True, indent=1))
        return 0
    bound = obj.bound()
    print(f"{a.object}: PipeLink object, format {h['format']}")
    print(f"  component  {h['component']} ({bound.contract.kind})")
    print(f"  arch       {h['arch']}")
    print(f"  params     {json.dumps(h['params'], sort_keys=True)}")
    print(f"  tunables   {json.dumps(bound.contract.data.get('tunables', {}), sort_keys=True)}")
    print(f"  source     sha256 {h['source_sha256']}")
    print(f"  contract   sha256 {h['contract_sha256']}")
    print(f"  ltoir      {h['ltoir_bytes']} bytes, sha256 {h['ltoir_sha256']}")
    print(f"  toolchain  {json.dumps(h['toolchain'], sort_keys=True)}")
    print(f"  symbols    {json.dumps(h['symbols'], sort_keys=True)}")
    for key, value in bound.resolved().items():
        print(f"  {key:<28} {json.dumps(value, sort_keys=True)}")
    for port in bound.contract.ports.values():
        fields = {k: v for k, v in port.spec.items()}
        dtype = (bound.dtype(port.dtype, f"ports.{port.name}.dtype") if port.kind != "work"
                 else "/".join(accepted_records(port.spec)) or "record")   # records
        print(f"  port {port.name:<10} {port.dir} {port.kind} {dtype} role={port.role} "
              f"{json.dumps(fields, sort_keys=True)}")
    return 0


def _check_contracts(view: Recipe, arch: str, index: ComponentIndex) -> None:
    """One kernel of a recipe checked from its components' contract YAML, before any of
    them compiles: a wiring mistake costs no compile."""
    from .build import bind_components
    from .check import check
    check(view, arch, {inst: bound for inst, (bound, _) in
                       bind_components(view, arch, index).items()})


def _kernels(a: argparse.Namespace):  # noqa: ANN202  (returns Recipe, [Kernel])
    from .build import build_objects, default_index
    from .link import check_objects
    from .recipe import load_recipe
    recipe = load_recipe(a.recipe)
    build = _folder(Path(a.build or f"build/cli/{a.arch}/{recipe.name}/obj"), "--build")
    index = default_index()
    views = recipe.select(a.kernel, a.arch).values()
    for view in views:
        _check_contracts(view, a.arch, index)
    # Then what the objects carry: the contracts they were compiled from.
    kernels = []
    for view in views:
        objects = build_objects(view, a.arch, index, build)
        kernels.append(check_objects(view, a.arch, objects, index)[0])
    return recipe, kernels


def _label(kernel: object) -> str:
    """``gemm``, or ``linear/forward`` for a kernel of a multi-kernel recipe."""
    r = kernel.recipe
    return f"{r.recipe_name}/{r.kernel}" if r.folder else r.name


def cmd_check(a: argparse.Namespace) -> int:
    from .check import check_autograd, check_dispatch
    recipe, kernels = _kernels(a)
    for kernel in kernels:
        for w in kernel.warnings:
            print(w, file=sys.stderr)
        kinds = ", ".join(f"{t.src} -> {t.dst} ({t.kind})" for t in kernel.transfers)
        print(f"{_label(kernel)} ({a.arch}): ok; {len(kernel.bound)} instances, "
              f"{len(kernel.lanes)} warp lanes; transfers: {kinds or 'none'}")
    autograd = check_autograd(recipe)
    if autograd is not None:
        grads = ", ".join(f"d{x} by {g['kernel']}" for x, g in autograd["grads"].items())
        elsewhere = recipe.elsewhere(a.arch)
        unbuilt = sorted({g["kernel"] for g in autograd["grads"].values()} & set(elsewhere))
        refused = "".join(f"; {n} is built for {', '.join(elsewhere[n])} only: backpropagation "
                          f"is refused on {a.arch}" for n in unbuilt)
        print(f"{recipe.name} autograd: ok; forward {autograd['forward']}, {grads}{refused}")
    dispatch = check_dispatch(recipe)
    if dispatch is not None:
        rules = "; ".join(f"{d['kernel']} when {' and '.join(d['when'])}" if "when" in d
                          else f"{d['kernel']} otherwise" for d in dispatch)
        print(f"{recipe.name} dispatch: ok; {rules}")
    return 0


def cmd_place(a: argparse.Namespace) -> int:
    from .link import place_kernel
    from .report import explain
    recipe, kernels = _kernels(a)
    placements = {k.recipe.kernel: (k, place_kernel(k, a.workers)) for k in kernels}
    if a.json and not recipe.multi:
        sys.stdout.write(next(iter(placements.values()))[1].to_json())
        return 0
    if a.json:  # one document: kernel -> placement
        doc = {name: json.loads(p.to_json()) for name, (_, p) in placements.items()}
        print(json.dumps(doc, sort_keys=True, indent=1))
        return 0
    for kernel, placement in placements.values():
        if recipe.multi:
            print(f"== {_label(kernel)}")
        print(explain(kernel.problem, placement))
    return 0


def cmd_explain(a: argparse.Namespace) -> int:
    from .link import place_kernel
    from .objfile import write_atomic
    from .report import explain, svg
    if a.svg:
        _file(Path(a.svg), "--svg")
    recipe, kernels = _kernels(a)
    for kernel in kernels:
        placement = place_kernel(kernel, a.workers)
        if recipe.multi:
            print(f"== {_label(kernel)}")
        print(explain(kernel.problem, placement))
        if a.svg:
            path = Path(a.svg)
            if recipe.multi:  # one picture per kernel: map.svg -> map.forward.svg
                path = path.with_name(f"{path.stem}.{kernel.recipe.kernel}{path.suffix}")
            write_atomic(path, svg(kernel.problem, placement))
            print(f"picture: {path}")
    return 0


def cmd_link(a: argparse.Namespace) -> int:
    from .build import build_objects, default_index
    from .link import LinkOptions, link_recipe
    from .recipe import load_recipe
    recipe = load_recipe(a.recipe)
    out = _folder(Path(a.output), "--output")
    objects = {name: build_objects(view, a.arch, default_index(), out / "obj")
               for name, view in recipe.select(a.kernel, a.arch).items()}
    results = link_recipe(recipe, objects, out, LinkOptions(a.arch, mode=a.mode,
                                                            emit_ptx=a.ptx,
                                                            phase_clock=a.phase_clock),
                          kernels=a.kernel, index=default_index())
    for result in results.values():
        split = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in result.timings.items())
        print(f"{result.cubin}: {result.placement.threads} threads, "
              f"{result.placement.smem_bytes} B smem ({split})")
    return 0


def cmd_dispatch(a: argparse.Namespace) -> int:
    """Which kernel of a dispatching recipe a call of these sizes runs, and why: each
    entry's conditions with both sides evaluated, in order, as the runtime walks them."""
    from . import expr
    from .check import check_dispatch, dispatch_on
    from .recipe import load_recipe
    from .runtime.spec import H100_HOST_SIZES, condition
    recipe = load_recipe(a.recipe)
    entries = check_dispatch(recipe)
    if entries is None:
        raise UsageError(f"{a.recipe} has no dispatch: section", where="command line",
                         hint="dispatch picks among the kernels of a dispatching recipe, "
                              "e.g. recipes/gemm_auto.yaml")
    if a.arch not in recipe.archs:
        raise UsageError(f"{a.recipe} does not build for {a.arch}", where="command line",
                         hint="its archs: " + ", ".join(recipe.archs))
    here = dispatch_on(recipe, entries, a.arch)
    for entry in entries:
        if entry not in here:
            print(f"  {entry['kernel']}: not built for {a.arch}, skipped")
    entries = here
    sizes = {**H100_HOST_SIZES, **{k: v for k, v in (("num_sms", a.num_sms),
                                                   ("l2_bytes", a.l2_bytes)) if v},
             **_sizes(a.sizes)}
    for entry in entries:
        results = []
        for text in entry.get("when", []):
            left, op, right = expr.comparison(text)
            missing = sorted((expr.names(left) | expr.names(right)) - set(sizes))
            if missing:
                raise UsageError(f"condition {text!r} of kernel '{entry['kernel']}' names "
                                 f"{', '.join(missing)}", where="command line",
                                 hint="give " + " ".join(f"{n}=<int>" for n in missing))
            lhs, rhs = expr.evaluate(left, sizes), expr.evaluate(right, sizes)
            holds = bool(condition(text, "dispatch")(sizes))   # as the runtime decides
            results.append(holds)
            print(f"  {entry['kernel']}: {text}: {lhs} {op} {rhs}, "
                  f"{'holds' if holds else 'fails'}")
        if all(results):
            print(f"{recipe.name} runs {entry['kernel']} for "
                  + ", ".join(f"{k}={v}" for k, v in sizes.items()))
            return 0
    return 0   # unreachable: check_dispatch gives the last entry no conditions


def _sizes(pairs: list[str]) -> dict[str, int]:
    """``size=integer`` pairs: a tensor's size is >= 0, and a GPU's (num_sms, l2_bytes)
    >= 1, as the runtime would find them."""
    from .check import HOST_SIZES
    out = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key.isidentifier() or not value.isdigit():
            raise UsageError(f"{pair!r}: write size=integer, the integer >= 0",
                             where="command line", hint="e.g. M=256 N=22016 K=4096")
        if key in HOST_SIZES and int(value) < 1:
            raise UsageError(f"{pair!r}: a GPU has {key} >= 1", where="command line",
                             hint=f"give {key} a positive value, or leave it to the default")
        out[key] = int(value)
    return out


def cmd_schema(a: argparse.Namespace) -> int:
    from .schema import CONTRACT_SCHEMA, RECIPE_SCHEMA, markdown_reference
    if a.markdown:
        print(markdown_reference(CONTRACT_SCHEMA, "Contract reference"))
        print(markdown_reference(RECIPE_SCHEMA, "Recipe reference"))
    else:
        print(json.dumps({"contract": CONTRACT_SCHEMA, "recipe": RECIPE_SCHEMA}, indent=1))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pipelink", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile", help="compile one component into a PipeLink object")
    c.add_argument("contract")
    c.add_argument("--arch", required=True)
    c.add_argument("-o", "--output", required=True)
    c.add_argument("-p", "--param", action="append", default=[], help="name=value")
    c.set_defaults(func=cmd_compile)
    i = sub.add_parser("inspect", help="print an object's contract, arch, params and hashes")
    i.add_argument("object")
    i.add_argument("--json", action="store_true")
    i.set_defaults(func=cmd_inspect)
    for name, func, help_ in (("check", cmd_check, "check a recipe's wiring"),
                              ("place", cmd_place, "solve the placement"),
                              ("explain", cmd_explain, "print the placement map"),
                              ("link", cmd_link, "build and link a recipe")):
        s = sub.add_parser(name, help=help_)
        s.add_argument("recipe")
        s.add_argument("--arch", required=True)
        s.add_argument("--build", help="folder for component objects")
        s.add_argument("--workers", type=_positive, default=1,
                       help="solver threads (>= 1); the placement is the same for any")
        s.add_argument("--kernel", action="append", metavar="NAME",
                       help="a kernel of a multi-kernel recipe (repeatable; default: all)")
        if name == "place":
            s.add_argument("--json", action="store_true")
        if name == "explain":
            s.add_argument("--svg")
        if name == "link":
            s.add_argument("-o", "--output", required=True)
            s.add_argument("--mode", choices=["linked", "mono"], default="linked")
            s.add_argument("--ptx", action="store_true")
            s.add_argument("--phase-clock", action="store_true",
                           help="record when each CTA finishes each phase (op.phase_times())")
        s.set_defaults(func=func)
    d = sub.add_parser("dispatch", help="which kernel a dispatching recipe runs for sizes")
    d.add_argument("recipe")
    d.add_argument("sizes", nargs="*", metavar="SIZE=VALUE",
                   help="the inputs' sizes, e.g. M=256 N=22016 K=4096")
    d.add_argument("--num-sms", type=_positive,
                   help="resident CTAs (default: an H100's, 132, as an H200's)")
    d.add_argument("--l2-bytes", type=_positive,
                   help="the GPU's L2 in bytes (default: an H100's, 50 MiB; an H200 "
                        "has more)")
    d.add_argument("--arch", default="sm_90a",
                   help="the arch whose kernels the call may run (default: sm_90a)")
    d.set_defaults(func=cmd_dispatch)
    s = sub.add_parser("schema", help="print the contract and recipe schemas")
    s.add_argument("--markdown", action="store_true")
    s.set_defaults(func=cmd_schema)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except PipeLinkError as exc:
        print(f"pipelink: {exc.kind}: {exc.render()}", file=sys.stderr)
        return EXIT_USER
    except KeyboardInterrupt:  # Ctrl-C: outputs are written atomically, nothing to undo
        print("pipelink: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `pipelink explain ... | head`: the reader left, not an error
        sys.stderr.close()
        return 0
    except OSError as exc:   # a path the user gave that the system refuses
        name = f" {exc.filename}" if exc.filename else ""
        print(f"pipelink: error: cannot use{name}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USER


if __name__ == "__main__":
    sys.exit(main())
