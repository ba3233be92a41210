"""The attention forward's query tile on sm_90a: attn_fwd_core runs a consumer
warpgroup per 64 query rows, three (192-row tiles) in the head-dim-64 recipes that set
q_tile 192 (causal, dense, paged and deterministic), two elsewhere. Its scheduler,
loader and store take the same tile; the three consumer warpgroups get 160 registers
each beside a 32-register producer, which fills the register file (beside two the
producer keeps 40); sm_100a keeps 128-row tiles. Nothing here compiles: the real
contracts, the real recipes, the real placer."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelink.check import check
from pipelink.contract import load_contract
from pipelink.place import place
from pipelink.problem import THREADS_PER_WARP, WARPGROUP_WARPS
from pipelink.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"
CORE = ROOT / "components" / "attn_fwd_core" / "contract.yaml"
QUERY_ROWS_PER_WARPGROUP = 64
PRODUCER_REGISTERS = 32
TILED = ("sched", "load", "core", "store")      # the instances that take the query tile
CONSUMERS = "core.mma+store.store"              # the core's warps, its store in them
TURNS = ("core.turn_a", "core.turn_b", "core.turn_c")


def forward_of(name: str, arch: str = "sm_90a"):  # noqa: ANN201
    """The recipe's forward kernel and its instances' contracts, bound."""
    recipe = load_recipe(RECIPES / f"{name}.yaml").kernels()["forward"]
    return recipe, {inst: load_contract(ROOT / "components" / i.component / "contract.yaml")
                    .bind(i.params) for inst, i in recipe.instances(arch).items()}


# (tile_m, head_dim) -> the mma role's registers: S, P, O and addressing, or, with three
# warpgroups, their share of the register file beside the producer: (512 - 32) / 3.
@pytest.mark.parametrize("tile_m,head_dim,registers", [(64, 64, 184), (64, 128, 216),
                                                       (128, 64, 184), (128, 128, 216),
                                                       (192, 64, 160)])
def test_the_consumers_ask_for_at_most_their_share(tile_m, head_dim, registers):
    bound = load_contract(CORE).bind({"tile_m": tile_m, "head_dim": head_dim})
    assert bound.eval(bound.contract.roles["mma"].registers, "roles.mma.registers") == registers


# tile_m -> the producer's registers: 32 beside three consumer warpgroups, which fills
# the register file with theirs; 40 beside two (what the placements measured on the H200
# keep).
@pytest.mark.parametrize("loader", ["attn_loader", "attn_paged_loader"])
@pytest.mark.parametrize("tile_m,registers", [(64, 40), (128, 40), (192, 32)])
def test_the_producer_gives_the_third_consumer_warpgroup_its_registers(loader, tile_m,
                                                                       registers):
    bound = load_contract(ROOT / "components" / loader / "contract.yaml").bind(
        {"tile_m": tile_m})
    assert bound.eval(bound.contract.roles["producer"].registers,
                      "roles.producer.registers") == registers


# recipe -> its forward's query tile on sm_90a (192 where q_tile says so: the head-dim-64
# causal, dense, paged and deterministic recipes; block-sparse stays on the BlockMask's
# 128-row blocks whatever q_tile says).
QUERY_TILES = {"attn_causal": 128, "attn_dense": 128, "attn_paged": 128,
               "attn_sliding": 128, "attn_document": 128, "attn_document_ids": 128,
               "attn_block_sparse": 128, "attn_softcap": 128, "attn_alibi": 128,
               "attn_causal_deterministic": 128, "attn_cp_ring": 128,
               "attn_causal_d64": 192, "attn_dense_d64": 192, "attn_paged_d64": 192,
               "attn_causal_d64_deterministic": 192, "attn_sliding_d64": 128,
               "attn_block_sparse_d64": 128, "attn_document_d64": 128}


def test_every_attention_recipe_is_in_the_table():
    assert sorted(QUERY_TILES) == sorted(p.stem for p in RECIPES.glob("attn_*.yaml"))


@pytest.mark.parametrize("name", sorted(QUERY_TILES))
def test_the_forward_takes_one_query_tile(name):
    """The scheduler, the loader, the core and the store agree on the query tile (a
    scheduler of 128-row tiles feeding a 192-row core would compute the wrong rows):
    q_tile on sm_90a, 128 on sm_100a."""
    for kernel, recipe in load_recipe(RECIPES / f"{name}.yaml").kernels().items():
        if not kernel.startswith("forward"):
            continue
        for arch, tile in (("sm_90a", QUERY_TILES[name]), ("sm_100a", 128)):
            instances = recipe.instances(arch)
            assert {i: instances[i].params["tile_m"] for i in TILED} == \
                dict.fromkeys(TILED, tile), (kernel, arch)


@pytest.mark.parametrize("name", ["attn_causal", "attn_sliding_d64", "attn_causal_d64",
                                  "attn_dense_d64", "attn_paged_d64"])
def test_the_forward_places_a_consumer_warpgroup_per_64_query_rows(name):
    """Three consumer warpgroups of 160 registers and a 32-register producer warpgroup
    fill the 64K register file (4 x 128 threads x 128 at launch); two get 232 each.
    A turn barrier per warpgroup, each with its own id (turn_c, the third's, is not
    placed for two), and the store's barrier spans every consumer."""
    recipe, bound = forward_of(name)
    problem = check(recipe, "sm_90a", bound).problem
    placement = place(problem)
    warpgroups = QUERY_TILES[name] // QUERY_ROWS_PER_WARPGROUP
    producer, consumers = {2: (40, 232), 3: (PRODUCER_REGISTERS, 160)}[warpgroups]
    assert placement.roles[CONSUMERS].warps == warpgroups * WARPGROUP_WARPS
    assert placement.warpgroup_regs == (producer,) + (consumers,) * warpgroups
    turns = TURNS[:warpgroups]
    assert sorted(b for b in placement.barriers if b.startswith("core.")) == sorted(turns)
    assert len({placement.barriers[t] for t in turns}) == len(turns)
    threads = {b.name: b.threads for b in problem.barriers}
    assert threads["store.staged"] == placement.roles[CONSUMERS].warps * THREADS_PER_WARP


# tile_m -> the turn barriers the core places: turn_c only for a third warpgroup (its
# when: tile_m == 192), so with two the barriers placed after it keep their ids.
@pytest.mark.parametrize("tile_m,placed", [(64, ("turn_a", "turn_b")),
                                           (128, ("turn_a", "turn_b")),
                                           (192, ("turn_a", "turn_b", "turn_c"))])
def test_the_core_places_turn_c_for_a_third_warpgroup_only(tile_m, placed):
    bound = load_contract(CORE).bind({"tile_m": tile_m, "head_dim": 64})
    assert tuple(bound.named_barriers()) == placed


@pytest.mark.parametrize("name,store", [("attn_causal", 3), ("attn_sliding_d64", 3),
                                        ("attn_dense_d64", 4)])
def test_the_store_barrier_follows_the_placed_turns(name, store):
    """The ids the forwards measured on the GPU: the store's barrier after two turn
    barriers (three with 192-row tiles)."""
    recipe, bound = forward_of(name)
    assert place(check(recipe, "sm_90a", bound).problem).barriers["store.staged"] == store
