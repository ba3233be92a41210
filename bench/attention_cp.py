"""Context-parallel causal attention over 2 and 4 GPUs: pipelink.ring_attention with
recipes/attn_cp_ring's kernels, against Transformer Engine's context-parallel
DotProductAttention (p2p ring, the same zigzag shards) where it imports, and against
attn_causal on the whole sequence on one GPU.

    python -m tests.gpu.build attn_cp_ring attn_causal                # build (any machine)
    python bench/attention_cp.py --json bench/attention_cp.json       # 2+ GPUs
    python bench/attention_cp.py --report bench/attention_cp.json

B 1, H 16, D 128, S 32k, 64k and 128k, bf16. Each rank runs one process (NCCL,
NCCL_NVLS_ENABLE=0). Per call: the forward, and forward plus backward; a round is timed
with CUDA events on every rank after a barrier, the slowest rank's time kept; medians
over rounds. The same ring with the transport stubbed out (each step reads the rank's
own K and V: the same kernels, no communication) gives the compute alone, so
`exposed` = ring - compute is the communication the steps did not hide. The ring runs
over NCCL (pipelink.ring_attention's default) and over copy engines
(pipelink.runtime.copy_ring: symmetric memory, no kernel for the transfers). TFLOP/s count
the causal work, 2 S^2 D H forward (two GEMMs over S^2 / 2 pairs), 2.5 times that
backward. The ring's O is checked against the single-GPU kernel's on rank 0's rows
before timing.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from results_md import bench_main, put_section  # noqa: E402

from pipelink.runtime.copy_ring import CopyEngineRing  # noqa: E402
from pipelink.runtime.ring import Ready  # noqa: E402

H, D = 16, 128
SEQUENCES = (32768, 65536, 131072)
WORLDS = (2, 4)
WARMUP = 2
TOLERANCE = 5e-2          # max |O - O_single| / max |O_single| on rank 0's rows


class LocalRing:
    """The ring without a transport: every step reads this rank's own K and V (the
    kernels and merges of the real ring, none of its communication)."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world

    def start(self, tensors: list):  # noqa: ANN201
        return Ready(tensors)


def causal_flops(s: int) -> float:
    return 2.0 * s * s * D * H


def _timed(fn, rounds: int) -> float:  # noqa: ANN001
    """Median over rounds of the slowest rank's ms."""
    import torch
    import torch.distributed as dist
    for _ in range(WARMUP):
        fn()
    samples = []
    for _ in range(rounds):
        dist.barrier()
        torch.cuda.synchronize()
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        fn()
        end.record()
        end.synchronize()
        slowest = torch.tensor([start.elapsed_time(end)], device="cuda")
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        samples.append(float(slowest))
    return statistics.median(samples)


def _te_attention(group, world: int):  # noqa: ANN001, ANN202
    """Transformer Engine's context-parallel attention, or the reason it is not here."""
    try:
        import torch
        import torch.distributed as dist
        from transformer_engine.pytorch import DotProductAttention
        attn = DotProductAttention(H, D, attn_mask_type="causal", qkv_format="bshd")
        attn.set_context_parallel_group(group, dist.get_process_group_ranks(group),
                                        torch.cuda.Stream(), cp_comm_type="p2p")
        return attn
    except Exception as exc:  # noqa: BLE001  (recorded in the JSON, not fatal)
        return f"{type(exc).__name__}: {exc}"[:200]


def _rank(rank: int, world: int, port: int, build: str, rounds: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    import pipelink
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    group = dist.group.WORLD
    kernels = pipelink.load(f"{build}/sm_90a/attn_cp_ring")
    single = pipelink.load(f"{build}/sm_90a/attn_causal") if rank == 0 else None
    te = _te_attention(group, world)
    copies = CopyEngineRing(group)
    rows = []
    for s in SEQUENCES:
        rows.append(_sequence(rank, world, s, kernels, single, te, copies, rounds))
        dist.barrier()
    if rank == 0:
        Path(out).write_text(json.dumps(rows))
    dist.destroy_process_group()


def _sequence(rank: int, world: int, s: int, kernels, single, te, copies,  # noqa: ANN001
              rounds: int) -> dict:
    """One sequence length's row: the ring over NCCL, over copy engines and with no
    transport, Transformer Engine, and on rank 0 the whole sequence on one GPU."""
    import torch

    import pipelink
    gen = torch.Generator(device="cuda").manual_seed(s)
    whole = [torch.randn(1, s, H, D, device="cuda", generator=gen, dtype=torch.bfloat16)
             for _ in range(4)]
    q, k, v, d_o = (pipelink.zigzag_shard(t, rank, world) for t in whole)
    local = LocalRing(rank, world)

    def ring(transport=None, backward: bool = False):  # noqa: ANN001, ANN202
        leaves = [t.detach().requires_grad_(backward) for t in (q, k, v)]
        o, _ = pipelink.ring_attention(kernels, *leaves, ring=transport)
        if backward:
            o.backward(d_o)
        return o

    def te_call(backward: bool) -> None:
        leaves = [t.detach().requires_grad_(backward) for t in (q, k, v)]
        o = te(*leaves)
        if backward:
            o.backward(d_o.reshape(o.shape))

    row = {"world": world, "s": s}
    o = ring()
    if rank == 0:
        want, _ = single.forward(*whole[:3])
        mine = pipelink.zigzag_shard(want, 0, world).float()
        row["max_rel_diff_vs_single"] = float((o.float() - mine).abs().max()
                                              / mine.abs().max())
        if not row["max_rel_diff_vs_single"] < TOLERANCE:
            raise SystemExit(f"ring attention is wrong at S {s}: "
                             f"{row['max_rel_diff_vs_single']:.3g}")
    for name, backward in (("forward", False), ("training", True)):
        row[f"{name}_ms"] = _timed(lambda b=backward: ring(backward=b), rounds)
        row[f"{name}_compute_ms"] = _timed(lambda b=backward: ring(local, b), rounds)
        row[f"{name}_copy_ms"] = _timed(lambda b=backward: ring(copies, b), rounds)
        if isinstance(te, str):
            row["te"] = te
        else:
            row[f"{name}_te_ms"] = _timed(lambda b=backward: te_call(b), rounds)
    if rank == 0:       # the whole sequence on one GPU (the other ranks wait)
        leaves = [t.detach().requires_grad_(True) for t in whole[:3]]
        row["forward_single_ms"] = statistics.median(
            _single(lambda: single.forward(*whole[:3]), rounds))
        row["training_single_ms"] = statistics.median(
            _single(lambda: single(*leaves)[0].backward(whole[3]), rounds))
    return row


def _single(fn, rounds: int) -> list[float]:  # noqa: ANN001
    import torch
    for _ in range(WARMUP):
        fn()
    out = []
    for _ in range(rounds):
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end))
    return out


def run(build: Path, rounds: int, out: Path | None) -> None:
    import tempfile

    import torch
    import torch.multiprocessing as mp
    rows = []
    for world in WORLDS:
        if torch.cuda.device_count() < world:
            print(f"skipping {world} GPUs: {torch.cuda.device_count()} here")
            continue
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        with tempfile.TemporaryDirectory() as tmp:
            result = Path(tmp) / "rows.json"
            mp.start_processes(_rank, args=(world, port, str(build), rounds, str(result)),
                               nprocs=world, start_method="spawn")
            rows += json.loads(result.read_text())
    data = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    print(json.dumps(data, indent=1))
    if out:
        tmp = out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(out)


def report(path: Path) -> None:
    """Writes the '## Context-parallel attention' section of RESULTS.md."""
    data = json.loads(path.read_text())
    lines = [f"## Context-parallel attention ({data['gpu']})", "",
             f"Generated by `python bench/attention_cp.py --report bench/{path.name}`; "
             f"torch {data['torch']}. Causal, B 1, H {H}, D {D}, zigzag shards; the "
             "slowest rank's median ms. compute: the same ring with no transport; "
             "exposed, TFLOP/s and the ratios: the faster transport's.", "",
             "| GPUs | S | pass | ring ms (NCCL) | ring ms (copy engines) | TFLOP/s per GPU | "
             "compute ms | exposed | one GPU ms | vs one GPU | TE ms | vs TE |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in data["rows"]:
        for name, factor in (("forward", 1.0), ("training", 3.5)):
            ms = min(r[f"{name}_ms"], r[f"{name}_copy_ms"])      # the faster transport
            flops = causal_flops(r["s"]) * factor / r["world"]
            te = r.get(f"{name}_te_ms")
            lines.append(
                f"| {r['world']} | {r['s'] // 1024}k | {name} | {r[f'{name}_ms']:.2f} | "
                f"{r[f'{name}_copy_ms']:.2f} | "
                f"{flops / ms / 1e9:.0f} | {r[f'{name}_compute_ms']:.2f} | "
                f"{ms - r[f'{name}_compute_ms']:.2f} | {r[f'{name}_single_ms']:.2f} | "
                f"{r[f'{name}_single_ms'] / ms:.2f}x | "
                + (f"{te:.2f} | {te / ms:.2f}x |" if te else "n/a | n/a |"))
    put_section("## Context-parallel attention", "\n".join(lines))


if __name__ == "__main__":
    bench_main(run, report, rounds=7)
