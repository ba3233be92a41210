"""pipelink.ring_attention's ring, on the CPU: W processes joined by gloo run the
zigzag-sharded causal attention and its backward with attn_cp_ring's kernels stood in
for by their fp32 arithmetic (each relation's mask, the backward from the final O and
LSE as attn_bwd_core computes it), and every rank's O, LSE, dQ, dK and dV must match
single-process causal attention on the whole sequence, per element. What runs on GPUs
(NCCL, the linked kernels) is tests/gpu/test_attention_cp.py."""

from __future__ import annotations

import math
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

import pipelink
from pipelink.runtime.ring import merge_into, zigzag_unshard

B, H, HKV, D = 2, 4, 2, 16


class Reference:
    """recipes/attn_cp_ring's kernels by name, in fp32: forward* -> (O, LSE),
    backward* -> (dQ, dK, dV) of one step's K and V given the merged O and LSE."""

    def __getattr__(self, name: str):  # noqa: ANN204
        stem, _, relation = name.partition("_")
        if stem == "forward":
            return lambda q, k, v: self._forward(q, k, v, relation)
        return lambda d_o, q, k, v, o, lse: self._backward(d_o, q, k, v, o, lse, relation)

    @staticmethod
    def _keep(s: int, relation: str) -> torch.Tensor:
        q, kv, half = torch.arange(s)[:, None], torch.arange(s)[None, :], s // 2
        return {"": kv <= q, "earlier": (kv < half) & (q >= 0),
                "later": (q >= half) & (kv >= 0)}[relation]

    def _scores(self, q, k, relation):  # noqa: ANN001, ANN202
        kf = k.repeat_interleave(H // HKV, dim=2)
        s = torch.einsum("bqhd,bkhd->bhqk", q, kf) / math.sqrt(D)
        return s.masked_fill(~self._keep(q.shape[1], relation), float("-inf"))

    def _forward(self, q, k, v, relation):  # noqa: ANN001, ANN202
        s = self._scores(q, k, relation)
        lse = torch.logsumexp(s, dim=-1)
        p = torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0)
        return torch.einsum("bhqk,bkhd->bqhd", p, v.repeat_interleave(H // HKV, dim=2)), lse

    def _backward(self, d_o, q, k, v, o, lse, relation):  # noqa: ANN001, ANN202
        groups = H // HKV
        p = torch.exp(self._scores(q, k, relation) - lse[..., None])
        vf = v.repeat_interleave(groups, dim=2)
        kf = k.repeat_interleave(groups, dim=2)
        dv = torch.einsum("bhqk,bqhd->bkhd", p, d_o)
        dp = torch.einsum("bqhd,bkhd->bhqk", d_o, vf)
        delta = (d_o * o).sum(-1).transpose(1, 2)[..., None]       # [B, H, S, 1]
        ds = p * (dp - delta) / math.sqrt(D)
        dq = torch.einsum("bhqk,bkhd->bqhd", ds, kf)
        dk = torch.einsum("bhqk,bqhd->bkhd", ds, q)

        def per_kv_head(g):  # noqa: ANN001, ANN202
            return g.unflatten(2, (HKV, groups)).sum(3)
        return dq, per_kv_head(dk), per_kv_head(dv)


def whole(s: int):  # noqa: ANN201
    """Q, K, V and dO of the whole sequence, and causal attention's O, LSE and gradients."""
    gen = torch.Generator().manual_seed(s)
    q, d_o = (torch.randn(B, s, H, D, generator=gen) for _ in range(2))
    k, v = (torch.randn(B, s, HKV, D, generator=gen) for _ in range(2))
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    qf, kf, vf = leaves
    scores = torch.einsum("bqhd,bkhd->bhqk", qf, kf.repeat_interleave(H // HKV, dim=2))
    scores = (scores / math.sqrt(D)).masked_fill(
        torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    o = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, dim=-1),
                     vf.repeat_interleave(H // HKV, dim=2))
    o.backward(d_o)
    return (q, k, v, d_o), (o.detach(), torch.logsumexp(scores, dim=-1).detach(),
                            *(t.grad for t in leaves))


def _rank(rank: int, world: int, port: int, s: int, out: str) -> None:
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        (q, k, v, d_o), _ = whole(s)
        mine = [pipelink.zigzag_shard(t, rank, world).requires_grad_(True) for t in (q, k, v)]
        o, lse = pipelink.ring_attention(Reference(), *mine)
        o.backward(pipelink.zigzag_shard(d_o, rank, world))
        torch.save({"o": o.detach(), "lse": lse, "grads": [t.grad for t in mine]},
                   f"{out}/{rank}.pt")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("world,s", [(2, 48), (3, 60), (4, 32)])
def test_the_ring_matches_whole_sequence_attention(tmp_path, world, s):
    mp.start_processes(_rank, args=(world, _free_port(), s, str(tmp_path)), nprocs=world,
                       start_method="spawn")
    got = [torch.load(tmp_path / f"{r}.pt") for r in range(world)]
    _, (o, lse, dq, dk, dv) = whole(s)
    close = {"rtol": 1e-4, "atol": 1e-5}
    torch.testing.assert_close(zigzag_unshard([g["o"] for g in got]), o, **close)
    torch.testing.assert_close(zigzag_unshard([g["lse"] for g in got], dim=2), lse, **close)
    for i, want in enumerate((dq, dk, dv)):
        torch.testing.assert_close(zigzag_unshard([g["grads"][i] for g in got]), want, **close)


def test_zigzag_shards_balance_the_causal_work():
    """Rank r's chunks r and 2W - 1 - r: every rank's queries see the same number of
    keys, and unshard undoes shard."""
    world, s = 4, 64
    x = torch.arange(s)[None, :]
    shards = [pipelink.zigzag_shard(x, r, world) for r in range(world)]
    assert torch.equal(zigzag_unshard(shards), x)
    assert len({int((shard + 1).sum()) for shard in shards}) == 1   # sum of keys seen


def test_merging_steps_is_softmax_over_their_union():
    """Two steps' (O, LSE), merged, are one softmax over both steps' keys; a row no step
    has seen yet (LSE -inf) takes the other's as it is."""
    gen = torch.Generator().manual_seed(3)
    s, v = torch.randn(1, 2, 5, 8, generator=gen), torch.randn(1, 8, 2, 3, generator=gen)
    s[0, 1, 0, :4] = float("-inf")                     # row 0 of head 1: no key in step 1
    parts = []
    for keys in (slice(0, 4), slice(4, 8)):
        lse = torch.logsumexp(s[..., keys], dim=-1)
        p = torch.nan_to_num(torch.exp(s[..., keys] - lse[..., None]), nan=0.0)
        parts.append((torch.einsum("bhqk,bkhd->bqhd", p, v[:, keys]), lse))
    o_sum = torch.zeros(1, 5, 2, 3)
    lse_sum = torch.full((1, 2, 5), float("-inf"))
    for o, lse in parts:
        merge_into(o_sum, lse_sum, o, lse)
    want = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), v)
    torch.testing.assert_close(o_sum, want)
    torch.testing.assert_close(lse_sum, torch.logsumexp(s, dim=-1))


def test_a_sequence_that_does_not_cut_evenly_is_refused():
    from pipelink.errors import RuntimeLaunchError
    with pytest.raises(RuntimeLaunchError, match="pad the sequence") as err:
        pipelink.zigzag_shard(torch.zeros(1, 30, 1, 1), 0, 4)
    assert "8 equal chunks" in str(err.value)
