"""GEMM and GEMM + SwiGLU on the GPU: linked vs monolithic vs cuBLAS (+ compiled SwiGLU).

    python -m tests.gpu.build gemm gemm_swiglu      # on the build machine
    python bench/gemm_swiglu.py [--quick] [--json out.json]   # on the GPU machine

Times every variant with CUDA events around single launches, after warm-up, as the
median of many runs, rotating among several input sets so the weights are not
L2-resident, and interleaving linked and monolithic runs (ABAB) so clock drift hits
both alike. The roofline floor uses the measured bf16 matmul peak and copy bandwidth.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pipelink  # noqa: E402

SHAPES = [(4096, 2 * 11008), (4096, 2 * 14336), (8192, 2 * 28672)]   # (K, N = 2 I)
MS = [128, 512, 2048, 8192, 16384]
INTERLEAVE = 8          # gate/up rows alternate in blocks of 8 (components/swiglu_epilogue)
ROTATE = 3              # input sets cycled through, so W is re-read from HBM


def interleave(w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
    """W[16q + r] = W_gate[8q + r], W[16q + 8 + r] = W_up[8q + r]."""
    i, k = w_gate.shape
    return torch.stack([w_gate.view(i // INTERLEAVE, INTERLEAVE, k),
                        w_up.view(i // INTERLEAVE, INTERLEAVE, k)], dim=1).reshape(2 * i, k)


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


def bench_shape(ops: dict, act, m: int, n: int, k: int, runs: int, reps: int  # noqa: ANN001
                ) -> dict[str, dict]:
    inputs = Rotation(m, n, k)

    def cublas() -> torch.Tensor:
        x, w = inputs.next()
        return torch.mm(x, w.t())

    def cublas_swiglu() -> torch.Tensor:
        h = cublas()
        return act(h[:, : n // 2], h[:, n // 2:])

    gemm = interleaved({"linked": lambda: inputs.call(ops[("gemm", "linked")], "gemm"),
                        "mono": lambda: inputs.call(ops[("gemm", "mono")], "gemm"),
                        "cublas": cublas}, runs, reps)
    fused = interleaved({"linked": lambda: inputs.call(ops[("gemm_swiglu", "linked")],
                                                       "gemm_swiglu"),
                         "mono": lambda: inputs.call(ops[("gemm_swiglu", "mono")],
                                                     "gemm_swiglu"),
                         "cublas_act": cublas_swiglu}, runs, reps)
    return {"gemm": gemm, "swiglu": fused}


def run(build: Path, quick: bool) -> list[dict[str, object]]:
    peak, bw = ceilings()
    print(f"ceilings: {peak:.0f} TFLOP/s bf16, {bw:.0f} GB/s copy")
    ops = {(r, mode): pipelink.load(build / folder / r)
           for r in ("gemm", "gemm_swiglu") for mode, folder in (("linked", "sm_90a"),
                                                                  ("mono", "mono"))}
    act = torch.compile(lambda g, u: torch.nn.functional.silu(g) * u)
    rows = []
    for k, n in (SHAPES[:1] if quick else SHAPES):
        for m in (MS[::2] if quick else MS):
            flops = 2 * m * n * k
            reps = max(1, min(20, int(2e12 // flops)))   # ~>= 3 ms of work per sample
            times = bench_shape(ops, act, m, n, k, runs=15, reps=reps)
            gemm, fused = times["gemm"], times["swiglu"]
            row = {"M": m, "N": n, "K": k, **times,
                   "floor_gemm": floor_ms(m, n, k, n, peak, bw),
                   "floor_swiglu": floor_ms(m, n, k, n // 2, peak, bw)}
            rows.append(row)
            tf = 2 * m * n * k / gemm["linked"] / 1e9
            print(f"M={m:6d} N={n:6d} K={k:5d} | gemm linked {gemm['linked']:.3f} mono "
                  f"{gemm['mono']:.3f} cublas {gemm['cublas']:.3f} ms ({tf:.0f} TF/s, "
                  f"{gemm['cublas'] / gemm['linked']:.2f}x) | swiglu linked "
                  f"{fused['linked']:.3f} cublas+act {fused['cublas_act']:.3f} "
                  f"({fused['cublas_act'] / fused['linked']:.2f}x) floor "
                  f"{row['floor_swiglu']:.3f}", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=str(ROOT / "build" / "gpu"))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json")
    a = p.parse_args()
    rows = run(Path(a.build), a.quick)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
