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
                    "m_end", "k_split", "k_splits", "partials", "flag")

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
    # One GEMM whose tiles may be split along K (split-K): each piece's fp32 partial
    # accumulators meet in the workspace, and only piece 0 stores the tile. A
    # consumer that ignored k_splits would store a partial sum as the result.
    "split_tile": ("pl::WorkTile", WORK_TILE_FIELDS),
    # G problems packed along K (weight gradients over MoE experts): problem `group`
    # reduces the k-tiles [k_begin, k_end) of A [K, M] and B [K, N]; m_block and
    # n_block index A's and B's columns with no problem offset, and the tile's output
    # rows are m_offset + m_block * tile_m of C [G*M, N], stopping at m_end. A loader
    # that offset A by m_offset would read past A; a store that ignored it would write
    # every problem over problem 0.
    "kgrouped_tile": ("pl::WorkTile", WORK_TILE_FIELDS),
    # Attention over B row-packed sequences: query tile m_block of head n_block of
    # sequence `group`, whose tokens are rows [m_offset, m_end) of Q, K, V and O viewed
    # as [rows, heads, head_dim]; the tile sees key tiles [k_begin, k_end) (of the
    # core's tile_n keys, counted from m_offset). A store that ignored m_end would write
    # the next sequence's rows; one writing column n_block * tile_n stores the head.
    "attn_tile": ("pl::WorkTile", WORK_TILE_FIELDS),
}
# Records whose pieces exchange partial accumulators: both ends of the ring state the
# tile shape (so both size a partial alike).
PARTIAL_RECORDS = ("split_tile",)
RECORD_BYTES = 48          # sizeof(pl::WorkTile): twelve 32-bit fields, aligned to 16
RECORD_ALIGN = 16
PER_TILE_WORK = "work"     # per_tile: stages per work item come from the record's k range
# Fields a role reads when it walks K over the record's range (per_tile: work).
K_RANGE_FIELDS = ("k_begin", "k_end")
# What a consumer listing fields must read with m_block or n_block (the fields a role
# that stores the tile reads), per record type, and why.
COMPANION_FIELDS: dict[str, tuple[tuple[str, ...], str, str]] = {
    "grouped_tile": (("m_offset", "m_end"), "it would address rows of another problem",
                     "read m_offset (the problem's first row) and m_end (where its rows "
                     "stop)"),
    "kgrouped_tile": (("m_offset", "m_end"), "it would write every problem's output over "
                      "the first one's", "read m_offset (the problem's first output row) "
                      "and m_end"),
    "attn_tile": (("m_offset", "m_end"), "it would address rows of another sequence",
                  "read m_offset (the sequence's first row) and m_end (where its rows "
                  "stop)"),
    "split_tile": (("k_split", "k_splits", "partials", "flag"),
                   "it would store one piece's partial sum as the tile",
                   "combine the pieces (pipelink/splitk.cuh) and read k_split, k_splits, "
                   "partials and flag"),
}


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


_EXAMPLE = {"attn_tile": " (a tile's rows stop at its sequence's m_end: e.g. "
                         "grouped_store_epilogue)",
            "grouped_tile": " (rows stop at m_end: e.g. grouped_store_epilogue)",
            "kgrouped_tile": " (e.g. tma_kgrouped_loader, then grouped_store_epilogue)",
            "split_tile": " (pieces combine their partials: e.g. store_epilogue)"}


def record_problem(produced: str, consumer: dict[str, Any]) -> tuple[str, str] | None:
    """Why a consumer port cannot read records of type ``produced``, as (problem, hint),
    or None when it can."""
    named = accepted_records(consumer)
    if named:
        if produced in named:
            return None
        return (f"the consumer reads {' or '.join(named)} records, the scheduler produces "
                f"{produced}",
                "use a consumer that handles " + produced + _EXAMPLE.get(produced, "") +
                ", or a scheduler that produces " + " or ".join(named))
    fields = record_fields(consumer)
    missing = [f for f in fields if f not in RECORDS[produced][1]]
    if missing:
        return (f"the consumer reads field(s) {', '.join(missing)}, which record {produced} "
                "does not have", f"{produced} has: {', '.join(RECORDS[produced][1])}")
    companions, why, what = COMPANION_FIELDS.get(produced, ((), "", ""))
    if {"m_block", "n_block"} & set(fields) and not set(companions) <= set(fields):
        return (f"the consumer reads fields {', '.join(fields)} of {produced} records without "
                f"{', '.join(c for c in companions if c not in fields)}: {why}",
                f"{what}, or name the record types the component handles: "
                f"record: [gemm_tile, {produced}]")
    return None
