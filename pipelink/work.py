"""Work records: the typed items a scheduler broadcasts through a kernel's work ring.

A record type is named in a contract (``work: {dir: out, kind: work, record:
gemm_tile}``) and defined once in the device ABI (``pipelink/include/pipelink/
types.cuh``); this table is the checker's copy of its fields, so a consumer that reads
a field the producer's record lacks is refused before anything compiles.
"""

from __future__ import annotations

# record type -> (C++ type, field names in layout order)
RECORDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "gemm_tile": ("pl::WorkTile", ("m_block", "n_block", "group", "k_begin", "k_end", "valid")),
}
RECORD_BYTES = 32          # sizeof(pl::WorkTile): six int32 fields, aligned to 16
RECORD_ALIGN = 16
PER_TILE_WORK = "work"     # per_tile: stages per work item come from the record's k range
# Fields a role reads when it walks K over the record's range (per_tile: work).
K_RANGE_FIELDS = ("k_begin", "k_end")


def record_fields(spec: dict) -> tuple[str, ...]:
    """The fields a work port's record has (out) or reads (in): the named record's,
    or the listed ones."""
    if "record" in spec:
        return RECORDS[spec["record"]][1]
    return tuple(spec.get("fields", ()))
