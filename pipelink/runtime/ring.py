"""Context-parallel causal attention over a ring of ranks: recipes/attn_cp_ring's kernels
driven step by step, K and V passed around a torch.distributed process group.

The sequence is cut into 2 W chunks and rank r holds chunks r and 2 W - 1 - r of Q, K
and V (:func:`zigzag_shard`), so every rank's causal work is the same. Step t attends
the rank's queries to the K and V of rank r - t: its own (causal), an earlier rank's or
a later one's (zigzag_mask), each half a square of tiles. While a step's kernel runs,
the K and V it reads go on to rank r + 1 and the next step's arrive from rank r - 1; the
steps' outputs are merged by their log-sum-exps in fp32. The backward walks the ring
again, each K/V chunk travelling with the fp32 sums of its dK and dV, which a last hop
hands to their owner.
"""

from __future__ import annotations

from typing import Any

from ..errors import RuntimeLaunchError

OWN, EARLIER, LATER = "", "_earlier", "_later"   # the kernel name suffix of each relation


def zigzag_shard(x: Any, rank: int, world: int, dim: int = 1) -> Any:
    """Rank `rank`'s shard of a whole sequence: chunks rank and 2 world - 1 - rank of
    2 world along `dim` (the sequence: 1 for [B, S, H, D]), back to back."""
    length = x.shape[dim]
    if length % (2 * world):
        raise RuntimeLaunchError(f"a sequence of {length} tokens does not cut into "
                                 f"{2 * world} equal chunks for {world} ranks",
                                 hint=f"pad the sequence to a multiple of {2 * world}")
    import torch
    chunks = x.chunk(2 * world, dim=dim)
    return torch.cat([chunks[rank], chunks[2 * world - 1 - rank]], dim=dim)


def zigzag_unshard(shards: list[Any], dim: int = 1) -> Any:
    """The whole sequence from every rank's shard, in rank order (zigzag_shard undone)."""
    import torch
    world = len(shards)
    halves = [s.chunk(2, dim=dim) for s in shards]
    order = [halves[i][0] for i in range(world)] + \
        [halves[world - 1 - i][1] for i in range(world)]
    return torch.cat(order, dim=dim)


def relation(rank: int, source: int) -> str:
    """Which kernel attends `rank`'s queries to `source`'s K and V."""
    return OWN if source == rank else EARLIER if source < rank else LATER


def require_process_group() -> None:
    """Refuses a ring before torch.distributed is initialised (every transport needs it)."""
    import torch.distributed as dist
    if not dist.is_initialized():
        raise RuntimeLaunchError("ring attention needs an initialised torch.distributed "
                                 "process group",
                                 hint="call torch.distributed.init_process_group first")


class GroupRing:
    """The ranks of a torch.distributed process group as a ring: each sends to the next
    and receives from the previous, asynchronously (NCCL on GPUs, gloo on CPUs)."""

    def __init__(self, group: Any = None) -> None:
        import torch.distributed as dist
        require_process_group()
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)

        def peer(i: int) -> int:
            i %= self.world
            return dist.get_global_rank(group, i) if group is not None else i
        self._next, self._prev = peer(self.rank + 1), peer(self.rank - 1)

    def start(self, tensors: list[Any]) -> _Pending:
        """Sends `tensors` to the next rank and starts receiving the previous rank's
        (same shapes); the returned handle's wait() gives them."""
        import torch
        import torch.distributed as dist
        received = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t.contiguous(), self._next, self.group)
               for t in tensors]
        ops += [dist.P2POp(dist.irecv, t, self._prev, self.group) for t in received]
        return _Pending(dist.batch_isend_irecv(ops), received)


class _Pending:
    def __init__(self, works: list[Any], received: list[Any]) -> None:
        self._works, self._received = works, received

    def wait(self) -> list[Any]:
        for work in self._works:
            work.wait()
        return self._received


class Ready:
    """A receive that has already happened (a transport that moves nothing, such as a
    benchmark's ring without communication): wait() gives its tensors."""

    def __init__(self, tensors: list[Any]) -> None:
        self._tensors = tensors

    def wait(self) -> list[Any]:
        return self._tensors


def merge_into(o_sum: Any, lse_sum: Any, o: Any, lse: Any) -> None:
    """Folds one step's output into the running one, in place: O [B, S, H, D] fp32 and
    LSE [B, H, S] (natural log; -inf: no key yet), as online softmax does per tile."""
    import torch
    total = torch.logaddexp(lse_sum, lse)
    finite = torch.where(torch.isinf(total), torch.zeros_like(total), total)   # -inf rows

    def weight(part: Any) -> Any:                  # [B, H, S] -> [B, S, H, 1]
        return torch.exp(part - finite).transpose(1, 2).unsqueeze(-1)
    o_sum.mul_(weight(lse_sum)).add_(o.float() * weight(lse))
    lse_sum.copy_(total)


def _kernel(kernels: Any, stem: str, rank: int, source: int) -> Any:
    name = stem + relation(rank, source)
    try:
        return getattr(kernels, name)
    except AttributeError:
        raise RuntimeLaunchError(f"the kernels given have no '{name}'",
                                 hint="load recipes/attn_cp_ring's build "
                                      "(pipelink.load(.../attn_cp_ring))") from None


def _ring_forward(kernels: Any, ring: Any, q: Any, k: Any, v: Any) -> tuple[Any, Any]:
    import torch
    b, s, h, d = q.shape
    o_sum = torch.zeros(b, s, h, d, device=q.device, dtype=torch.float32)
    lse_sum = torch.full((b, h, s), float("-inf"), device=q.device, dtype=torch.float32)
    kv = [k, v]
    for step in range(ring.world):
        pending = ring.start(kv) if step + 1 < ring.world else None
        source = (ring.rank - step) % ring.world
        o, lse = _kernel(kernels, "forward", ring.rank, source)(q, *kv)
        merge_into(o_sum, lse_sum, o, lse)
        if pending is not None:
            kv = pending.wait()
    return o_sum.to(q.dtype), lse_sum


def _ring_backward(kernels: Any, ring: Any, d_o: Any, q: Any, k: Any, v: Any, o: Any,
                   lse: Any) -> tuple[Any, Any, Any]:
    import torch
    dq = torch.zeros_like(q, dtype=torch.float32)
    kv = [k, v]
    dkv = [torch.zeros_like(k, dtype=torch.float32), torch.zeros_like(v, dtype=torch.float32)]
    for step in range(ring.world):
        last = step + 1 == ring.world
        pending = ring.start(kv) if not last else None     # K and V move under the step
        source = (ring.rank - step) % ring.world
        dq_step, dk_step, dv_step = _kernel(kernels, "backward", ring.rank, source)(
            d_o, q, *kv, o, lse)[:3]
        dq += dq_step.float()
        dkv[0] += dk_step.float()
        dkv[1] += dv_step.float()
        dkv = ring.start(dkv).wait()           # their sums go with them (the last: home)
        if pending is not None:
            kv = pending.wait()
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)


def _function() -> Any:
    import torch

    class RingAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, q: Any, k: Any, v: Any, kernels: Any, ring: Any) -> Any:
            o, lse = _ring_forward(kernels, ring, q, k, v)
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.kernels, ctx.ring = kernels, ring
            ctx.mark_non_differentiable(lse)
            return o, lse

        @staticmethod
        def backward(ctx: Any, d_o: Any, _d_lse: Any) -> Any:
            q, k, v, o, lse = ctx.saved_tensors
            grads = _ring_backward(ctx.kernels, ctx.ring, d_o.contiguous(), q, k, v, o, lse)
            return (*grads, None, None)
    return RingAttention


_RING_ATTENTION: Any = None


def ring_attention(kernels: Any, q: Any, k: Any, v: Any, group: Any = None,
                   ring: Any = None) -> tuple[Any, Any]:
    """Causal attention of this rank's zigzag shards (:func:`zigzag_shard` of Q [B, S, H,
    D] and K, V [B, S, HKV, D] along S) over the ranks of `group` (the default group when
    None): O (this rank's rows, q's dtype) and LSE [B, H, S_local] fp32. Differentiable in
    q, k and v. `kernels`: ``pipelink.load`` of recipes/attn_cp_ring's build (or anything
    with its kernels' names and calls); `ring`: another transport than the group's."""
    global _RING_ATTENTION
    if _RING_ATTENTION is None:
        _RING_ATTENTION = _function()
    ring = ring if ring is not None else GroupRing(group)
    if q.shape[1] % 2:
        raise RuntimeLaunchError(f"a zigzag shard holds two equal chunks: {q.shape[1]} "
                                 "tokens is odd", hint="shard with pipelink.zigzag_shard")
    return _RING_ATTENTION.apply(q, k, v, kernels, ring)
