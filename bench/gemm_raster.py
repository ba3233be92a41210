"""How many tile rows a GEMM scheduler's L2 group should hold, measured: the built gemm
and gemm_swiglu kernels rerun with their ``sched.group_m`` bind set to each candidate,
side by side in one run, at the shapes whose tiles fill several waves (M >= 2048).

A persistent CTA grid runs the tiles ``gridDim.x`` at a time in raster order
(pipelink/raster.cuh): ``group_m`` rows of tiles, column by column. One wave of 132
CTAs over 128 x 256 tiles then reads group_m tile rows of A and 132 / group_m tile
columns of B, fewest bytes near group_m = 16 (128 g = 256 x 132 / g); 8 was the first
guess and every GEMM recipe's bind.

Only kernel.json's bind changes (a copy of the folder per candidate; the cubin is the
same bytes). The tiles a split-K tail cuts into pieces are the last ones in raster
order, so they differ between candidates and their fp32 sums round differently: every
output is compared with the built bind's, within a tolerance that a wrong tile breaks.

    python -m tests.gpu.build gemm gemm_swiglu                     # build machine
    python bench/gemm_raster.py --json bench/gemm_raster.json      # GPU
    python bench/gemm_raster.py --report bench/gemm_raster.json

Medians in ms: CUDA events, interleaved over the candidates, rotating input sets so W
is read from HBM; and triton.testing.do_bench (L2 flushed).
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from rebind import rebound_copy  # noqa: E402
from results_md import RESULTS, bench_main, put_report, write_rows  # noqa: E402

from bench.gemm_swiglu import MS, SHAPES, flushed, geomean, interleaved  # noqa: E402

RECIPES = ("gemm", "gemm_swiglu")
BIND = "sched.group_m"
CANDIDATES = (4, 8, 16, 32)
SWEPT_MS = tuple(m for m in MS if m >= 2048)
ROTATE = 3                      # input sets cycled through, so W is re-read from HBM
TOLERANCE = 1e-2                # max |diff| against the built bind's output, relative


def with_group(folder: Path, group_m: int, into: Path) -> Path:
    """A copy of a built recipe folder whose kernel binds ``sched.group_m`` to
    `group_m`; every other byte is the built one's."""
    return rebound_copy(folder, into / f"{folder.name}_g{group_m}", BIND,
                        {"kernel.json": str(group_m)})


def built_group(folder: Path) -> int:
    """The built bind's group_m (a constant in every GEMM recipe)."""
    text = json.loads((folder / "kernel.json").read_text())["launch"]["bind"][BIND]
    try:
        return int(text)
    except ValueError:
        raise SystemExit(f"{folder}: {BIND} is {text!r}, not a constant to sweep") from None


def differs(got, want) -> str | None:  # noqa: ANN001
    """Why `got` is not the built bind's `want` (None: within the tolerance)."""
    err = float((got.float() - want.float()).abs().max() / want.float().abs().max())
    return None if err < TOLERANCE else f"differs by {err:.3g} (relative)"


def sweep(folder: Path, recipe: str, m: int, n: int, k: int, rounds: int,
          scratch: Path) -> dict:
    """One recipe at one shape over the candidates."""
    import torch

    import pipelink
    built = built_group(folder)
    xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(ROTATE)]
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / math.sqrt(k)
          for _ in range(ROTATE)]
    cols = n if recipe == "gemm" else n // 2
    # One set of output buffers for every candidate (poisoned before each checked call).
    bufs = [torch.empty(m, cols, device="cuda", dtype=torch.bfloat16) for _ in range(ROTATE)]
    turn = [0]
    fns, outs = {}, {}
    for g in sorted({built, *CANDIDATES}):
        op = pipelink.load(with_group(folder, g, Path(tempfile.mkdtemp(dir=scratch))))

        def call(op=op):  # noqa: ANN001, ANN202
            turn[0] = (turn[0] + 1) % ROTATE
            return op(xs[turn[0]], ws[turn[0]], out=bufs[turn[0]])
        fns[str(g)] = call
        bufs[0].fill_(float("nan"))
        outs[str(g)] = op(xs[0], ws[0], out=bufs[0]).clone()
    for name, out in outs.items():
        why = differs(out, outs[str(built)])
        if why:
            raise SystemExit(f"{recipe} M={m} N={n} K={k} group_m {name}: {why}")
    reps = max(1, min(10, int(2e12 // (2 * m * n * k))))
    events = interleaved(fns, rounds, reps)
    row = {"recipe": recipe, "M": m, "N": n, "K": k, "built": built, "events_ms": events,
           "do_bench_ms": flushed(fns)}
    print(f"{recipe} M={m} N={n} K={k} (built {built}): "
          + ", ".join(f"g{name} {t:.3f}" for name, t in events.items()), flush=True)
    return row


def run(build: Path, rounds: int, out: Path | None,
        recipes: tuple[str, ...] = RECIPES) -> None:
    import torch
    rows, gpu = [], torch.cuda.get_device_name()
    with tempfile.TemporaryDirectory() as scratch:
        for m in SWEPT_MS:
            for k, n in SHAPES:
                for recipe in recipes:
                    rows.append(sweep(build / "sm_90a" / recipe, recipe, m, n, k, rounds,
                                      Path(scratch)))
                    if out:     # after each case: a run cut short keeps what it measured
                        data = {"gpu": gpu, "torch": torch.__version__, "rows": rows}
                        write_rows(out, data, RECIPES)


def relative(row: dict, name: str) -> str:
    """A candidate's time over the built bind's (events / do_bench); bold: the fastest
    by events."""
    e, d, built = row["events_ms"], row["do_bench_ms"] or {}, str(row["built"])
    text = f"{e[name] / e[built]:.3f}" + (f" / {d[name] / d[built]:.3f}" if name in d else "")
    return f"**{text}**" if e[name] == min(e.values()) else text


def gain_lines(rows: list[dict]) -> list[str]:
    """Per recipe and candidate: the built bind's time over the candidate's, geomean
    over the shapes (above 1: the candidate is faster)."""
    lines = []
    for recipe in RECIPES:
        mine = [r for r in rows if r["recipe"] == recipe]
        if not mine:
            continue
        cells = []
        for g in CANDIDATES:
            gains = [f"{geomean([r[t][str(r['built'])] / r[t][str(g)] for r in mine]):.3f}x"
                     for t in ("events_ms", "do_bench_ms") if all(r[t] for r in mine)]
            cells.append(f"group_m {g} {' / '.join(gains)}")
        lines.append(f"- {recipe}, over the built bind, geomean of {len(mine)} shapes "
                     f"(events / do_bench): " + "; ".join(cells))
    return lines


def table_lines(rows: list[dict]) -> list[str]:
    names = [str(g) for g in CANDIDATES]
    lines = ["| recipe | M | N | K | built group_m | built (ms) | "
             + " | ".join(f"{g} / built" for g in names) + " |",
             "| --- " * (6 + len(names)) + "|"]
    for r in rows:
        lines.append(f"| {r['recipe']} | {r['M']} | {r['N']} | {r['K']} | {r['built']} | "
                     f"{r['events_ms'][str(r['built'])]:.3f} | "
                     + " | ".join(relative(r, g) for g in names) + " |")
    return lines


def report(path: Path, results: Path = RESULTS) -> None:
    """Writes the '## GEMM raster groups' section of RESULTS.md."""
    put_report(path, "gemm_raster.py", "GEMM raster groups",
               "The built gemm and gemm_swiglu kernels with `sched.group_m` rebound "
               "(kernel.json only; the same cubin): each candidate's time over the built "
               "bind's, CUDA events / do_bench (L2 flushed), medians; bold: the fastest "
               "by events.",
               lambda rows: gain_lines(rows) + [""] + table_lines(rows), results)


if __name__ == "__main__":
    bench_main(run, report, rounds=7, recipes=RECIPES)
