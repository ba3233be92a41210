"""How many (sequence, head) pairs an attention scheduler's L2 section should hold,
measured: the built attention kernels rerun with their ``sched.section`` bind set to
each candidate (all pairs in one section, 64, 32, 16, 8, 4), forward and backward, side by
side in one run. Only kernel.json's bind changes (a copy of the folder per candidate;
the cubin is the same bytes), so the outputs must be too: O and LSE, dK and dV bit for
bit against the one-section run (dQ's fp32 adds land in another order: close).

    python -m tests.gpu.build attn_causal attn_dense attn_sliding attn_block_sparse \
        attn_causal_d64 attn_sliding_d64 attn_block_sparse_d64 \
        attn_causal_deterministic                                        # build machine
    python bench/attention_sections.py --json bench/attention_sections.json     # GPU
    python bench/attention_sections.py --report bench/attention_sections.json

Shapes as bench/attention.py's. Medians in ms: CUDA events, interleaved over the
candidates; and triton.testing.do_bench (L2 flushed).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from rebind import rebound_copy  # noqa: E402
from results_md import RESULTS, bench_main, put_report, write_rows  # noqa: E402

from bench.attention import mask_mod_of, mask_recipe, shapes_of  # noqa: E402
from bench.attention_backward import dq_turns  # noqa: E402
from bench.gemm_swiglu import flushed as flushed_medians  # noqa: E402
from bench.gemm_swiglu import geomean, interleaved  # noqa: E402

RECIPES = ("attn_causal", "attn_sliding", "attn_block_sparse", "attn_dense", "attn_causal_d64",
           "attn_sliding_d64", "attn_block_sparse_d64", "attn_causal_deterministic")
KERNELS = ("forward", "backward")
BIND = "sched.section"
# What a section counts, per kernel: (sequence, query head) pairs forward, (sequence,
# K/V head) pairs backward (their schedulers' `section` argument).
PAIRS = {"forward": "B * H", "backward": "B * HKV"}
CANDIDATES = (None, 64, 32, 16, 8, 4)     # None: every pair in one section
ALL, BUILT = "all", "built"            # variant names: one section; the built bind's value
DQ_TOLERANCE = 1e-2                    # dQ's max |diff| against the one-section run, relative


def bind_text(kernel: str, section: int | None) -> str:
    """The bind that puts at most `section` pairs in a section (None: all of them)."""
    pairs = PAIRS[kernel]
    return pairs if section is None else f"min({pairs}, {section})"


def with_sections(folder: Path, binds: dict[str, str], into: Path) -> Path:
    """A copy of a built multi-kernel folder whose kernels bind ``sched.section`` as
    `binds` says (kernel -> expression); every other byte is the built one's."""
    return rebound_copy(folder, into / folder.name, BIND,
                        {f"{kernel}/kernel.json": text for kernel, text in binds.items()})


def variants(pairs: int, built: int) -> dict[str, int | None]:
    """The candidates that differ at this many pairs (a cap of `pairs` or more is one
    section of all), by name, and the built bind's value where it is none of them."""
    out: dict[str, int | None] = {ALL: None}
    out.update({str(c): c for c in CANDIDATES if c is not None and c < pairs})
    if built < pairs and str(built) not in out:
        out[BUILT] = built
    return out


def built_name(pairs: int, built: int) -> str:
    """The variant the built bind runs as."""
    return ALL if built >= pairs else str(built) if built in CANDIDATES else BUILT


def inputs(recipe: str, b: int, h: int, s: int, d: int) -> dict:
    """Random Q, K, V, dO and the mask's extra inputs, as bench/attention.py's."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    import pipelink
    q, k, v, d_o = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
                    for _ in range(4))
    extra = saved = ()
    if mask_recipe(recipe) == "attn_block_sparse":
        mask = create_block_mask(mask_mod_of("attn_block_sparse"), None, None, s, s)
        extra = pipelink.block_mask_tensors(mask)
        saved = extra[4:]       # the backward reads the mask's transposed half
    return {"q": q, "k": k, "v": v, "d_o": d_o, "extra": extra, "saved": saved,
            "turns": dq_turns(recipe, b * s, b, ())}


def calls(ks, x: dict) -> dict:  # noqa: ANN001
    """One forward and one backward call of a loaded set, each into its own outputs."""
    import torch
    b, s, h, _ = x["q"].shape
    o, lse = (torch.full_like(x["q"], float("nan")),
              torch.full((b, h, s), float("nan"), device="cuda"))
    grads = tuple(torch.full_like(x[n], float("nan")) for n in "qkv") + (
        torch.empty(h, 2, b * s, device="cuda"),
        torch.empty_like(x["q"], dtype=torch.float32),
        torch.empty(h, x["turns"], device="cuda", dtype=torch.int32))

    def forward() -> tuple:
        return ks.forward(x["q"], x["k"], x["v"], *x["extra"], out=(o, lse))

    def backward() -> tuple:
        return ks.backward(x["d_o"], x["q"], x["k"], x["v"], o, lse, *x["saved"],
                           out=grads)[:3]
    return {"forward": forward, "backward": backward}


def same(kernel: str, got: tuple, want: tuple) -> str | None:
    """Why `got` is not the one-section run's `want` (None: it is): bit for bit, except
    dQ, whose adds run in another order."""
    import torch
    names = ("O", "LSE") if kernel == "forward" else ("dQ", "dK", "dV")
    for name, g, w in zip(names, got, want, strict=True):
        if name == "dQ":
            err = float((g.float() - w.float()).abs().max() / w.float().abs().max())
            if not err < DQ_TOLERANCE:
                return f"dQ differs by {err:.3g} (relative)"
        elif not torch.equal(g, w):
            return f"{name} is not bit for bit the same"
    return None


def sweep(folder: Path, recipe: str, shape: tuple[int, int, int, int], rounds: int,
          scratch: Path) -> list[dict]:
    """Both kernels of one recipe at one shape over the candidates."""
    import pipelink
    from pipelink.runtime.spec import evaluate
    b, h, s, d = shape
    x = inputs(recipe, b, h, s, d)
    # The built binds see the host sizes the runtime gives them (num_sms, l2_bytes).
    host = pipelink.load(folder).forward.host_sizes
    sizes = {"B": b, "H": h, "HKV": x["k"].shape[2], "S": s, "D": d, **host}
    rows = []
    for kernel in KERNELS:
        bind = json.loads((folder / kernel / "kernel.json").read_text())["launch"]["bind"][BIND]
        built, pairs = evaluate(bind, sizes, BIND), evaluate(PAIRS[kernel], sizes, BIND)
        fns, outs = {}, {}
        for name, section in variants(pairs, built).items():
            into = Path(tempfile.mkdtemp(dir=scratch))
            ks = pipelink.load(with_sections(folder, {kernel: bind_text(kernel, section)}, into))
            ks.check_contents = False
            call = calls(ks, x)
            if kernel == "backward":
                call["forward"]()            # the saved O and LSE the backward reads
            fns[name] = call[kernel]
            outs[name] = tuple(t.clone() for t in fns[name]())
            why = same(kernel, outs[name], outs[ALL])
            if why:
                raise SystemExit(f"{recipe} {kernel} section {name}: {why}")
        events = interleaved(fns, rounds, 1)
        flushed = flushed_medians(fns)
        rows.append({"recipe": recipe, "kernel": kernel, "B": b, "H": h, "S": s, "D": d,
                     "pairs": pairs, "bind": bind, "built": built,
                     "built_as": built_name(pairs, built), "events_ms": events,
                     "do_bench_ms": flushed})
        print(f"{recipe} {kernel} B{b} H{h} S{s} D{d} ({pairs} pairs, built {bind} = "
              f"{built}): " + ", ".join(f"{k} {v:.3f}" for k, v in events.items()),
              flush=True)
    return rows


def run(build: Path, rounds: int, out: Path | None,
        recipes: tuple[str, ...] = RECIPES) -> None:
    import torch
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for recipe in recipes:
            for shape in shapes_of(recipe):
                rows += sweep(build / "sm_90a" / recipe, recipe, shape, rounds, Path(scratch))
    data = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    if out:
        write_rows(out, data, RECIPES)


def table_lines(rows: list[dict]) -> list[str]:
    """One row per case: each candidate's time over the one-section run's, events /
    do_bench (below 1 is faster); bold: the variant the built bind runs as."""
    caps = [str(c) for c in CANDIDATES if c is not None]
    lines = ["| recipe | kernel | B | H | S | D | pairs | bind | one section (ms) | built / "
             "one | " + " | ".join(f"{c} / one" for c in caps) + " |",
             "| --- " * (10 + len(caps)) + "|"]
    for r in rows:
        cells = [relative(r, name) for name in (r["built_as"], *caps)]
        lines.append(f"| {r['recipe']} | {r['kernel']} | {r['B']} | {r['H']} | {r['S']} | "
                     f"{r['D']} | {r['pairs']} | `{r['bind']}` = {r['built']} | "
                     f"{r['events_ms'][ALL]:.3f} | " + " | ".join(cells) + " |")
    return lines


def relative(row: dict, name: str) -> str:
    """A variant's time over the one-section run's (events / do_bench), '-' where the
    case has no such variant."""
    e, d = row["events_ms"], row["do_bench_ms"] or {}
    if name not in e:
        return "-"
    text = f"{e[name] / e[ALL]:.3f}" + (f" / {d[name] / d[ALL]:.3f}" if name in d else "")
    return f"**{text}**" if name == row["built_as"] else text


def gain_lines(rows: list[dict]) -> list[str]:
    """Per kernel: the built bind's speed-up over one section, geomean over the cases
    (events / do_bench)."""
    lines = []
    for kernel in KERNELS:
        mine = [r for r in rows if r["kernel"] == kernel]
        if not mine:
            continue
        gains = [f"{geomean([r[t][ALL] / r[t][r['built_as']] for r in mine]):.3f}x"
                 for t in ("events_ms", "do_bench_ms") if all(r[t] for r in mine)]
        lines.append(f"- {kernel}: the built binds over one section, geomean of "
                     f"{len(mine)} cases: {' / '.join(gains)} (events / do_bench)")
    return lines


def report(path: Path, results: Path = RESULTS) -> None:
    """Writes the '## Attention scheduler sections' section of RESULTS.md."""
    put_report(path, "attention_sections.py", "Attention scheduler sections",
               "The built attention kernels with `sched.section` rebound (kernel.json "
               "only; the same cubin, the same output bits): the time with at most N "
               "(sequence, head) pairs per L2 section over the time with one section of "
               "all of them, CUDA events / do_bench (L2 flushed), medians; bold: the "
               "recipe's own bind at that size.",
               lambda rows: gain_lines(rows) + [""] + table_lines(rows), results)


if __name__ == "__main__":
    bench_main(run, report, rounds=7, recipes=RECIPES)
