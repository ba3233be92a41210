"""pipelink.block_mask_tensors and what attn_block_sparse's backward reads of a
FlexAttention BlockMask (built here on the CPU): the transposed q_ tensors list, for each
key block, exactly the query blocks whose kv_ rows list that key block, full ones as
full, so walking them (attn_sparse_bwd_scheduler's counts, flex_q_blocks' slots) visits
every (query, key) pair the mask keeps, once."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

import pipelink
from pipelink.errors import RuntimeLaunchError
from pipelink.recipe import load_recipe
from pipelink.runtime.flex import BLOCK_MASK_TENSORS

ROOT = Path(__file__).resolve().parents[2]
BLOCK = 128
TILE_Q = 64                      # the backward's query tile: two per block


def sparse_causal(b, h, q, kv):  # noqa: ANN001, ANN201
    qb, kb = q // BLOCK, kv // BLOCK
    return (q >= kv) & (((qb - kb) % (2 + h) == 0) | (qb - kb == 1))


def listed(num, indices, full_num, full_indices, b: int, h: int, row: int) -> dict[int, bool]:
    """Block -> full? for one row (or column) of a BlockMask's pair of tensors."""
    full = {int(i): True for i in full_indices[b, h, row, :int(full_num[b, h, row])]}
    partial = {int(i): False for i in indices[b, h, row, :int(num[b, h, row])]}
    assert not full.keys() & partial.keys()
    return full | partial


@pytest.mark.parametrize("s,heads", [(700, 1), (1024, 2)])
def test_the_transposed_tensors_list_each_key_blocks_query_blocks(s, heads):
    bm = create_block_mask(sparse_causal, None if heads == 1 else 1, None if heads == 1
                           else heads, s, s, device="cpu")
    t = dict(zip(BLOCK_MASK_TENSORS, pipelink.block_mask_tensors(bm), strict=True))
    blocks = -(-s // BLOCK)
    for h in range(t["kv_num_blocks"].shape[1]):
        rows = {m: listed(t["kv_num_blocks"], t["kv_indices"], t["full_kv_num_blocks"],
                          t["full_kv_indices"], 0, h, m) for m in range(blocks)}
        for n in range(blocks):
            column = listed(t["q_num_blocks"], t["q_indices"], t["full_q_num_blocks"],
                            t["full_q_indices"], 0, h, n)
            assert column == {m: row[n] for m, row in rows.items() if n in row}


def test_walking_the_columns_visits_every_kept_pair_once():
    """flex_q_blocks' slot s of key block n: query tile s % 2 of the (s // 2)-th block
    of the column, full blocks first."""
    s = 900
    bm = create_block_mask(sparse_causal, None, None, s, s, device="cpu")
    t = dict(zip(BLOCK_MASK_TENSORS, pipelink.block_mask_tensors(bm), strict=True))
    at = torch.arange(s)
    keep = sparse_causal(0, 0, at[:, None], at[None, :])
    seen = torch.zeros(s, s, dtype=torch.int32)
    per_block = BLOCK // TILE_Q
    for n in range(-(-s // BLOCK)):
        full = int(t["full_q_num_blocks"][0, 0, n])
        count = full + int(t["q_num_blocks"][0, 0, n])
        for slot in range(count * per_block):
            nth = slot // per_block
            block = int(t["full_q_indices"][0, 0, n, nth] if nth < full
                        else t["q_indices"][0, 0, n, nth - full])
            tile = block * per_block + slot % per_block
            rows, cols = slice(tile * TILE_Q, (tile + 1) * TILE_Q), slice(n * BLOCK,
                                                                          (n + 1) * BLOCK)
            seen[rows, cols] += 1
            if nth < full:          # a full block: every pair kept, no mask asked
                assert bool(keep[rows, cols].all())
    assert bool((seen[keep] == 1).all()), "a kept pair is missed or visited twice"


def test_the_recipe_takes_the_tensors_in_this_order():
    recipe = load_recipe(ROOT / "recipes" / "attn_block_sparse.yaml")
    forward = recipe.select(["forward"])["forward"]
    assert tuple(forward.launch["inputs"]) == ("q", "k", "v", *BLOCK_MASK_TENSORS)
    saved = recipe.data["autograd"]["grads"]["q"]["inputs"]
    assert saved[-4:] == list(BLOCK_MASK_TENSORS[4:])


def test_a_block_mask_without_its_transposed_tensors_is_refused():
    bm = SimpleNamespace(**{name: torch.zeros(1) for name in BLOCK_MASK_TENSORS})
    bm.full_q_indices = None
    with pytest.raises(RuntimeLaunchError, match="has no full_q_indices") as err:
        pipelink.block_mask_tensors(bm)
    assert "create_block_mask" in err.value.hint
