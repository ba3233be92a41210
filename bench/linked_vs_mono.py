"""Linked versus monolithic: the same sources and placement, linked or one unit.

Three steps, so nobody hand-edits a number:

    python bench/linked_vs_mono.py build            # CPU: build every variant, static diffs
    python bench/linked_vs_mono.py run              # GPU: time them -> build/lvm/results.json
    python bench/linked_vs_mono.py report FILE      # CPU: RESULTS.md section + SVG plot

A *variant* is a recipe with its tile shape and pipeline depth pinned; a
*configuration* is a variant on one problem shape. Each configuration times the
linked kernel (A), the monolithic kernel (B) and a second load of the linked cubin
(A'), interleaved A B A' / A' B A, CUDA events around batches of launches on
rotating inputs, many rounds. The ratio is the median over rounds of A/B within
a round (drift between rounds cancels); |median A'/A - 1| is the noise floor.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from results_md import put_section, write_text  # noqa: E402

OUT = ROOT / "build" / "lvm"
RECIPES = ["gemm", "gemm_swiglu", "gemm_bias_gelu", "gemm_cute", "gemm_swiglu_cute"]
TILE_N = [128, 256]
STAGES = [2, 3, 4]
PROBLEMS = [(2048, 8192, 4096), (4096, 4096, 2048), (1024, 16384, 8192)]     # (M, N, K)
TILE_M, TILE_K = 128, 64
ROTATE = 3
ROUNDS = 41
TARGET_SAMPLE_MS = 5.0          # per timed batch: long enough that event jitter is < 0.1%
WARM_SECONDS = 2.0              # busy the GPU first so clocks settle before the first config


# -- build (CPU) ---------------------------------------------------------------------------


def variant_recipe(name: str, tile_n: int, stages: int) -> dict:
    """The recipe's data with the tile width and both ends of the ring pinned."""
    import yaml
    data = yaml.safe_load((ROOT / "recipes" / f"{name}.yaml").read_text())
    data["recipe"] = f"{name}_n{tile_n}_s{stages}"
    data["arch"] = ["sm_90a"]
    for inst, spec in data["instances"].items():
        if isinstance(spec, str):
            spec = data["instances"][inst] = {"component": spec}
        params = spec.setdefault("params", {})
        if "tile_n" in params:
            params["tile_n"] = tile_n
        if spec.get("component") == "swiglu_epilogue" and tile_n == min(TILE_N):
            # A 128-wide gate/up tile leaves one 64-column output chunk: one staging buffer.
            params["buffers"] = 1
        if spec.get("component") in ("tma_loader", "wgmma_mainloop", "cute_mainloop"):
            spec.setdefault("tunables", {})["stages"] = stages
    bind = data["launch"]["bind"]
    for key in [k for k in bind if k.endswith("n_tiles")]:
        bind[key] = f"ceil_div(N, {tile_n})"
    return data


def static_facts(cubin: Path) -> dict:
    """Registers, spills (local memory), shared memory and SASS of one cubin."""
    import subprocess

    from tests.integration.sass import cuobjdump, sass
    usage = subprocess.run([cuobjdump(), "-res-usage", str(cubin)], capture_output=True,
                           text=True, check=True).stdout
    regs = int(re.search(r"REG:(\d+)", usage).group(1))
    local = int(re.search(r"LOCAL:(\d+)", usage).group(1))
    lines = [re.sub(r"/\*[0-9a-f]{4,}\*/", "", line).strip() for line in sass(cubin).splitlines()
             if re.match(r"\s*/\*[0-9a-f]{4,}\*/", line)]
    # Addresses are stripped; opcodes, operands, immediates and encodings are kept, so
    # equal lists mean the same machine code instruction for instruction.
    return {"registers": regs, "local_bytes": local, "instructions": len(lines), "sass": lines}


def build() -> None:
    import yaml

    from pipelink.build import build_objects, default_index
    from pipelink.errors import PipeLinkError
    from pipelink.link import LinkOptions, link_kernel
    from pipelink.recipe import load_recipe
    index = default_index(ROOT)
    variants = {}
    for name, tile_n, stages in itertools.product(RECIPES, TILE_N, STAGES):
        if not (ROOT / "recipes" / f"{name}.yaml").is_file():
            print(f"skip {name}: no recipe")
            continue
        data = variant_recipe(name, tile_n, stages)
        path = OUT / "recipes" / f"{data['recipe']}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        try:
            recipe = load_recipe(path)
            objects = build_objects(recipe, "sm_90a", index, OUT / "obj")
            facts = {}
            for mode in ("linked", "mono"):
                result = link_kernel(recipe, objects, OUT / mode / recipe.name,
                                     LinkOptions("sm_90a", mode=mode), index=index)
                facts[mode] = static_facts(result.cubin)
                facts[mode]["smem"] = result.placement.smem_bytes
        except PipeLinkError as exc:
            print(f"skip {data['recipe']}: {exc.message}")
            continue
        linked, mono = facts["linked"], facts["mono"]
        variants[recipe.name] = {
            "recipe": name, "tile_n": tile_n, "stages": stages,
            "static": {m: {k: v for k, v in f.items() if k != "sass"} for m, f in facts.items()},
            "sass_identical": linked["sass"] == mono["sass"],
        }
        print(f"{recipe.name}: {linked['instructions']} / {mono['instructions']} SASS, "
              f"{linked['registers']} / {mono['registers']} regs, identical "
              f"{variants[recipe.name]['sass_identical']}", flush=True)
    (OUT / "static.json").write_text(json.dumps(variants, indent=1, sort_keys=True))


# -- run (GPU) ------------------------------------------------------------------------------


def _inputs(spec: dict, sizes: dict, torch) -> list:  # noqa: ANN001
    from pipelink import expr
    dtypes = {"bf16": torch.bfloat16, "f32": torch.float32}
    out = []
    for item in spec:
        shape = [expr.evaluate(d, sizes) for d in item["shape"]]
        scale = 1.0 / (shape[-1] ** 0.5)
        out.append((torch.randn(shape, device="cuda") * scale).to(dtypes[item["dtype"]]))
    return out


def time_config(folder_linked: Path, folder_mono: Path, problem: tuple[int, int, int]) -> dict:
    import torch

    import pipelink
    from pipelink import expr
    ops = {"A": pipelink.load(folder_linked), "B": pipelink.load(folder_mono),
           "A2": pipelink.load(folder_linked)}
    m, n, k = problem
    spec = ops["A"].spec
    sizes = {"M": m, "N": n, "K": k}
    sets = [_inputs(spec["inputs"], sizes, torch) for _ in range(ROTATE)]
    outs = [{o["name"]: torch.empty([expr.evaluate(d, sizes) for d in o["shape"]],
                                    device="cuda", dtype=torch.bfloat16)
             for o in spec["outputs"]} for _ in range(ROTATE)]
    state = {"i": 0}

    def call(op) -> None:  # noqa: ANN001
        state["i"] = (state["i"] + 1) % ROTATE
        op(*sets[state["i"]], out=outs[state["i"]])

    def sample(op, reps: int) -> float:  # noqa: ANN001
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            call(op)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / reps

    for op in ops.values():
        sample(op, 3)
    reps = max(1, int(TARGET_SAMPLE_MS / max(sample(ops["A"], 3), 1e-3)))
    times: dict[str, list[float]] = {name: [] for name in ops}
    for r in range(ROUNDS):
        for name in (["A", "B", "A2"] if r % 2 == 0 else ["A2", "B", "A"]):
            times[name].append(sample(ops[name], reps))
    med = {name: statistics.median(v) for name, v in times.items()}
    # Ratios of the samples of one round, then their median: drift between rounds
    # (clocks, temperature) cancels; what is left is the noise A' measures.
    paired = statistics.median(a / b for a, b in zip(times["A"], times["B"], strict=True))
    again = statistics.median(a2 / a for a, a2 in zip(times["A"], times["A2"], strict=True))
    return {"linked_ms": med["A"], "mono_ms": med["B"], "linked_again_ms": med["A2"],
            "ratio": paired, "noise": abs(again - 1), "reps": reps}


def warm_up(torch) -> None:  # noqa: ANN001
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    while True:
        torch.mm(a, a)
        end.record()
        end.synchronize()
        if start.elapsed_time(end) > WARM_SECONDS * 1000:
            return


def run() -> None:
    import torch
    variants = json.loads((OUT / "static.json").read_text())
    warm_up(torch)
    results = []
    for name, v in sorted(variants.items()):
        for problem in PROBLEMS:
            timing = time_config(OUT / "linked" / name, OUT / "mono" / name, problem)
            results.append({"variant": name, **{k: v[k] for k in ("recipe", "tile_n", "stages",
                                                                "sass_identical")},
                            "static": v["static"], "problem": list(problem), **timing})
            print(f"{name:32s} {problem} linked {timing['linked_ms']:.4f} mono "
                  f"{timing['mono_ms']:.4f} ratio {timing['ratio']:.4f} noise "
                  f"{timing['noise']:.4f}", flush=True)
    payload = {"gpu": torch.cuda.get_device_name(), "configs": results}
    (OUT / "results.json").write_text(json.dumps(payload, indent=1))


# -- report (CPU) ---------------------------------------------------------------------------


def svg_plot(configs: list[dict]) -> str:
    """|ratio - 1| per configuration (bars) with the noise floor (ticks), in percent."""
    width, height, pad = 40 + 14 * len(configs), 260, 40
    top = max(0.6, max(max(abs(c["ratio"] - 1), c["noise"]) * 100 for c in configs) * 1.1)
    y = lambda pct: height - pad - (height - 2 * pad) * pct / top  # noqa: E731
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             'font-family="sans-serif" font-size="10">',
             f'<text x="{pad}" y="16">|linked/mono - 1| per configuration (%), noise floor '
             'as black ticks; dashed: 0.2%</text>',
             f'<line x1="{pad}" y1="{y(0)}" x2="{width}" y2="{y(0)}" stroke="black"/>',
             f'<line x1="{pad}" y1="{y(0.2):.1f}" x2="{width}" y2="{y(0.2):.1f}" stroke="red" '
             'stroke-dasharray="4"/>']
    for i, c in enumerate(configs):
        x = pad + 14 * i
        dev = abs(c["ratio"] - 1) * 100
        parts.append(f'<rect x="{x}" y="{y(dev):.1f}" width="10" height="{y(0) - y(dev):.1f}" '
                     f'fill="#4878d0"><title>{c["variant"]} {c["problem"]}: '
                     f'{c["ratio"]:.4f}</title></rect>')
        parts.append(f'<line x1="{x}" x2="{x + 10}" y1="{y(c["noise"] * 100):.1f}" '
                     f'y2="{y(c["noise"] * 100):.1f}" stroke="black" stroke-width="2"/>')
    for pct in (0, top / 2, top):
        parts.append(f'<text x="2" y="{y(pct) + 3:.1f}">{pct:.2f}</text>')
    return "\n".join(parts + ["</svg>"]) + "\n"


def report(path: Path) -> None:
    payload = json.loads(path.read_text())
    configs = payload["configs"]
    devs = [abs(c["ratio"] - 1) for c in configs]
    within = sum(abs(c["ratio"] - 1) <= max(0.005, c["noise"]) for c in configs)
    spills = sum(c["static"]["linked"]["local_bytes"] > c["static"]["mono"]["local_bytes"]
                 for c in configs)
    rows = ["## Linked vs monolithic", "",
            f"Generated by `python bench/linked_vs_mono.py report {path.name}` from "
            f"`bench/{path.name}` ({len(configs)} configurations on {payload['gpu']}); "
            "do not edit by hand.", "",
            f"- median |linked/mono - 1|: {statistics.median(devs) * 100:.3f}%; "
            f"max: {max(devs) * 100:.3f}%; median noise (same cubin timed twice): "
            f"{statistics.median(c['noise'] for c in configs) * 100:.3f}%",
            "- SASS identical instruction for instruction (immediates and encodings included) "
            f"in {sum(c['sass_identical'] for c in configs)}"
            f" of {len(configs)}; linked spills where mono does not: {spills}",
            f"- within max(0.5%, noise): {within} of {len(configs)}; within 0.2%: "
            f"{sum(d <= 0.002 for d in devs)}",
            "", "![ratio per configuration](linked_vs_mono.svg)", "",
            "| variant | M, N, K | linked ms | mono ms | ratio | noise | regs L/M | smem | "
            "SASS L/M | identical |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in configs:
        s = c["static"]
        rows.append(f"| {c['variant']} | {', '.join(map(str, c['problem']))} | "
                    f"{c['linked_ms']:.4f} | {c['mono_ms']:.4f} | {c['ratio']:.4f} | "
                    f"{c['noise'] * 100:.2f}% | {s['linked']['registers']}/"
                    f"{s['mono']['registers']} | {s['linked']['smem']} | "
                    f"{s['linked']['instructions']}/{s['mono']['instructions']} | "
                    f"{'yes' if c['sass_identical'] else 'no'} |")
    put_section("## Linked vs monolithic", "\n".join(rows))
    write_text(ROOT / "bench" / "linked_vs_mono.svg", svg_plot(configs))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("step", choices=["build", "run", "report"])
    p.add_argument("results", nargs="?", default=str(ROOT / "bench" / "linked_vs_mono.json"))
    a = p.parse_args()
    if a.step == "build":
        build()
    elif a.step == "run":
        run()
    else:
        report(Path(a.results))


if __name__ == "__main__":
    main()
