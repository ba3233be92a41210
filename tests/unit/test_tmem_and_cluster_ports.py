"""Ports that span Tensor Memory and thread-block clusters: the tmem port kind
(accumulators handed from an MMA warp to epilogue warps through Tensor Memory, sm_100a),
CTA-pair MMAs (cta_group::2 in a cluster of two) and multicast rings (a stage filled by
a TMA multicast across a CTA pair). The real recipes' contracts are checked without a
compiler; each broken variant must be refused naming the file or instance and what to
change."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipelink.check import check, tmem_cta_group
from pipelink.contract import load_contract
from pipelink.errors import CheckError, ContractError, PipeLinkError
from pipelink.link import place_kernel
from pipelink.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2]
ARCH = "sm_100a"
COMPONENTS = ("splitk_scheduler", "tma_loader", "umma_mainloop", "tmem_store_epilogue")
PAIR_COMPONENTS = ("tile_scheduler", "tma_pair_loader", "umma_mainloop",
                   "tmem_store_epilogue")


def _tree(tmp_path: Path, edit_contract: dict[str, Any] | None = None,
          edit_recipe: Any = None, recipe: str = "gemm",
          components: tuple[str, ...] = COMPONENTS) -> tuple[Any, dict[str, Any]]:
    """A recipe and its sm_100a contracts, copied into tmp_path and edited."""
    contracts = {}
    for name in components:
        data = yaml.safe_load((ROOT / "components" / name / "contract.yaml").read_text())
        for key, change in (edit_contract or {}).get(name, {}).items():
            change(data) if callable(change) else data.__setitem__(key, change)
        folder = tmp_path / "components" / name
        folder.mkdir(parents=True)
        (folder / "contract.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
        contracts[name] = folder / "contract.yaml"
    data = yaml.safe_load((ROOT / "recipes" / f"{recipe}.yaml").read_text())
    if edit_recipe:
        edit_recipe(data)
    (tmp_path / "recipes").mkdir()
    path = tmp_path / "recipes" / f"{recipe}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_recipe(path), contracts


def _check(tmp_path: Path, arch: str = ARCH, **edits: Any):  # noqa: ANN202
    recipe, contracts = _tree(tmp_path, **edits)
    bound = {inst: load_contract(contracts[i.component]).bind(i.params)
             for inst, i in recipe.instances(arch).items()}
    return check(recipe, arch, bound)


def test_gemm_hands_the_accumulator_through_tensor_memory(tmp_path):
    kernel = _check(tmp_path)
    acc = [t for t in kernel.transfers if str(t.dst) == "store.acc"]
    assert [(t.kind, str(t.src)) for t in acc] == [("zero_copy", "mma.acc")]
    assert kernel.tmem_allocator == ("mma", "mma")
    placement = place_kernel(kernel, 1)
    # Two 256-column accumulator buffers: all of Tensor Memory, placed from column 0.
    assert placement.tmem == {"mma.acc": (0, 512)}


def test_tmem_port_on_an_arch_without_tensor_memory_is_refused(tmp_path):
    with pytest.raises(ContractError) as e:
        _check(tmp_path, edit_contract={"tmem_store_epilogue": {"arch": ["sm_90a", "sm_100a"]}})
    text = e.value.render()
    assert "tmem port 'acc'" in text and "sm_90a" in text and "tmem_store_epilogue" in text
    assert "per_arch" in text


def test_tensor_memory_over_512_columns_is_refused(tmp_path):
    def three_buffers(r: dict[str, Any]) -> None:
        r["instances"]["mma"]["params"]["acc_stages"] = 3
        r["instances"]["store"]["params"]["acc_stages"] = 3
    with pytest.raises(PipeLinkError) as e:
        _check(tmp_path, edit_recipe=three_buffers)
    text = e.value.render()
    assert "512" in text and "umma_mainloop" in text and "tmem.acc" in text


def test_buffer_counts_must_agree(tmp_path):
    def one_buffer_at_the_epilogue(r: dict[str, Any]) -> None:
        r["instances"]["store"]["params"]["acc_stages"] = 1
    with pytest.raises(CheckError) as e:
        _check(tmp_path, edit_recipe=one_buffer_at_the_epilogue)
    text = e.value.render()
    assert "'mma.acc'" in text and "'store.acc'" in text and "stages" in text


def test_layouts_must_agree(tmp_path):
    def other_layout(c: dict[str, Any]) -> None:
        c["ports"]["acc"]["layout"] = "tmem_f32_m64_interleaved"
    with pytest.raises(CheckError) as e:
        _check(tmp_path, edit_contract={"tmem_store_epilogue": {"ports": other_layout}})
    text = e.value.render()
    assert "layout" in text and "Tensor Memory is read where the MMA wrote it" in text


def test_buffer_columns_must_hold_the_stages(tmp_path):
    def narrow(c: dict[str, Any]) -> None:
        c["tmem"]["acc"]["columns"] = "tile_n"
    with pytest.raises(CheckError) as e:
        _check(tmp_path, edit_contract={"umma_mainloop": {"tmem": narrow}})
    text = e.value.render()
    assert "tmem.acc" in text and "acc_stages * tile_n" in text.replace("'", "")


def test_someone_must_allocate_tensor_memory(tmp_path):
    def no_alloc(c: dict[str, Any]) -> None:
        c["roles"]["mma"]["uses"] = ["tcgen05"]
    with pytest.raises(CheckError) as e:
        _check(tmp_path, edit_contract={"umma_mainloop": {"roles": no_alloc}})
    assert "no role allocates" in e.value.render()
    assert "tmem_alloc" in e.value.render()


def test_tensor_memory_is_allocated_once(tmp_path):
    def also_alloc(c: dict[str, Any]) -> None:
        c["roles"]["store"]["uses"] = ["tmem_load", "tmem_alloc"]
    with pytest.raises(CheckError) as e:
        _check(tmp_path, edit_contract={"tmem_store_epilogue": {"roles": also_alloc}})
    text = e.value.render()
    assert re.search(r"mma\.mma, store\.store all say uses: \[tmem_alloc\]", text), text


def _tile_n(n: int):  # noqa: ANN202
    """A recipe edit: every instance of the GEMM on n-column tiles."""
    def edit(r: dict[str, Any]) -> None:
        for inst in ("sched", "load", "mma", "store"):
            r["instances"][inst].setdefault("params", {})["tile_n"] = n
        if n % 3 == 0:      # three store chunks: the staging buffers must divide them
            r["instances"]["store"]["params"]["buffers"] = 3
    return edit


def test_accumulator_slots_round_up_to_a_power_of_two(tmp_path):
    # 192-column tiles: two 256-column slots (Tensor Memory is allocated in powers of two).
    placement = place_kernel(_check(tmp_path, edit_recipe=_tile_n(192)), 1)
    assert placement.tmem == {"mma.acc": (0, 512)}


def test_tmem_allocation_not_a_power_of_two_is_refused_by_the_checker(tmp_path):
    # 2 x 192 columns: the checker refuses it, naming the contract, before any placement.
    def unrounded(c: dict[str, Any]) -> None:
        c["tmem"]["acc"]["columns"] = "acc_stages * tile_n"
    with pytest.raises(CheckError) as e:
        _check(tmp_path, edit_recipe=_tile_n(192),
               edit_contract={"umma_mainloop": {"tmem": unrounded}})
    text = e.value.render()
    assert "tensor memory 'mma.acc' (umma_mainloop) is 384 columns" in text, text
    assert "powers of two of at least 32" in text and "pow2_ceil(acc_stages * tile_n)" in text


def test_tmem_buffer_narrower_than_its_tiles_is_refused(tmp_path):
    def narrow(c: dict[str, Any]) -> None:
        c["tmem"]["acc"]["columns"] = "acc_stages * tile_n // 2"
    with pytest.raises(CheckError) as e:
        _check(tmp_path, edit_contract={"umma_mainloop": {"tmem": narrow}})
    text = e.value.render()
    assert "holds acc_stages buffers of tile_n columns" in text, text
    assert "make tmem.acc.columns acc_stages * tile_n" in text, text


def test_tmem_port_names_a_tmem_buffer(tmp_path):
    def smem_buffer(c: dict[str, Any]) -> None:
        c["ports"]["acc"]["buffer"] = "nothing_here"
    with pytest.raises(ContractError) as e:
        _check(tmp_path, edit_contract={"umma_mainloop": {"ports": smem_buffer}})
    assert "not under tmem" in e.value.render()


# -- CTA pairs (cta_group::2) -----------------------------------------------------------------

def _pair(tmp_path: Path, **edits: Any):  # noqa: ANN202
    return _check(tmp_path, recipe="gemm_pair", components=PAIR_COMPONENTS, **edits)


def test_cta_pair_recipe_checks_with_its_cluster(tmp_path):
    kernel = _pair(tmp_path)
    assert tmem_cta_group(kernel.bound) == 2
    assert kernel.recipe.launch["cluster"] == [2, 1, 1]
    acc = [t for t in kernel.transfers if str(t.dst) == "store.acc"]
    assert [(t.kind, str(t.src)) for t in acc] == [("zero_copy", "mma.acc")]


def test_cta_pair_mma_without_a_cluster_of_two_is_refused(tmp_path):
    def no_cluster(r: dict[str, Any]) -> None:
        del r["launch"]["cluster"]
    with pytest.raises(CheckError) as e:
        _pair(tmp_path, edit_recipe=no_cluster)
    text = e.value.render()
    assert "mma.acc is a CTA pair's Tensor Memory (a 2-CTA MMA)" in text
    assert "needs a cluster of 2 CTAs" in text and "cluster: [2, 1, 1]" in text
    # ... and the components that state their cluster say so by name.
    assert "mma (umma_mainloop) runs in a cluster of [2, 1, 1]" in text


def test_cta_pair_mma_in_a_cluster_of_four_is_refused(tmp_path):
    def four(r: dict[str, Any]) -> None:
        r["launch"]["cluster"] = [4, 1, 1]
    with pytest.raises(CheckError) as e:
        _pair(tmp_path, edit_recipe=four)
    text = e.value.render()
    assert "cluster shapes disagree: launch.cluster [4, 1, 1], load [2, 1, 1], mma [2, 1, 1]" \
        in text


def test_cta_pair_buffers_read_as_one_cta_are_refused(tmp_path):
    def single(r: dict[str, Any]) -> None:
        r["instances"]["store"]["params"]["cta_group"] = 1
    with pytest.raises(CheckError) as e:
        _pair(tmp_path, edit_recipe=single)
    text = e.value.render()
    assert "cta_group" in text and "'mma.acc'" in text and "'store.acc'" in text


def test_clustered_grid_is_whole_clusters():
    from pipelink.runtime.spec import LaunchSpec
    meta = {"launch": {"persistent": True}, "params": {"fields": []}, "cluster": [2, 1, 1]}
    assert LaunchSpec.from_meta(meta).grid_for({}, 133) == [132]
    meta["launch"] = {"grid": [5]}
    assert LaunchSpec.from_meta(meta).grid_for({}, 132) == [6]


# -- multicast rings (sm_90a) ----------------------------------------------------------------

MULTICAST_COMPONENTS = ("tile_scheduler", "tma_multicast_loader", "wgmma_mainloop",
                        "store_epilogue")


def _multicast(tmp_path: Path, **edits: Any):  # noqa: ANN202
    return _check(tmp_path, arch="sm_90a", recipe="gemm_multicast",
                  components=MULTICAST_COMPONENTS, **edits)


def test_multicast_ring_is_released_by_both_ctas(tmp_path):
    kernel = _multicast(tmp_path)
    assert kernel.recipe.launch["cluster"] == [2, 1, 1]
    b = kernel.bound["mma"].contract.ports["b"].spec
    assert kernel.bound["mma"].eval(b["multicast"], "multicast") == 2


def test_multicast_ring_read_by_one_cta_is_refused(tmp_path):
    def one_cta(r: dict[str, Any]) -> None:
        r["instances"]["mma"]["params"]["multicast_b"] = 1
    with pytest.raises(CheckError) as e:
        _multicast(tmp_path, edit_recipe=one_cta)
    text = e.value.render()
    assert "'load.b'" in text and "'mma.b'" in text and "multicast" in text
    assert "released in every CTA it reached" in text


def test_unchanged_copy_is_not_edited_in_place():
    # The edits above work on copies: the shipped contract still says two buffers.
    data = yaml.safe_load((ROOT / "components" / "umma_mainloop" / "contract.yaml").read_text())
    assert copy.deepcopy(data)["params"]["acc_stages"] == 2
