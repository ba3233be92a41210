"""A ring transport for pipelink.ring_attention that uses no SM: copy engines and
stream memory operations over symmetric memory.

The attention step kernels are persistent (a CTA on every SM, all of its registers), so
a communication kernel (NCCL's) launched beside one waits for it to end. Here a send is a
peer copy on a side stream (``Tensor.copy_`` into the next rank's buffer, mapped by
``torch.distributed._symmetric_memory``: a copy engine moves it) followed by a flag the
stream itself writes into the next rank's memory (``cuStreamWriteValue32``, fenced after
the copy); a receive is the main stream waiting on its own flag (``cuStreamWaitValue32``).
No kernel runs for either, and the host never blocks.

Each rank's inbox for one kind of message (K and V; dK and dV sums) is two slots in
turn. Counters only grow, and a flag holds a count: the next rank's ``arrived`` (sends
it has been given) and the previous rank's ``freed`` (receives this rank is done with:
read by its step and forwarded by its next send), so a sender waits, on its side stream,
until the slot it is about to fill has been let go.
"""

from __future__ import annotations

from typing import Any

from ..errors import RuntimeLaunchError
from .ring import require_process_group

SLOTS = 2
_ARRIVED, _FREED = 0, 1           # the two int32 flags after a channel's inbox
_FLAGS_BYTES = 2 * 4              # both, int32
_ALIGN = 16                       # where each tensor of a slot, and the flags, start


def _padded(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def _stream_handle(stream: Any) -> Any:
    from cuda.bindings import driver
    return driver.CUstream(stream.cuda_stream)


def _check(result: Any, what: str) -> None:
    from cuda.bindings import driver
    err = result[0] if isinstance(result, tuple) else result
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeLaunchError(f"{what} failed: {err}",
                                 hint="stream memory operations need a CUDA 12+ driver")


def wait_at_least(stream: Any, flag: Any, count: int) -> None:
    """`stream` waits (on the GPU) until the int32 at `flag` reaches `count`."""
    from cuda.bindings import driver
    at_least = driver.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ
    _check(driver.cuStreamWaitValue32(_stream_handle(stream),
                                      driver.CUdeviceptr(flag.data_ptr()), count, at_least),
           "cuStreamWaitValue32")


def write_count(stream: Any, flag: Any, count: int) -> None:
    """`stream` writes `count` to the int32 at `flag` once its earlier work is done and
    visible (the write's default memory barrier)."""
    from cuda.bindings import driver
    _check(driver.cuStreamWriteValue32(_stream_handle(stream),
                                       driver.CUdeviceptr(flag.data_ptr()), count, 0),
           "cuStreamWriteValue32")


class Channel:
    """One kind of message between a rank and its neighbours: this rank's inbox (SLOTS
    lists of tensors) and flags, and views of the next rank's inbox and arrived flag and
    of the previous rank's freed flag (peer memory, or plain tensors in a test)."""

    def __init__(self, inbox: list[list[Any]], arrived: Any, freed: Any,
                 next_inbox: list[list[Any]], next_arrived: Any, prev_freed: Any) -> None:
        self.inbox, self.arrived, self.freed = inbox, arrived, freed
        self.next_inbox, self.next_arrived, self.prev_freed = next_inbox, next_arrived, prev_freed
        self.mapping: Any = None   # the symmetric memory behind the views, kept alive
        self.sent = 0          # sends made (the next rank's receives)
        self.received = 0      # receives waited for
        self._lent: list[Any] | None = None      # the slot the last receive handed out

    def send(self, tensors: list[Any], side: Any) -> _Receive:
        import torch
        main = torch.cuda.current_stream()
        ready = torch.cuda.Event()
        ready.record(main)
        side.wait_event(ready)         # what is sent is written; the step before is done
        forwarding = self._lent is not None and tensors[0] is self._lent[0]
        with torch.cuda.stream(side):
            # Every receive before the one being forwarded now has been read (the main
            # stream passed its step) and forwarded (this side stream's earlier copy).
            write_count(side, self.prev_freed, self.received - int(forwarding))
            slot = self.sent % SLOTS
            if self.sent >= SLOTS:     # the next rank has let go of this slot's last fill
                wait_at_least(side, self.freed, self.sent - SLOTS + 1)
            for src, dst in zip(tensors, self.next_inbox[slot], strict=True):
                src.record_stream(side)
                dst.copy_(src, non_blocking=True)
            self.sent += 1
            write_count(side, self.next_arrived, self.sent)
        return _Receive(self)

    def receive(self) -> list[Any]:
        import torch
        self.received += 1
        wait_at_least(torch.cuda.current_stream(), self.arrived, self.received)
        self._lent = self.inbox[(self.received - 1) % SLOTS]
        return self._lent


class _Receive:
    def __init__(self, channel: Channel) -> None:
        self._channel = channel

    def wait(self) -> list[Any]:
        return self._channel.receive()


class CopyEngineRing:
    """The ranks of a process group as a ring over symmetric memory: ``start(tensors)``
    sends to the next rank and returns a handle whose ``wait()`` gives the previous
    rank's (pipelink.ring_attention's transport interface). Channels are made on first
    use per (shapes, dtypes), collectively: every rank sends the same kinds in the same
    order, as the ring does."""

    def __init__(self, group: Any = None) -> None:
        import torch
        import torch.distributed as dist
        require_process_group()
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.world = dist.get_world_size(self.group)
        self._side = torch.cuda.Stream()
        self._channels: dict[tuple, Channel] = {}

    def start(self, tensors: list[Any]) -> _Receive:
        key = tuple((tuple(t.shape), t.dtype) for t in tensors)
        channel = self._channels.get(key)
        if channel is None:
            channel = self._channels[key] = self._channel(tensors)
        return channel.send(tensors, self._side)

    def _channel(self, like: list[Any]) -> Channel:
        import torch
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm
        sizes = [t.numel() * t.element_size() for t in like]
        slot_bytes = sum(_padded(b) for b in sizes)
        flags_at = SLOTS * slot_bytes
        total = flags_at + _padded(_FLAGS_BYTES)
        buffer = symm.empty(total, dtype=torch.uint8, device=like[0].device)
        buffer.zero_()
        handle = symm.rendezvous(buffer, self.group)
        torch.cuda.current_stream().synchronize()
        dist.barrier(self.group)       # every rank's flags are zero before any is written
        next_rank = (self.rank + 1) % self.world
        prev_rank = (self.rank - 1) % self.world

        def views(rank: int) -> tuple[list[list[Any]], Any]:
            whole = buffer if rank == self.rank else handle.get_buffer(rank, (total,),
                                                                       torch.uint8)
            slots = []
            for s in range(SLOTS):
                at, slot = s * slot_bytes, []
                for t, nbytes in zip(like, sizes, strict=True):
                    slot.append(whole[at:at + nbytes].view(t.dtype).view(t.shape))
                    at += _padded(nbytes)
                slots.append(slot)
            return slots, whole[flags_at:flags_at + _FLAGS_BYTES].view(torch.int32)

        inbox, flags = views(self.rank)
        next_inbox, next_flags = views(next_rank)
        _, prev_flags = views(prev_rank)
        channel = Channel(inbox, flags[_ARRIVED:_ARRIVED + 1], flags[_FREED:_FREED + 1],
                          next_inbox, next_flags[_ARRIVED:_ARRIVED + 1],
                          prev_flags[_FREED:_FREED + 1])
        channel.mapping = handle
        return channel
