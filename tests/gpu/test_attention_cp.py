"""Context-parallel ring attention (recipes/attn_cp_ring, pipelink.ring_attention) on
GPUs: every rank's O, LSE, dQ, dK and dV, gathered, against an fp32 reference of causal
attention over the whole sequence, per element, every step's kernel outputs poisoned
with NaN first (on one GPU). On one GPU the ranks are threads, passing tensors through
queues or through pipelink.runtime.copy_ring's slots and stream flags (the steps'
kernels, the merge and the copy transport are the real ones); on 2 and 4 GPUs they are
processes joined by NCCL (NCCL_NVLS_ENABLE=0), the ring over NCCL or over symmetric
memory."""

from __future__ import annotations

import math
import os
import queue
import socket
import threading

import pytest

from pipelink.runtime.copy_ring import SLOTS, Channel, CopyEngineRing

pytestmark = pytest.mark.gpu

O_ATOL, O_RTOL = 2e-2, 2e-2      # bf16 O per step, merged in fp32
GRAD_RTOL = 5e-2


def whole(b: int, s: int, h: int, hkv: int, d: int, seed: int):  # noqa: ANN201
    """bf16 Q, K, V, dO of the whole sequence and the fp32 reference's O, LSE, dQ, dK, dV."""
    import torch
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, d_o = (torch.randn(b, s, h, d, device="cuda", generator=gen).bfloat16() for _ in range(2))
    k, v = (torch.randn(b, s, hkv, d, device="cuda", generator=gen).bfloat16()
            for _ in range(2))
    leaves = [t.float().requires_grad_(True) for t in (q, k, v)]
    qf, kf, vf = (t.transpose(1, 2) for t in leaves)
    kf, vf = kf.repeat_interleave(h // hkv, dim=1), vf.repeat_interleave(h // hkv, dim=1)
    scores = (qf @ kf.transpose(-1, -2) / math.sqrt(d)).masked_fill(
        torch.ones(s, s, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
    o = (torch.softmax(scores, dim=-1) @ vf).transpose(1, 2)
    o.backward(d_o.float())
    return (q, k, v, d_o), (o.detach(), torch.logsumexp(scores, dim=-1).detach(),
                            *(t.grad for t in leaves))


def check(got: list[dict], want: tuple) -> None:
    import torch

    from pipelink.runtime.ring import zigzag_unshard
    o, lse, *grads = want
    torch.testing.assert_close(zigzag_unshard([g["o"] for g in got]).float(), o,
                               atol=O_ATOL, rtol=O_RTOL)
    torch.testing.assert_close(zigzag_unshard([g["lse"] for g in got], dim=2), lse,
                               atol=2e-3, rtol=0)
    for i, (name, ref) in enumerate(zip(("dq", "dk", "dv"), grads, strict=True)):
        mine = zigzag_unshard([g["grads"][i] for g in got]).float()
        torch.testing.assert_close(mine, ref, rtol=GRAD_RTOL,
                                   atol=2e-2 * float(ref.abs().max()) + 1e-5,
                                   msg=lambda m, name=name: f"{name}: {m}")


class Poisoned:
    """attn_cp_ring's kernels, each call writing into outputs filled with NaN (and its
    dQ turn counters with garbage) first: a tile a step leaves unwritten fails."""

    def __init__(self, kernels) -> None:  # noqa: ANN001
        self._kernels = kernels

    def __getattr__(self, name: str):  # noqa: ANN204
        import torch
        op = getattr(self._kernels, name)
        nan = float("nan")

        def forward(q, k, v):  # noqa: ANN001, ANN202
            b, s, h, _ = q.shape
            out = (torch.full_like(q, nan), torch.full((b, h, s), nan, device=q.device))
            return op(q, k, v, out=out)

        def backward(d_o, q, k, v, o, lse):  # noqa: ANN001, ANN202
            b, s, h, _ = q.shape
            out = (torch.full_like(q, nan), torch.full_like(k, nan), torch.full_like(v, nan),
                   torch.full((h, 2, b * s), nan, device=q.device),
                   torch.full(q.shape, nan, device=q.device),
                   torch.full((h, b * s // 64 + b + 1), -7, device=q.device,
                              dtype=torch.int32))
            return op(d_o, q, k, v, o, lse, out=out)
        return forward if name.startswith("forward") else backward


class ThreadRing:
    """Rank `rank` of `world` threads in one process: sends go into the next rank's
    queue, receives come from this rank's. Like NCCL's, a receive takes the message in
    the order it was posted, not the order it is waited for (the backward waits for the
    dK/dV sums it posted second before the K/V it posted first)."""

    def __init__(self, boxes: list[queue.Queue], rank: int) -> None:
        self.rank, self.world, self._boxes = rank, len(boxes), boxes
        self._turns = 0            # every rank posts its sends and receives in one order
        self._early: dict[int, list] = {}

    def start(self, tensors: list):  # noqa: ANN201
        import torch
        sent = [t.clone() for t in tensors]
        torch.cuda.current_stream().synchronize()     # written before another stream reads
        ticket, self._turns = self._turns, self._turns + 1
        self._boxes[(self.rank + 1) % self.world].put((ticket, sent))
        return QueuedReceive(self, ticket)

    def take(self, ticket: int) -> list:
        """The `ticket`-th message from the previous rank, holding any that come first."""
        while ticket not in self._early:
            seq, tensors = self._boxes[self.rank].get(timeout=120)
            self._early[seq] = tensors
        return self._early.pop(ticket)


class QueuedReceive:
    """ThreadRing's receive: the previous rank's message posted as `ticket`."""

    def __init__(self, ring: ThreadRing, ticket: int) -> None:
        self._ring, self._ticket = ring, ticket

    def wait(self) -> list:
        return self._ring.take(self._ticket)


class LocalCopyRing(CopyEngineRing):
    """pipelink.runtime.copy_ring's transport with the ranks as threads on one GPU: each
    rank's inbox and flags are plain tensors here, the "peer" views the other threads'
    tensors (the copies, stream flags and slot turns are the real ones)."""

    _shared: dict = {}
    _lock = threading.Lock()

    def __init__(self, rank: int, world: int, tag: str) -> None:  # no process group
        import torch
        self.rank, self.world, self._tag = rank, world, tag
        self._side = torch.cuda.Stream()
        self._channels: dict = {}

    def _channel(self, like: list) -> Channel:
        import torch
        key = (self._tag, tuple((tuple(t.shape), t.dtype) for t in like))
        with self._lock:
            if key not in self._shared:
                self._shared[key] = [
                    ([[torch.empty_like(t) for t in like] for _ in range(SLOTS)],
                     torch.zeros(2, dtype=torch.int32, device=like[0].device))
                    for _ in range(self.world)]
        ranks = self._shared[key]
        inbox, flags = ranks[self.rank]
        next_inbox, next_flags = ranks[(self.rank + 1) % self.world]
        _, prev_flags = ranks[(self.rank - 1) % self.world]
        return Channel(inbox, flags[0:1], flags[1:2], next_inbox, next_flags[0:1],
                       prev_flags[1:2])


def run_ranks(world: int, make_ring, kernels, tensors) -> list[dict]:  # noqa: ANN001
    """Every rank as a thread with its own stream: the ring forward and backward
    (pipelink.runtime.ring's steps, called directly: autograd runs a device's backward
    functions on one thread, which would serialise the ranks)."""
    import torch

    import pipelink
    from pipelink.runtime.ring import _ring_backward, _ring_forward
    got: list[dict] = [{} for _ in range(world)]
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            with torch.cuda.stream(torch.cuda.Stream()):
                ring = make_ring(r)
                mine = [pipelink.zigzag_shard(t, r, world) for t in tensors]
                o, lse = _ring_forward(kernels, ring, *mine[:3])
                grads = _ring_backward(kernels, ring, mine[3], *mine[:3], o, lse)
                torch.cuda.current_stream().synchronize()
                got[r] = {"o": o, "lse": lse, "grads": grads}
        except BaseException as error:  # noqa: BLE001  (re-raised in the test's thread)
            errors.append(error)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return got


@pytest.mark.parametrize("world,s,h,hkv", [(2, 1024, 4, 2), (4, 2048, 2, 2), (2, 512, 2, 1)])
def test_the_ring_on_one_gpu_matches_whole_sequence_attention(build_dir, world, s, h, hkv):
    """The ranks as threads on one GPU passing tensors through queues: the ring's steps
    (own, earlier and later K/V through attn_cp_ring's kernels), the merge and the
    backward's travelling dK and dV, against the reference on the whole sequence."""
    import pipelink
    kernels = Poisoned(pipelink.load(build_dir / "sm_90a" / "attn_cp_ring"))
    tensors, want = whole(2, s, h, hkv, 128, seed=s + world)
    boxes = [queue.Queue() for _ in range(world)]
    check(run_ranks(world, lambda r: ThreadRing(boxes, r), kernels, tensors), want)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_the_copy_engine_ring_on_one_gpu_matches_whole_sequence_attention(build_dir, world):
    """pipelink.runtime.copy_ring (peer copies on a side stream, flags the streams write
    and wait on, two slots in turn) with the ranks as threads on one GPU: the forward,
    then the backward, whose dK and dV sums take a channel of their own, twice over (the
    counters and slots carry on from one call to the next)."""
    import pipelink
    kernels = Poisoned(pipelink.load(build_dir / "sm_90a" / "attn_cp_ring"))
    rings = [LocalCopyRing(r, world, tag=f"copy{world}") for r in range(world)]

    for seed in (1, 2):
        tensors, want = whole(1, 1024 * world, 4, 2, 128, seed=seed)
        check(run_ranks(world, rings.__getitem__, kernels, tensors), want)


def _rank(rank: int, world: int, port: int, build: str, out: str, transport: str) -> None:
    import torch
    import torch.distributed as dist

    import pipelink
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    try:
        kernels = pipelink.load(f"{build}/sm_90a/attn_cp_ring")
        (q, k, v, d_o), _ = whole(1, 4096, 4, 2, 128, seed=11)
        mine = [pipelink.zigzag_shard(t, rank, world).requires_grad_(True) for t in (q, k, v)]
        ring = CopyEngineRing() if transport == "copy" else None     # None: NCCL
        o, lse = pipelink.ring_attention(kernels, *mine, ring=ring)
        o.backward(pipelink.zigzag_shard(d_o, rank, world))
        torch.save({"o": o.detach().cpu(), "lse": lse.cpu(),
                    "grads": [t.grad.cpu() for t in mine]}, f"{out}/{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("transport", ["nccl", "copy"])
@pytest.mark.parametrize("world", [2, 4])
def test_the_ring_over_gpus_matches_whole_sequence_attention(build_dir, tmp_path, world,
                                                             transport):
    """2 and 4 processes, a GPU each: the ring over NCCL, and over symmetric memory
    with copy engines (pipelink.runtime.copy_ring)."""
    import torch
    import torch.multiprocessing as mp
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.start_processes(_rank, args=(world, port, str(build_dir), str(tmp_path), transport),
                       nprocs=world, start_method="spawn")
    got = [{key: (value.cuda() if torch.is_tensor(value) else [g.cuda() for g in value])
            for key, value in torch.load(tmp_path / f"{r}.pt").items()} for r in range(world)]
    _, want = whole(1, 4096, 4, 2, 128, seed=11)
    check(got, want)
