"""GEMM and GEMM + SwiGLU on the GPU: linked vs monolithic vs the fastest thing a
PyTorch user can write.

    python -m tests.gpu.build gemm gemm_swiglu      # on the build machine
    python bench/gemm_swiglu.py [--quick] [--json out.json]   # on the GPU machine

Times every variant two ways: CUDA events around single launches, after warm-up, as the
median of many runs, rotating among several input sets so the weights are not
L2-resident, and interleaving the variants (order reversed every round) so clock drift
hits all alike; and triton.testing.do_bench, which flushes L2 before each launch. The
SwiGLU baselines are every way a user would write it: cuBLAS on the concatenated
gate/up weight then a torch.compile'd SwiGLU, torch.compile of the whole
silu(x @ Wg.T) * (x @ Wu.T), and eager; the strongest per shape is the one to beat.
The roofline floor uses the measured bf16 matmul peak and copy bandwidth.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from functools import partial
from pathlib import Path

try:
    import torch
except ImportError:  # the report step runs where PyTorch is not installed
    torch = None

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from results_md import Bar, BarGroup, BarLayout, bar_chart, put_section, write_text  # noqa: E402

SHAPES = [(4096, 2 * 11008), (4096, 2 * 14336), (8192, 2 * 28672),   # (K, N = 2 I)
          (3584, 2 * 18944)]
MS = [128, 256, 512, 1024, 2048, 4096, 8192, 16384]
SWIGLU_BASELINES = ("cublas_act", "compiled", "eager")
# Rivals of the cooperative kernels, timed where built: name -> (kernel, recipe).
VARIANTS = {"auto": ("gemm", "gemm_auto"), "swiglu_auto": ("gemm_swiglu", "gemm_swiglu_auto"),
            "streamk": ("gemm", "gemm_streamk"),
            "swiglu_streamk": ("gemm_swiglu", "gemm_swiglu_streamk"),
            "multicast": ("gemm", "gemm_multicast"), "pingpong": ("gemm", "gemm_pingpong"),
            "swiglu_pingpong": ("gemm_swiglu", "gemm_swiglu_pingpong")}
VARIANT_WHAT = {"auto": "one op: up to M = 512, 128 x 168 or 128 x 192 tiles "
                        "data-parallel where their waves come out nearly whole, else "
                        "stream-K kernels of 128 x 128 tiles up to M = 128 and 128 x 256 "
                        "up to M = 512; gemm's above",
                "swiglu_auto": "one op: 128 x 128 stream-K kernel up to M = 512, "
                               "gemm_swiglu's above",
                "streamk": "stream-K in place of the split-K tail",
                "swiglu_streamk": "stream-K in place of the split-K tail",
                "multicast": "clusters of 2, B multicast",
                "pingpong": "consumer warpgroups in ping-pong",
                "swiglu_pingpong": "consumer warpgroups in ping-pong"}
ROTATE = 3              # input sets cycled through, so W is re-read from HBM


def time_ms(fn, runs: int, reps: int = 1) -> list[float]:  # noqa: ANN001
    """Per-call ms of ``reps`` back-to-back calls between two events, ``runs`` times."""
    out = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / reps)
    return out


def phase_medians(call, op, launches: int) -> dict[str, float]:  # noqa: ANN001
    """Median ms of each phase (and ``total``) over ``launches`` calls of ``call``, after
    one warm-up, read from the phase clocks of ``op`` (a kernel linked with them), which
    ``call`` launches."""
    runs = []
    for _ in range(launches + 1):
        call()
        runs.append(op.phase_times())
    return {name: statistics.median(r[name] for r in runs[1:]) for name in runs[0]}


def interleaved(fns: dict[str, object], runs: int, reps: int, warmup: int = 3
                ) -> dict[str, float]:
    """Median per-call ms of each fn; rounds alternate the order (ABC, CBA, ...) so
    neither drift nor what ran just before favours one of them."""
    for fn in fns.values():
        time_ms(fn, warmup, reps)
    samples: dict[str, list[float]] = {k: [] for k in fns}
    order = list(fns)
    for r in range(runs):
        for name in (order if r % 2 == 0 else order[::-1]):
            samples[name] += time_ms(fns[name], 1, reps)
    return {k: statistics.median(v) for k, v in samples.items()}


def ceilings() -> tuple[float, float]:
    """Measured bf16 matmul TFLOP/s (random data) and copy bandwidth (GB/s)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = statistics.median(time_ms(lambda: torch.mm(a, b), 10))
    tflops = 2 * 8192 ** 3 / ms / 1e9
    src = torch.empty(2 ** 30, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    ms = statistics.median(time_ms(lambda: dst.copy_(src), 10))
    return tflops, 2 * src.numel() / ms / 1e6


def floor_ms(m: int, n: int, k: int, out_cols: int, peak: float, bw: float) -> float:
    flops = 2 * m * n * k
    bytes_ = 2 * (m * k + n * k + m * out_cols)
    return max(flops / peak / 1e9, bytes_ / bw / 1e6)


class Rotation:
    """ROTATE input sets (and output buffers), handed out in turn so W is re-read
    from HBM on every launch rather than served from L2."""

    def __init__(self, m: int, n: int, k: int) -> None:
        self.xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(ROTATE)]
        self.ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / math.sqrt(k)
                   for _ in range(ROTATE)]
        self.outs = {
            "gemm": [{"c": torch.empty(m, n, device="cuda", dtype=torch.bfloat16)}
                     for _ in range(ROTATE)],
            "gemm_swiglu": [{"y": torch.empty(m, n // 2, device="cuda", dtype=torch.bfloat16)}
                            for _ in range(ROTATE)]}
        self.i = 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.i = (self.i + 1) % ROTATE
        return self.xs[self.i], self.ws[self.i]

    def call(self, op, recipe: str) -> object:  # noqa: ANN001
        x, w = self.next()
        return op(x, w, out=self.outs[recipe][self.i])


def bench_shape(ops: dict, baselines: dict, m: int, n: int, k: int, runs: int,  # noqa: ANN001
                reps: int) -> dict[str, dict]:
    inputs = Rotation(m, n, k)

    def cublas() -> torch.Tensor:
        x, w = inputs.next()
        return torch.mm(x, w.t())

    def swiglu_by(name: str):  # noqa: ANN202
        def call() -> torch.Tensor:
            x, w = inputs.next()
            return baselines[name](x, w)
        return call

    gemm_fns = {"linked": lambda: inputs.call(ops[("gemm", "linked")], "gemm"),
                "mono": lambda: inputs.call(ops[("gemm", "mono")], "gemm"),
                "cublas": cublas}
    swiglu_fns = {"linked": lambda: inputs.call(ops[("gemm_swiglu", "linked")], "gemm_swiglu"),
                  "mono": lambda: inputs.call(ops[("gemm_swiglu", "mono")], "gemm_swiglu"),
                  **{name: swiglu_by(name) for name in SWIGLU_BASELINES}}
    # Variants of the same computation, where built: the cooperative kernels' rivals.
    for variant, (kernel, recipe) in VARIANTS.items():
        if (recipe, "linked") in ops:
            fns = gemm_fns if kernel == "gemm" else swiglu_fns
            fns[variant] = partial(inputs.call, ops[(recipe, "linked")],
                                   "gemm" if kernel == "gemm" else "gemm_swiglu")
    return {"gemm": interleaved(gemm_fns, runs, reps),
            "swiglu": interleaved(swiglu_fns, runs, reps),
            "do_bench": {"gemm": flushed(gemm_fns), "swiglu": flushed(swiglu_fns)}}


def flushed(fns: dict, rep: int = 100, rounds: int = 1) -> dict[str, float] | None:
    """triton.testing.do_bench medians (L2 flushed before each launch) over about
    ``rep`` ms of launches each, or None where triton is missing. With rounds > 1 the
    variants take turns, in reverse order every other round, and each gets the median
    of its rounds' medians: no variant always runs first, on a cooler GPU."""
    try:
        from triton.testing import do_bench
    except ImportError:
        return None
    runs: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns.items())
    for r in range(rounds):
        for name, fn in order if r % 2 == 0 else order[::-1]:
            runs[name].append(do_bench(fn, warmup=25, rep=rep, return_mode="median"))
    return {name: statistics.median(times) for name, times in runs.items()}


def swiglu_baselines() -> dict:
    """SwiGLU as a PyTorch user writes it, each from x and the gate/up weight W (rows
    [0, I) gate, [I, 2I) up): one cuBLAS GEMM on W then a compiled SwiGLU, or two
    GEMMs (W_gate and W_up as separate tensors) compiled whole or eager."""
    silu = torch.nn.functional.silu
    act = torch.compile(lambda g, u: silu(g) * u, dynamic=True)

    def two_gemms(x, wg, wu):  # noqa: ANN001, ANN202
        return silu(x @ wg.t()) * (x @ wu.t())

    compiled = torch.compile(two_gemms, dynamic=True)

    def cublas_act(x, w):  # noqa: ANN001, ANN202
        half = w.shape[0] // 2
        h = torch.mm(x, w.t())
        return act(h[:, :half], h[:, half:])

    def split(fn):  # noqa: ANN001, ANN202
        return lambda x, w: fn(x, w[: w.shape[0] // 2], w[w.shape[0] // 2:])

    return {"cublas_act": cublas_act, "compiled": split(compiled), "eager": split(two_gemms)}


def run(build: Path, quick: bool, rounds: int,
        out: Path | None = None) -> list[dict[str, object]]:
    """Every shape's times; with ``out``, the rows so far are rewritten there after each
    shape (a run cut short keeps what it measured)."""
    import pipelink
    peak, bw = ceilings()
    print(f"ceilings: {peak:.0f} TFLOP/s bf16, {bw:.0f} GB/s copy")
    ops = {(r, mode): pipelink.load(build / folder / r)
           for r in ("gemm", "gemm_swiglu") for mode, folder in (("linked", "sm_90a"),
                                                                  ("mono", "mono"))}
    for _, recipe in VARIANTS.values():
        if (build / "sm_90a" / recipe).is_dir():
            ops[(recipe, "linked")] = pipelink.load(build / "sm_90a" / recipe)
    baselines = swiglu_baselines()
    rows = []
    for k, n in (SHAPES[:1] if quick else SHAPES):
        for m in (MS[::2] if quick else MS):
            flops = 2 * m * n * k
            reps = max(1, min(20, int(2e12 // flops)))   # ~>= 3 ms of work per sample
            times = bench_shape(ops, baselines, m, n, k, runs=rounds, reps=reps)
            gemm, fused = times["gemm"], times["swiglu"]
            row = {"M": m, "N": n, "K": k, **times,
                   "floor_gemm": floor_ms(m, n, k, n, peak, bw),
                   "floor_swiglu": floor_ms(m, n, k, n // 2, peak, bw)}
            rows.append(row)
            if out is not None:
                out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(),
                                           "torch": torch.__version__, "rows": rows}, indent=1))
            tf = 2 * m * n * k / gemm["linked"] / 1e9
            print(f"M={m:6d} N={n:6d} K={k:5d} | gemm linked {gemm['linked']:.3f} mono "
                  f"{gemm['mono']:.3f} cublas {gemm['cublas']:.3f} ms ({tf:.0f} TF/s, "
                  f"{gemm['cublas'] / gemm['linked']:.2f}x) | swiglu linked "
                  f"{fused['linked']:.3f} strongest baseline {strongest(fused):.3f} "
                  f"({strongest(fused) / fused['linked']:.2f}x) floor "
                  f"{row['floor_swiglu']:.3f}", flush=True)
    return rows


def strongest(times: dict[str, float]) -> float:
    """The fastest SwiGLU baseline of one shape (what a user would pick)."""
    return min(times[name] for name in SWIGLU_BASELINES if name in times)


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _verdict(ok: bool) -> str:
    return "met" if ok else "**not met**"


def target_lines(rows: list[dict], recipe: str, group: str, column: str) -> list[str]:
    """#10's targets for one recipe's column (``linked`` or a variant) of a group, events
    and do_bench: "gemm" against cuBLAS (geomean over M >= 2048, slowest shape),
    "swiglu" against the strongest baseline (geomean over all shapes, slowest shape)."""
    timed = [r for r in rows if column in r[group]]
    if not timed:
        return []

    def ratio(times: dict) -> float:
        base = times["cublas"] if group == "gemm" else strongest(times)
        return base / times[column]

    events = [(r["M"], ratio(r[group])) for r in timed]
    flushed = [(r["M"], ratio(r["do_bench"][group])) for r in timed
               if column in ((r.get("do_bench") or {}).get(group) or {})]
    slowest = min(x for _, x in events)
    slow_flushed = f", {min(x for _, x in flushed):.3f}x do_bench" if flushed else ""
    if group == "gemm":
        mean = geomean([x for m, x in events if m >= 2048])
        mean_flushed = [x for m, x in flushed if m >= 2048]
        return [f"- {recipe} vs cuBLAS, geometric mean over M >= 2048: **{mean:.3f}x** events"
                + (f", {geomean(mean_flushed):.3f}x do_bench" if mean_flushed else "")
                + f" (target >= 1.03x: {_verdict(mean >= 1.03)}); slowest shape "
                f"{slowest:.3f}x events{slow_flushed} (target >= 0.95x: "
                f"{_verdict(slowest >= 0.95)})"]
    mean = geomean([x for _, x in events])
    return [f"- {recipe} vs the strongest baseline, geometric mean over all shapes: "
            f"**{mean:.3f}x** events"
            + (f", {geomean([x for _, x in flushed]):.3f}x do_bench" if flushed else "")
            + f" (target >= 1.15x: {_verdict(mean >= 1.15)}); slowest shape {slowest:.3f}x "
            f"events{slow_flushed} (target >= 1.0x: {_verdict(slowest >= 1.0)})"]


def variant_table(rows: list[dict]) -> list[str]:
    """Shape by shape, each variant's speed-up over its single-kernel twin (gemm or
    gemm_swiglu, linked), events / do_bench; empty when no variant was timed."""
    present = [(v, k, r) for v, (k, r) in VARIANTS.items()
               if any(v in row["gemm" if k == "gemm" else "swiglu"] for row in rows)]
    if not present:
        return []
    out = ["", "Each variant against its single-kernel twin (gemm or gemm_swiglu), shape by "
               "shape: twin time / variant time, events / do_bench (above 1: the variant is "
               "faster).", "",
           "| M | N | K | " + " | ".join(r for _, _, r in present) + " |",
           "| --- " * (3 + len(present)) + "|"]
    for row in rows:
        cells = []
        for variant, kernel, _ in present:
            group = "gemm" if kernel == "gemm" else "swiglu"
            ev = row[group]
            db = (row.get("do_bench") or {}).get(group) or {}
            text = f"{ev['linked'] / ev[variant]:.2f}" if variant in ev else "-"
            if variant in db:
                text += f" / {db['linked'] / db[variant]:.2f}"
            cells.append(text)
        out.append(f"| {row['M']} | {row['N']} | {row['K']} | " + " | ".join(cells) + " |")
    return out


def variant_lines(rows: list[dict]) -> list[str]:
    """Each variant (VARIANTS) against its cooperative twin, events, where measured."""
    out = []
    for variant, (kernel, recipe) in VARIANTS.items():
        group = "gemm" if kernel == "gemm" else "swiglu"
        pairs = [(r["M"], r[group]["linked"] / r[group][variant]) for r in rows
                 if variant in r[group]]
        if not pairs:
            continue
        big = [x for m, x in pairs if m >= 2048]
        out.append(f"- {recipe} ({VARIANT_WHAT[variant]}) vs {kernel}, events: geometric mean "
                   f"{geomean([x for _, x in pairs]):.3f}x over all shapes"
                   + (f", {geomean(big):.3f}x over M >= 2048" if big else "")
                   + f"; range {min(x for _, x in pairs):.3f}x to "
                     f"{max(x for _, x in pairs):.3f}x")
    missing = [recipe for variant, (kernel, recipe) in VARIANTS.items()
               if not any(variant in r["gemm" if kernel == "gemm" else "swiglu"]
                          for r in rows)]
    if missing:
        out.append(f"- not timed in this run (not built for it): {', '.join(missing)}")
    return out


def report(path: Path) -> None:
    """Writes the '## GEMM and GEMM + SwiGLU' section of RESULTS.md and a plot from a
    results JSON, so no number is typed by hand."""
    data = json.loads(path.read_text())
    rows = data["rows"]
    lm = [abs(r[k]["linked"] / r[k]["mono"] - 1) for r in rows for k in ("gemm", "swiglu")]
    lines = [f"## GEMM and GEMM + SwiGLU ({data['gpu']})", "",
             f"Generated by `python bench/gemm_swiglu.py --report bench/{path.name}`; "
             f"torch {data.get('torch', 'not recorded')}; "
             "times are medians of per-launch ms: CUDA events around batches of launches "
             f"({ROTATE} rotating input sets, order alternating each round) and, beside them, "
             "triton.testing.do_bench (L2 flushed). The SwiGLU baseline per shape is the "
             "fastest of cuBLAS on the concatenated weight + compiled SwiGLU, torch.compile "
             "of the whole function, and eager.", "",
             *target_lines(rows, "gemm", "gemm", "linked"),
             *target_lines(rows, "gemm_auto", "gemm", "auto"),
             *target_lines(rows, "gemm_swiglu", "swiglu", "linked"),
             *target_lines(rows, "gemm_swiglu_auto", "swiglu", "swiglu_auto"),
             *variant_lines(rows),
             f"- |linked/mono - 1|: median {statistics.median(lm) * 100:.2f}%, max "
             f"{max(lm) * 100:.2f}% (the SASS of the two is identical; see the linked vs "
             "monolithic section for the noise floor)", "",
             "![speed-up per shape](gemm_swiglu.svg)", "",
             "| M | N | K | gemm linked | mono | cuBLAS | x | do_bench x | gemm_auto x | "
             "do_bench x | swiglu linked | mono | cuBLAS+act | compiled | eager | x strongest "
             "| do_bench x | swiglu_auto x | do_bench x | floor |",
             "| --- " * 20 + "|"]

    def ratio(times: dict | None, column: str, group: str) -> str:
        if not times or column not in times:
            return "-"
        base = times["cublas"] if group == "gemm" else strongest(times)
        return f"{base / times[column]:.2f}"

    for r in rows:
        g, f, d = r["gemm"], r["swiglu"], r.get("do_bench") or {}
        dg, ds = d.get("gemm"), d.get("swiglu")
        lines.append(f"| {r['M']} | {r['N']} | {r['K']} | {g['linked']:.3f} | {g['mono']:.3f} | "
                     f"{g['cublas']:.3f} | {ratio(g, 'linked', 'gemm')} | "
                     f"{ratio(dg, 'linked', 'gemm')} | {ratio(g, 'auto', 'gemm')} | "
                     f"{ratio(dg, 'auto', 'gemm')} | "
                     f"{f['linked']:.3f} | {f['mono']:.3f} | {f['cublas_act']:.3f} | "
                     f"{f['compiled']:.3f} | {f['eager']:.3f} | "
                     f"{ratio(f, 'linked', 'swiglu')} | {ratio(ds, 'linked', 'swiglu')} | "
                     f"{ratio(f, 'swiglu_auto', 'swiglu')} | "
                     f"{ratio(ds, 'swiglu_auto', 'swiglu')} | {r['floor_swiglu']:.3f} |")
    lines += variant_table(rows)
    put_section("## GEMM and GEMM + SwiGLU", "\n".join(lines))
    write_text(ROOT / "bench" / "gemm_swiglu.svg", speedup_svg(rows))


def speedup_svg(rows: list[dict]) -> str:
    """Speed-up over the library per shape: gemm (blue) and gemm_swiglu (orange)."""
    groups = []
    for r in rows:
        shape = f'M={r["M"]} N={r["N"]} K={r["K"]}'
        speedups = ((r["gemm"]["cublas"] / r["gemm"]["linked"], "#4878d0"),
                    (strongest(r["swiglu"]) / r["swiglu"]["linked"], "#ee854a"))
        groups.append(BarGroup([Bar(v, color, f"{shape}: {v:.3f}") for v, color in speedups],
                               (str(r["M"]), f'{r["N"] // 1024}k')))
    top = max(1.5, max(strongest(r["swiglu"]) / r["swiglu"]["linked"] for r in rows) * 1.05)
    layout = BarLayout(width=60 + 36 * len(rows), height=280, group=36, step=14, bar=12)
    return bar_chart(groups, layout, top=top, reference=1.0,
                     title="speed-up: gemm / cuBLAS (blue), gemm_swiglu / strongest PyTorch "
                           "baseline (orange); line: 1.0")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=str(ROOT / "build" / "gpu"))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json")
    p.add_argument("--report", help="results JSON -> RESULTS.md section and SVG")
    p.add_argument("--rounds", type=int, default=15, help="timed rounds per variant")
    a = p.parse_args()
    if a.report:
        report(Path(a.report))
        return
    run(Path(a.build), a.quick, a.rounds, Path(a.json) if a.json else None)


if __name__ == "__main__":
    main()
