"""Function interfaces: device functions one component calls and another provides.

A `function` port names an interface. The caller's object references one symbol per
function of the interface (``pl_<component>_<port>_<function>``, params-hashed like
every entry); the provider defines its own (``pl_<provider>_<port>_<function>``,
taking its placement and runtime arguments first). The glue defines the caller's
symbols as forwarders to the connected provider, so nvJitLink's LTO inlines the
provider into the caller: a score or mask modifier linked into an unchanged
attention core, as FlexAttention does by generating code. The device-side types the
signatures use live in ``pipelink/include/pipelink/attention.cuh``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Function:
    name: str
    returns: str                          # C++ return type
    params: tuple[tuple[str, str], ...]   # (C++ type, name)
    description: str

    def signature(self, first: str) -> str:
        """The parameter list: `first` (the leading parameters every symbol takes), then
        the interface's own."""
        return ", ".join([first, *(f"{ctype} {name}" for ctype, name in self.params)])

    def arguments(self, first: str) -> str:
        return ", ".join([first, *(name for _, name in self.params)])


@dataclass(frozen=True)
class Interface:
    name: str
    description: str
    functions: tuple[Function, ...]


_I32 = "int32_t"

INTERFACES: dict[str, Interface] = {i.name: i for i in (
    Interface(
        "attn_mask",
        "which keys a query of an attention core sees (FlexAttention's mask_mod, plus "
        "the block-level facts a scheduler and a core need to skip work): positions are "
        "counted from the sequence's first row",
        (Function("kv_range", "pl::attn::Span",
                  ((_I32, "q_begin"), (_I32, "q_end"), (_I32, "kv_len")),
                  "the key positions [begin, end) that some query of [q_begin, q_end) "
                  "may see, within [0, kv_len); begin >= end: none"),
         Function("q_range", "pl::attn::Span",
                  ((_I32, "kv_begin"), (_I32, "kv_end"), (_I32, "q_len")),
                  "the query positions [begin, end) within [0, q_len) that may see some key "
                  "of [kv_begin, kv_end) (a backward walks a key tile's queries); begin >= "
                  "end: none"),
         Function("partial", "bool",
                  ((_I32, "q_begin"), (_I32, "q_end"), (_I32, "kv_begin"), (_I32, "kv_end")),
                  "whether the block of queries [q_begin, q_end) by keys [kv_begin, "
                  "kv_end) has a masked element (the core then asks keep() per element)"),
         Function("keep", "bool", ((_I32, "q"), (_I32, "kv")),
                  "whether query q sees key kv"))),
    Interface(
        "attn_blocks",
        "which key tile an attention core's loader and core take at each step of a work "
        "record: contiguous (step k is key tile k) or read from a block-sparse layout "
        "(FlexAttention's BlockMask)",
        (Function("kv_tile", "pl::attn::KvTile",
                  (("const pl::WorkTile&", "tile"), (_I32, "step")),
                  "the key tile of step `step` (k_begin <= step < k_end) of the record, and "
                  "whether it is known to be fully visible (no per-element mask)"),)),
    Interface(
        "attn_query_tiles",
        "which query tile an attention backward's loader and core take at each step of "
        "a key tile's record: the record's steps walk `slots` per query head "
        "(pl::attn::query_step), and a slot is the query tile itself (contiguous) or "
        "names one from a block-sparse layout (the transposed FlexAttention BlockMask)",
        (Function("q_tile", _I32,
                  (("const pl::WorkTile&", "tile"), (_I32, "head"), (_I32, "slot")),
                  "the query tile (of the backward's tile_q rows) of slot `slot` of query "
                  "head `head` in the record of key tile tile.m_block"),
         Function("contiguous", "bool", (),
                  "whether q_tile() returns the slot unchanged (a constant: after the "
                  "link's LTO a core keeps no mapped tile across steps)"))),
    Interface(
        "attn_documents",
        "where the documents of a varlen attention lie in its packed rows, for a "
        "scheduler's pl::attn::DocumentCursor: offsets (cu_seqlens, FlashAttention's "
        "varlen layout) or a document id per row (FlexAttention's document mask)",
        (Function("count", "uint32_t", (),
                  "the number of documents, or ~0u where only the rows bound them (a "
                  "cursor stops at the first document that begins at the last row)"),
         Function("first", _I32, (("uint32_t", "rows"),),
                  "the row document 0 begins at, in [0, rows] (read only when count() "
                  "> 0)"),
         Function("end", _I32, (("uint32_t", "document"), (_I32, "begin"), ("uint32_t", "rows")),
                  "where document `document`, begun at row `begin`, ends: in [begin, "
                  "rows], whatever the tensor holds (malformed input leaves rows out but "
                  "never addresses outside the tensors)"))),
    Interface(
        "attn_score",
        "a modifier of the scaled attention score before softmax (FlexAttention's "
        "score_mod): returns the new score",
        (Function("score", "float",
                  (("float", "s"), (_I32, "batch"), (_I32, "head"), (_I32, "q"), (_I32, "kv")),
                  "the score of query q and key kv of (batch, head), given the scaled "
                  "dot product s"),
         Function("grad", "float",
                  (("float", "score"), (_I32, "batch"), (_I32, "head"), (_I32, "q"),
                   (_I32, "kv")),
                  "d score / d s where score() returned `score` (a backward core's chain "
                  "rule; tanh soft-capping's is 1 - (score / cap)^2). Given the score, "
                  "not s: a backward core keeps one of the two per element in its "
                  "registers, and the score is the one the softmax needs. Finite "
                  "everywhere, -inf included: the cores multiply it by P, which is 0 "
                  "where an element is masked"),
         Function("identity", "bool", (),
                  "whether score() returns s unchanged (a constant: after the link's LTO "
                  "the core skips the call and folds the softmax scale into its "
                  "exponent, one multiply per score fewer)"))),
)}


def caller_symbol(component: str, port: str, function: str) -> str:
    """The unhashed name a caller's source uses for one function of its in port (and a
    provider's for its out port)."""
    return f"pl_{component}_{port}_{function}"
