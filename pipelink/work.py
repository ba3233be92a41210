"""Work records: the typed items a scheduler broadcasts through a kernel's work ring.

A record type is named in a contract (``work: {dir: out, kind: work, record:
gemm_tile}``) and defined once in the device ABI (``pipelink/include/pipelink/
types.cuh``); this table is the checker's copy of its fields and of what they mean, so
a consumer that reads a field the producer's record lacks, or that would misread it,
is refused before anything compiles.
"""

from __future__ import annotations

from typing import Any

# The fields of pl::WorkTile, in layout order (both record types share it).
WORK_TILE_FIELDS = ("m_block", "n_block", "group", "k_begin", "k_end", "valid", "m_offset",
                    "m_end")

# record type -> (C++ type, field names in layout order)
RECORDS: dict[str, tuple[str, tuple[str, ...]]] = {
    # One GEMM: tile m_block covers rows [m_block * tile_m, +tile_m), clipped by the
    # tensor's edge; m_offset is 0 and m_end unbounded.
    "gemm_tile": ("pl::WorkTile", WORK_TILE_FIELDS),
    # G problems packed by rows (what MoE experts and varlen batches are): problem
    # `group` owns rows [m_offset, m_end) and m_block counts tiles from m_offset. Rows
    # from m_end on belong to the next problem: a store that ignored m_end would
    # overwrite them.
    "grouped_tile": ("pl::WorkTile", WORK_TILE_FIELDS),
}
RECORD_BYTES = 32          # sizeof(pl::WorkTile): eight int32 fields, aligned to 16
RECORD_ALIGN = 16
PER_TILE_WORK = "work"     # per_tile: stages per work item come from the record's k range
# Fields a role reads when it walks K over the record's range (per_tile: work).
K_RANGE_FIELDS = ("k_begin", "k_end")
# A consumer of grouped_tile records that reads m_block must also read these: m_block
# alone names rows of another problem, and nothing else stops its stores at m_end.
GROUP_ROW_FIELDS = ("m_offset", "m_end")


def accepted_records(spec: dict[str, Any]) -> tuple[str, ...]:
    """The record types a work in port names (one, or a list of those it handles);
    empty when it lists fields instead."""
    named = spec.get("record")
    if named is None:
        return ()
    return (named,) if isinstance(named, str) else tuple(named)


def record_fields(spec: dict[str, Any]) -> tuple[str, ...]:
    """The fields a work port's record has (out) or reads (in): the named record's,
    or the listed ones."""
    named = accepted_records(spec)
    if named:
        return RECORDS[named[0]][1]
    return tuple(spec.get("fields", ()))


def record_problem(produced: str, consumer: dict[str, Any]) -> tuple[str, str] | None:
    """Why a consumer port cannot read records of type ``produced``, as (problem, hint),
    or None when it can."""
    named = accepted_records(consumer)
    if named:
        if produced in named:
            return None
        return (f"the consumer reads {' or '.join(named)} records, the scheduler produces "
                f"{produced}",
                "use a consumer that handles " + produced + (
                    " (rows stop at m_end: e.g. grouped_store_epilogue)"
                    if produced == "grouped_tile" else "") +
                ", or a scheduler that produces " + " or ".join(named))
    fields = record_fields(consumer)
    missing = [f for f in fields if f not in RECORDS[produced][1]]
    if missing:
        return (f"the consumer reads field(s) {', '.join(missing)}, which record {produced} "
                "does not have", f"{produced} has: {', '.join(RECORDS[produced][1])}")
    if produced == "grouped_tile" and "m_block" in fields \
            and not set(GROUP_ROW_FIELDS) <= set(fields):
        return ("the consumer reads m_block of grouped_tile records without "
                + " and ".join(GROUP_ROW_FIELDS) + ": it would address rows of another "
                "problem", "read m_offset (the problem's first row) and m_end (where its "
                "rows stop), or name the record types the component handles: "
                "record: [gemm_tile, grouped_tile]")
    return None
