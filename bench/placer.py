"""Placer benchmark: solve time and quality against the first-fit baseline.

    python bench/placer.py                 # print the table
    python bench/placer.py --write         # also replace the "## Placer" section of RESULTS.md

Rows: the six-component GEMM (pipelink.synth.gemm) on sm_90a and sm_100a, then seeded
synthetic kernels (pipelink.synth.synth) up to 64 components / 512 buffers. For each:
the placer's wall time (median of a few runs, one worker), the first-fit baseline's,
the objective reached by each (weighted tunable sum, then peak shared memory), the
baseline's peak at the placer's own tunables (the like-for-like layout comparison), and
an upper bound on the tunable sum from a longer parallel solve of the same model, so
the gap to the optimum is visible where the placer's budget cannot prove it.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ortools.sat.python import cp_model  # noqa: E402

from pipelink.place import build_model, place, prepare, verify  # noqa: E402
from pipelink.problem import Placement, Problem  # noqa: E402
from pipelink.synth import first_fit, first_fit_smem, gemm, synth  # noqa: E402

SIZES = [(4, 16), (8, 64), (16, 128), (32, 256), (64, 512)]
SEEDS = [1, 2, 3, 4]
REPEATS = 3
BOUND_SECONDS = 5.0
TARGETS = {"gemm_ms": 100.0, "large_s": 2.0}


@dataclass(frozen=True)
class Row:
    name: str
    components: int
    buffers: int
    place_ms: float            # wall
    place_cpu_ms: float        # this process's CPU time: less inflated by other load
    first_fit_ms: float
    status: str
    score: int
    ff_score: int | None
    bound: int
    smem: int
    ff_smem: int | None
    ff_smem_same: int          # first fit at the placer's tunables
    stable: bool               # two runs gave the same bytes


def _score(problem: Problem, p: Placement) -> int:
    return sum(t.weight * p.tunables[t.name] for t in problem.tunables)


def _bound(problem: Problem) -> int:
    """An upper bound on the weighted tunable sum: a longer two-worker solve."""
    model, v = build_model(prepare(problem))
    model.maximize(v.score)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = BOUND_SECONDS
    solver.parameters.num_workers = 2
    solver.solve(model)
    return int(solver.best_objective_bound)


def measure(name: str, problem: Problem, components: int) -> Row:
    times, cpu, outputs = [], [], []
    for _ in range(REPEATS):
        t0, c0 = time.perf_counter(), time.process_time()
        p = place(problem)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        outputs.append(p.to_json())
    assert verify(problem, p) == [], name
    t0 = time.perf_counter()
    ff = first_fit(problem)
    ff_ms = (time.perf_counter() - t0) * 1000
    same = first_fit_smem(problem, p.tunables)
    ff_same = max([0] + [o + s for o, s in same.values()])
    return Row(name, components, len(problem.buffers), statistics.median(times) * 1000,
               statistics.median(cpu) * 1000, ff_ms,
               str(p.solver["status"]), _score(problem, p), ff and _score(problem, ff),
               _bound(problem), p.smem_bytes, ff and ff.smem_bytes, ff_same,
               len(set(outputs)) == 1)


def rows() -> list[Row]:
    place(gemm())    # warm up imports and the solver library
    out = [measure("gemm sm_90a", gemm(), 6), measure("gemm sm_100a", gemm("sm_100a"), 6)]
    for components, buffers in SIZES:
        for seed in SEEDS:
            arch = "sm_100a" if seed == 3 else "sm_90a"
            out.append(measure(f"synth {components}/{buffers} s{seed} {arch}",
                               synth(components, buffers, seed=seed, arch=arch), components))
            print(out[-1], file=sys.stderr)
    return out


def _kib(n: int | None) -> str:
    return "-" if n is None else f"{n / 1024:.1f}"


def table(rs: list[Row]) -> str:
    head = ("| kernel | comp. | buffers | placer ms (CPU) | first-fit ms | status | tunables "
            "(placer / first-fit / bound) | peak KiB placer | first-fit | first-fit at "
            "placer's tunables | same bytes |")
    lines = [head, "| " + " | ".join(["---"] * 11) + " |"]
    for r in rs:
        lines.append(f"| {r.name} | {r.components} | {r.buffers} | {r.place_ms:.0f} "
                     f"({r.place_cpu_ms:.0f}) | {r.first_fit_ms:.0f} | {r.status} | {r.score} / "
                     f"{'-' if r.ff_score is None else r.ff_score} / {r.bound} | "
                     f"{_kib(r.smem)} | {_kib(r.ff_smem)} | {_kib(r.ff_smem_same)} | "
                     f"{'yes' if r.stable else 'NO'} |")
    return "\n".join(lines)


def summary(rs: list[Row]) -> str:
    gemm_rows = [r for r in rs if r.name.startswith("gemm")]
    large = [r for r in rs if r.buffers >= 512]
    worse = [r.name for r in rs if r.ff_score is not None
             and (r.score, -r.smem) < (r.ff_score, -r.ff_smem)]
    better = sum(r.ff_score is not None and (r.score, -r.smem) > (r.ff_score, -r.ff_smem)
                 for r in rs)
    worse_layout = [r.name for r in rs if r.smem > r.ff_smem_same]
    gaps = [(r.bound - r.score) / r.bound for r in rs if r.bound]
    return "\n".join([
        f"- GEMM (6 components): {max(r.place_ms for r in gemm_rows):.0f} ms, "
        f"{', '.join(sorted({r.status for r in gemm_rows}))} "
        f"(target < {TARGETS['gemm_ms']:.0f} ms, optimal)",
        f"- 64 components / 512 buffers: {max(r.place_ms for r in large) / 1000:.2f} s at worst "
        f"({max(r.place_cpu_ms for r in large) / 1000:.2f} s CPU; target < "
        f"{TARGETS['large_s']:.0f} s)",
        f"- proven optimal: {sum(r.status == 'OPTIMAL' for r in rs)} of {len(rs)} kernels; "
        f"tunable sum within {max(gaps) * 100:.1f}% of the bound at worst, "
        f"{statistics.mean(gaps) * 100:.1f}% on average",
        f"- better than first fit (objective): {better} of {len(rs)}; worse: "
        f"{', '.join(worse) or 'never'}; "
        f"peak above first fit at the same tunables: {', '.join(worse_layout) or 'never'}",
        f"- same bytes on repeated runs: {'all' if all(r.stable for r in rs) else 'NOT all'}",
    ])


def section(rs: list[Row]) -> str:
    return "\n".join([
        "## Placer",
        "",
        "Generated by `python bench/placer.py --write` on "
        f"{platform.machine()} with {_cpus()} CPUs, one solver worker, placer times the "
        f"median of {REPEATS} runs. Tunables: the weighted sum of tunable values the "
        "objective maximises first; bound: best bound of a "
        f"{BOUND_SECONDS:.0f} s two-worker solve of the same model. Peak: shared memory "
        "in KiB, which the objective minimises second.",
        "",
        summary(rs),
        "",
        table(rs),
        "",
    ])


def _cpus() -> int:
    import os
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def write(text: str, path: Path = ROOT / "bench" / "RESULTS.md") -> None:
    """Replaces the "## Placer" section (up to the next "## "), or appends it."""
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    lines = old.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == "## Placer"), None)
    if start is None:
        new = old.rstrip("\n") + "\n\n" + text
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
                   len(lines))
        new = "\n".join(lines[:start] + text.rstrip("\n").splitlines()
                        + ([""] + lines[end:] if end < len(lines) else [])) + "\n"
    path.write_text(new)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    a = ap.parse_args()
    text = section(rows())
    print(text)
    if a.write:
        write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
