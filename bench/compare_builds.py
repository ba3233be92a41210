"""Two builds of one kernel side by side: the same random inputs into both, their
outputs compared, their times interleaved in one process. For a component's author
between a change and the build before it (what a kernel-wide benchmark would need two
runs, and so two GPU states, to tell apart):

    cp -r build/dev/sm_90a/attn_causal /tmp/before     # then change the component
    scons -Q recipe=attn_causal arch=sm_90a
    python bench/compare_builds.py /tmp/before/forward build/dev/sm_90a/attn_causal/forward \\
        --sizes B=4,S=4096,H=16,HKV=16,D=128 --sizes B=1,S=16384,H=16,HKV=16,D=128

A kernel folder holds kernel.json (a multi-kernel recipe's folder holds one per
kernel). Each input is drawn from N(0, 1) in its dtype, shaped as kernel.json declares
it with the sizes --sizes binds; a kernel that reads an integer input (offsets,
indices, a page table) needs values this tool cannot invent and is refused. Both
kernels' outputs must agree within --tolerance of the larger max |value| of the two:
the same work summed in another order rounds apart, a wrong tile does not. Times:
medians of CUDA events around single calls, the two kernels alternating, and
triton.testing.do_bench (L2 flushed) where triton is installed, in rounds that swap
which kernel goes first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from results_md import write_text  # noqa: E402

from pipelink.errors import PipeLinkError  # noqa: E402
from pipelink.expr import evaluate  # noqa: E402

FLOAT_DTYPES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}
TOLERANCE = 2e-2        # of the larger max |value|: bf16 outputs of reordered fp32 sums
# do_bench times one kernel's launches, then the other's: in rounds that swap which goes
# first, so the second is not always the one on the hotter GPU (on an H100 a single
# round put a 4% gain at -7%).
DO_BENCH_MS = 40
DO_BENCH_ROUNDS = 4


class CompareError(PipeLinkError):
    """A comparison that cannot run: the folders or the sizes given are not usable."""


def parse_sizes(text: str) -> dict[str, int]:
    """``B=4,S=4096`` as {"B": 4, "S": 4096}."""
    sizes = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not name.strip().isidentifier() or not value.strip().isdigit():
            raise CompareError(f"--sizes {text!r}: {item!r} is not NAME=INTEGER",
                               hint="e.g. --sizes B=4,S=4096,H=16,HKV=16,D=128")
        sizes[name.strip()] = int(value)
    return sizes


def launch_of(folder: Path) -> dict:
    """kernel.json's launch section of a kernel folder."""
    spec = folder / "kernel.json"
    if not spec.is_file():
        raise CompareError(f"{folder}: no kernel.json",
                           hint="pass a kernel's folder, e.g. build/dev/sm_90a/attn_causal/"
                                "forward (a recipe folder with kernels.json holds one per "
                                "kernel)")
    return json.loads(spec.read_text())["launch"]


def input_shapes(folder: Path, sizes: dict[str, int]) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, dtype, shape) of each of the kernel's inputs, in call order."""
    shapes = []
    for spec in launch_of(folder)["inputs"]:
        name, dtype = spec["name"], spec["dtype"]
        if dtype not in FLOAT_DTYPES:
            raise CompareError(f"{folder}: input '{name}' is {dtype}",
                               hint="compare_builds draws floating inputs only; time a "
                                    "kernel with index inputs from its recipe's benchmark")
        where = f"{folder}: input '{name}'"
        missing = sorted({d for d in spec["shape"] if isinstance(d, str) and d.isidentifier()}
                         - set(sizes))
        if missing:
            raise CompareError(f"{where} has shape {spec['shape']}: --sizes binds no "
                               f"{', '.join(missing)}", hint="add them to --sizes")
        shapes.append((name, dtype, tuple(evaluate(d, sizes, where=where)
                                          for d in spec["shape"])))
    return shapes


def poisoned(spec: dict, sizes: dict[str, int], where: str):  # noqa: ANN201  (a tensor)
    """An output tensor as kernel.json declares it: NaN where floating, else empty."""
    import torch
    shape = tuple(evaluate(d, sizes, where=where) for d in spec["shape"])
    dtype = FLOAT_DTYPES.get(spec["dtype"])
    if dtype is None:
        from pipelink.runtime.tensors import TORCH_DTYPES
        dtype = next(t for t, ours in TORCH_DTYPES.items() if ours == spec["dtype"])
        return torch.empty(shape, device="cuda", dtype=getattr(torch, dtype))
    return torch.full(shape, float("nan"), device="cuda", dtype=getattr(torch, dtype))


def mismatch(a, b) -> float:  # noqa: ANN001  (torch tensors)
    """Max |a - b| over the larger max |value| of the two (0 where both are all zero);
    NaN where their NaNs sit apart."""
    import torch
    a, b = a.float(), b.float()
    if not torch.equal(a.isnan(), b.isnan()):
        return float("nan")
    a, b = a.nan_to_num(), b.nan_to_num()
    scale = max(float(a.abs().max()), float(b.abs().max()))
    return float((a - b).abs().max()) / scale if scale > 0 else 0.0


def compare(before: Path, after: Path, ops: dict, sizes: dict[str, int], rounds: int) -> dict:
    """One size set: both kernels (`ops`, loaded from the two folders) on the same
    inputs, outputs compared, times."""
    import torch

    from bench.gemm_swiglu import flushed
    shapes = input_shapes(before, sizes)
    if shapes != input_shapes(after, sizes):
        raise CompareError(f"{before} and {after} take different inputs",
                           hint="compare two builds of the same kernel")
    gen = torch.Generator(device="cuda").manual_seed(0)
    inputs = [torch.randn(shape, generator=gen, device="cuda").to(getattr(torch, FLOAT_DTYPES[d]))
              for _, d, shape in shapes]
    outputs = launch_of(before)["outputs"]
    # Floating outputs start as NaN, so an element one kernel leaves unwritten fails.
    outs = {k: tuple(poisoned(o, sizes, where=f"{before}: output '{o['name']}'")
                     for o in outputs) for k in ops}
    for k, op in ops.items():
        op(*inputs, out=outs[k])
    diffs = {o["name"]: mismatch(a, b)
             for o, a, b in zip(outputs, outs["before"], outs["after"], strict=True)}
    samples: dict[str, list[float]] = {k: [] for k in ops}
    for r in range(rounds):
        for k in (("before", "after") if r % 2 == 0 else ("after", "before")):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            ops[k](*inputs)
            end.record()
            end.synchronize()
            samples[k].append(start.elapsed_time(end))
    events = {k: statistics.median(v[1:]) for k, v in samples.items()}
    return {"sizes": sizes, "events_ms": events,
            "do_bench_ms": flushed({k: (lambda op=op: op(*inputs)) for k, op in ops.items()},
                                   rep=DO_BENCH_MS, rounds=DO_BENCH_ROUNDS),
            "relative_diff": diffs}


def summary(row: dict, tolerance: float) -> tuple[str, bool]:
    """One line per size set (before / after above 1: the change is faster), and whether
    the outputs agree."""
    ok = all(d <= tolerance for d in row["relative_diff"].values())   # NaN fails
    times = [row["events_ms"]] + ([row["do_bench_ms"]] if row["do_bench_ms"] else [])
    ratio = " / ".join(f"{t['before'] / t['after']:.3f}x" for t in times)
    sizes = ",".join(f"{k}={v}" for k, v in row["sizes"].items())
    ms = " / ".join(f"{t['before']:.3f} -> {t['after']:.3f} ms" for t in times)
    diffs = ", ".join(f"{n} {d:.1e}" for n, d in row["relative_diff"].items())
    return f"{sizes}: {ms}, before/after {ratio}; outputs {diffs}" + ("" if ok else " MISMATCH"), ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p.add_argument("--sizes", action="append", required=True, type=parse_sizes,
                   help="NAME=INTEGER,...: the sizes of one case (repeat for more)")
    p.add_argument("--rounds", type=int, default=41)
    p.add_argument("--tolerance", type=float, default=TOLERANCE)
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    try:
        import pipelink
        for folder in (a.before, a.after):
            launch_of(folder)       # refused with the fix before the loader sees it
        ops = {"before": pipelink.load(a.before), "after": pipelink.load(a.after)}
        rows = [compare(a.before, a.after, ops, sizes, a.rounds) for sizes in a.sizes]
    except PipeLinkError as e:
        print(f"compare_builds: {e}", file=sys.stderr)
        return 2
    lines = [summary(row, a.tolerance) for row in rows]
    print("\n".join(line for line, _ in lines))
    if a.json:
        write_text(a.json, json.dumps({"before": str(a.before), "after": str(a.after),
                                       "rows": rows}, indent=1) + "\n")
    return 0 if all(ok for _, ok in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
