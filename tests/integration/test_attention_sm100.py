"""The attention forward on Blackwell (sm_100a) with real nvcc and nvJitLink, no GPU
needed: the attention recipes pick attn_fwd_umma_core (an MMA warp and a softmax
warpgroup meeting in Tensor Memory) and attn_row_store_epilogue for sm_100a and keep
the wgmma core for sm_90a (attn_document's bounded store: grouped_row_store_epilogue);
their backward kernels build for sm_100a too, at head dims 64 and 128
(attn_bwd_umma_core, dK's and dV's epilogues in one warpgroup; for documents the bounded
tmem_grouped_store_epilogue). Linked, the
kernel issues S = Q K^T from shared memory and P V with P read from Tensor Memory, moves
S, P and O between Tensor Memory and registers, stays out of local memory, is the
monolithic build's instruction for instruction, and the core's object is one file for
every mask and score modifier."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from pipelink.build import build_objects, default_index
from pipelink.recipe import load_recipe

from .sass import sass, sass_instructions

ROOT = Path(__file__).resolve().parents[2]
ARCH = "sm_100a"
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")

# recipe -> its forward's store on sm_90a and on sm_100a
STORES = {name: ("attn_store_epilogue", "attn_row_store_epilogue")
          for name in ("attn_causal", "attn_dense", "attn_sliding", "attn_softcap",
                       "attn_alibi", "attn_block_sparse", "attn_paged", "attn_causal_d64")}
STORES["attn_document"] = STORES["attn_document_d64"] = ("grouped_store_epilogue",
                                                         "grouped_row_store_epilogue")
TILE_N = 128                    # the recipes' key tile
TILE_M_SM100 = 128              # attn_fwd_umma_core's query tile: M = 128
QUERY_TILES_SM90 = {"attn_causal_d64": 192}   # other than 128 (attn_causal's q_tile)
MMA_K = 16                      # one tcgen05.mma: K = 16 (bf16)
HEAD_DIMS = {"attn_causal": 128, "attn_causal_d64": 64, "attn_document": 128}


def _idesc(n: int, mn_major_b: bool) -> int:
    """PTX ISA, tcgen05 "Instruction descriptor" (.kind::f16): D f32, A and B bf16, M =
    128, A K-major, B K-major or MN-major (bit 16), N >> 3 at bit 17, M >> 4 at bit 24."""
    return (1 << 4) | (1 << 7) | (1 << 10) | (int(mn_major_b) << 16) | ((n >> 3) << 17) \
        | ((128 >> 4) << 24)


# -- recipes (no compiler) ---------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(STORES))
def test_forward_picks_the_tcgen05_core_on_sm100(name):
    recipe = load_recipe(ROOT / "recipes" / f"{name}.yaml")
    assert recipe.archs == ("sm_90a", "sm_100a")
    forward = recipe.select(["forward"])["forward"]
    hopper, blackwell = forward.instances("sm_90a"), forward.instances(ARCH)
    assert (hopper["core"].component, blackwell["core"].component) == ("attn_fwd_core",
                                                                       "attn_fwd_umma_core")
    assert (hopper["store"].component, blackwell["store"].component) == STORES[name]
    # The same core params but the query tile: 192 rows (three consumer warpgroups) in
    # attn_causal_d64 on sm_90a, 128 (Tensor Memory's lanes) on sm_100a.
    assert {**hopper["core"].params, "tile_m": 128} == blackwell["core"].params
    assert hopper["core"].params["tile_m"] == QUERY_TILES_SM90.get(name, TILE_M_SM100)
    # Everything but the core and its store is the same component on both archs.
    assert {n: i.component for n, i in hopper.items() if n not in ("core", "store")} == \
        {n: i.component for n, i in blackwell.items() if n not in ("core", "store")}


# Every attention recipe with a backward builds it for sm_100a too (attn_bwd_umma_core
# at head dims 64 and 128) -> its dK and dV stores on sm_90a and on sm_100a.
GRAD_STORES = {name: ("attn_store_epilogue", "attn_tmem_store_epilogue")
               for name in ("attn_causal", "attn_causal_deterministic", "attn_dense",
                            "attn_sliding", "attn_block_sparse", "attn_softcap", "attn_alibi",
                            "attn_causal_d64", "attn_dense_d64", "attn_sliding_d64",
                            "attn_causal_d64_deterministic", "attn_block_sparse_d64")}
for _name in ("attn_document", "attn_document_d64", "attn_document_ids"):
    GRAD_STORES[_name] = ("grouped_store_epilogue", "tmem_grouped_store_epilogue")


@pytest.mark.parametrize("name", sorted(GRAD_STORES))
def test_backward_picks_the_tcgen05_core_on_sm100(name):
    recipe = load_recipe(ROOT / "recipes" / f"{name}.yaml")
    backward = recipe.select(["backward"])["backward"]
    assert backward.archs == ("sm_90a", "sm_100a")
    assert list(recipe.select(None, ARCH)) == ["forward", "backward"]
    assert recipe.elsewhere(ARCH) == {}
    hopper, blackwell = backward.instances("sm_90a"), backward.instances(ARCH)
    assert (hopper["core"].component, blackwell["core"].component) == ("attn_bwd_core",
                                                                       "attn_bwd_umma_core")
    assert hopper["core"].params == blackwell["core"].params
    for store in ("dk_store", "dv_store"):
        assert (hopper[store].component, blackwell[store].component) == GRAD_STORES[name]
    # dV's store runs in dK's warpgroup: a warpgroup each would leave the MMA warp and
    # the gradient warpgroup too few registers.
    assert blackwell["dv_store"].lane == "dk_store"


def test_documents_store_within_each_document_on_both_archs():
    """attn_document's own per_arch choice of store replaces attn_causal's whole, forward
    and backward: O, dK and dV stop at each document's last row on both archs."""
    recipe = load_recipe(ROOT / "recipes" / "attn_document.yaml")
    assert recipe.archs == ("sm_90a", "sm_100a")
    backward = recipe.select(["backward"])["backward"]
    assert backward.archs == ("sm_90a", "sm_100a")
    for arch, store in (("sm_90a", "grouped_store_epilogue"),
                        (ARCH, "tmem_grouped_store_epilogue")):
        stores = {i.component for n, i in backward.instances(arch).items() if "store" in n}
        assert stores == {store}
        # The core's one dK and one dV buffer.
        assert all(i.params.get("acc_stages", 1) == 1
                   for n, i in backward.instances(arch).items() if "store" in n)


# -- built, linked, disassembled -----------------------------------------------------------

@pytest.fixture(scope="module")
def linked(link_repo_kernel) -> dict[tuple[str, str], object]:  # noqa: ANN001
    """(recipe, mode) -> the forward's LinkResult for sm_100a."""
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    return {(name, mode): link_repo_kernel(name, ARCH, mode, "forward")
            for name in HEAD_DIMS for mode in ("linked", "mono")}


@needs_nvcc
@pytest.mark.parametrize("name", sorted(HEAD_DIMS))
def test_tensor_memory_holds_s_p_and_o(linked, name):
    """Two S buffers (fp32), two P buffers (bf16 pairs) and O, allocated by the MMA warp;
    the softmax warpgroup and the store share warps through O's register hand-off."""
    result = linked[(name, "linked")]
    head_dim = HEAD_DIMS[name]
    tmem = result.placement.tmem
    assert {k: v[1] for k, v in tmem.items()} == {"core.s": 2 * TILE_N, "core.p": TILE_N,
                                                  "core.o": head_dim}
    spans = sorted((col, col + n) for col, n in tmem.values())
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
    lanes = {lane.name for lane in result.kernel.lanes}
    assert {"core.mma", "core.softmax+store.store"} <= lanes
    transfers = {(t.kind, str(t.src), str(t.dst)) for t in result.kernel.transfers}
    assert ("registers", "core.o", "store.acc") in transfers


@needs_nvcc
@pytest.mark.parametrize("name", sorted(HEAD_DIMS))
def test_sass_runs_both_gemms_on_tcgen05(linked, name):
    result = linked[(name, "linked")]
    head_dim = HEAD_DIMS[name]
    ops = sass_instructions(result.cubin)
    assert not [op for op in ops if "GMMA" in op or op.startswith("WARPGROUP")]
    assert not {"LDL", "STL"} & {op.split(".")[0] for op in ops}
    text = sass(result.cubin)
    # S = Q K^T: A and B from shared memory (descriptors), head_dim / 16 MMAs. P V: A (P)
    # from Tensor Memory, B (V) from shared memory; issued from two places (inside the
    # key loop, and the record's last), tile_n / 16 MMAs each.
    from_smem = re.findall(r"UTCHMMA gdesc\[UR\d+\], gdesc\[", text)
    from_tmem = re.findall(r"UTCHMMA tmem\[UR\d+\], gdesc\[", text)
    assert len(from_smem) == head_dim // MMA_K
    assert len(from_tmem) == 2 * (TILE_N // MMA_K)
    for n, mn_major in ((TILE_N, False), (head_dim, True)):
        idesc = _idesc(n, mn_major)
        assert re.search(rf"\bUMOV UR\d+, {idesc:#x} ;", text), f"idesc {idesc:#x} not found"
    # S read back 64 columns at a time, P written 32 at a time; O read (rescale, finish)
    # and written (rescale).
    loads = [op for op in ops if op.startswith("LDTM")]
    stores = [op for op in ops if op.startswith("STTM")]
    assert set(loads) == {"LDTM.x64"} and set(stores) == {"STTM.x32"}
    assert len(loads) == TILE_N // 64 + 2 * (head_dim // 64)
    assert len(stores) == TILE_N // 64 + 2 * (head_dim // 64)


@needs_nvcc
@pytest.mark.parametrize("name", sorted(HEAD_DIMS))
def test_linked_and_monolithic_sass_are_identical(linked, name):
    assert sass_instructions(linked[(name, "linked")].cubin) == \
        sass_instructions(linked[(name, "mono")].cubin)


@needs_nvcc
def test_the_core_object_is_shared_by_every_mask(object_dir):
    """The mask, score modifier and block layout are linked in: the core compiles once
    for every recipe of one head dim."""
    index = default_index(ROOT)
    cores = {name: build_objects(load_recipe(ROOT / "recipes" / f"{name}.yaml")
                                 .select(["forward"])["forward"], ARCH, index,
                                 object_dir)["core"]
             for name in ("attn_causal", "attn_softcap", "attn_block_sparse", "attn_paged",
                          "attn_document")}
    assert len(set(cores.values())) == 1, cores


@needs_nvcc
def test_check_says_where_backpropagation_is_refused(object_dir, tmp_path, monkeypatch,
                                                     capsys):
    """A recipe that builds its backward for sm_90a only (every attention recipe here
    builds both; this one is attn_causal so written): `pipelink check` on sm_100a checks
    its forward only and says that its backward is built for sm_90a; asking for the
    backward there is refused, naming its archs."""
    from pipelink import cli
    shutil.copy(ROOT / "recipes" / "attn_causal.yaml", tmp_path)
    recipe = tmp_path / "attn_causal_hopper_grads.yaml"
    recipe.write_text("recipe: attn_causal_hopper_grads\nextends: attn_causal\n"
                      "kernels:\n  backward:\n    arch: [sm_90a]\n")
    monkeypatch.chdir(ROOT)                  # the components pipelink check indexes
    assert cli.main(["check", str(recipe), "--arch", ARCH, "--build", str(object_dir)]) == 0
    out = capsys.readouterr().out
    assert [line.split(" ")[0] for line in out.splitlines()] == [
        "attn_causal_hopper_grads/forward", "attn_causal_hopper_grads"]
    assert "backward is built for sm_90a only: backpropagation is refused on sm_100a" in out
    assert cli.main(["check", str(recipe), "--arch", ARCH, "--build", str(object_dir),
                     "--kernel", "backward"]) == 2
    err = capsys.readouterr().err
    assert "kernel 'backward' of recipe 'attn_causal_hopper_grads' is not built for " \
        "sm_100a" in err
    assert "it builds for sm_90a" in err and "Traceback" not in err


# -- the backward, linked ----------------------------------------------------------------

TILE_Q = 64                     # attn_bwd_umma_core's queries per step
BWD_HEAD_DIMS = {"attn_causal": 128, "attn_causal_d64": 64}


def _idesc_bwd(m: int, n: int, mn_major_a: bool, mn_major_b: bool) -> int:
    """As _idesc, with M and both operands' majorness given."""
    return (1 << 4) | (1 << 7) | (1 << 10) | (int(mn_major_a) << 15) | \
        (int(mn_major_b) << 16) | ((n >> 3) << 17) | ((m >> 4) << 24)


@pytest.fixture(scope="module")
def backward(link_repo_kernel) -> dict[tuple[str, str], object]:  # noqa: ANN001
    """(recipe, mode) -> the backward's LinkResult for sm_100a, at head dims 128 and 64."""
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    return {(name, mode): link_repo_kernel(name, ARCH, mode, "backward")
            for name in BWD_HEAD_DIMS for mode in ("linked", "mono")}


@needs_nvcc
@pytest.mark.parametrize("name", sorted(BWD_HEAD_DIMS))
def test_backward_tensor_memory_and_lanes(backward, name):
    """S^T, dP^T, P^T, dS^T and dQ^T (one step each) beside dK and dV (the record's),
    within the 512 columns (all of them at head dim 128); dK and dV go to their
    epilogues through Tensor Memory."""
    result = backward[(name, "linked")]
    head_dim = BWD_HEAD_DIMS[name]
    tmem = {k: v[1] for k, v in result.placement.tmem.items()}
    assert tmem == {"core.s": TILE_Q, "core.dp": TILE_Q, "core.p": TILE_Q // 2,
                    "core.ds": TILE_Q // 2, "core.dq": TILE_Q, "core.dk": head_dim,
                    "core.dv": head_dim}
    spans = sorted((col, col + n) for col, n in result.placement.tmem.values())
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert spans[-1][1] <= 512
    transfers = {(t.kind, str(t.src), str(t.dst)) for t in result.kernel.transfers}
    assert {("zero_copy", "core.dk", "dk_store.acc"),
            ("zero_copy", "core.dv", "dv_store.acc")} <= transfers
    # One warpgroup stores both (the recipe's lane:), so three warpgroups share the
    # registers: the MMA warp's, the gradient warpgroup and the epilogue.
    lanes = {lane.name: lane for lane in result.kernel.lanes}
    assert "dk_store.store+dv_store.store" in lanes
    assert len(result.placement.warpgroup_regs) == 3


@needs_nvcc
@pytest.mark.parametrize("name", ["attn_dense", "attn_softcap", "attn_alibi", "attn_dense_d64",
                                  "attn_sliding_d64"])
def test_backwards_that_need_the_registers_link_without_spills(link_repo_kernel, name):
    """no_mask's longer per-row work, or a score modifier's score and derivative per
    element, on the gradient warpgroup's row: with dK and dV stored from one warpgroup it
    has the registers (216) for them, and the linked kernel stays out of local memory. At
    head dim 64 no_mask's and the sliding window's gradient warpgroup left no register
    for the thread index every role keeps, which spilled, until it wrote each half row's
    P^T and dS^T out before reading the next."""
    linked, mono = (link_repo_kernel(name, ARCH, mode, "backward") for mode in ("linked", "mono"))
    ops = sass_instructions(linked.cubin)
    assert not {"LDL", "STL"} & {op.split(".")[0] for op in ops}
    assert ops == sass_instructions(mono.cubin)


@needs_nvcc
@pytest.mark.parametrize("name", sorted(BWD_HEAD_DIMS))
def test_backward_sass_runs_every_gemm_on_tcgen05(backward, name):
    """dQ^T = K^T dS^T is an M = head_dim MMA: at head dim 64 an M = 64 one, whose rows
    sit in lanes 0-15 of each sub-partition (the core reads them so)."""
    result = backward[(name, "linked")]
    head_dim = BWD_HEAD_DIMS[name]
    ops = sass_instructions(result.cubin)
    assert not [op for op in ops if "GMMA" in op or op.startswith("WARPGROUP")]
    assert not {"LDL", "STL"} & {op.split(".")[0] for op in ops}
    text = sass(result.cubin)
    # S^T and dP^T (head_dim / 16 each) and dQ^T (tile_n / 16) from shared memory; dV and
    # dK (tile_q / 16 each) with P^T and dS^T from Tensor Memory.
    assert len(re.findall(r"UTCHMMA gdesc\[UR\d+\], gdesc\[", text)) == \
        2 * (head_dim // MMA_K) + TILE_N // MMA_K
    assert len(re.findall(r"UTCHMMA tmem\[UR\d+\], gdesc\[", text)) == 2 * (TILE_Q // MMA_K)
    for m, n, a, b in ((TILE_N, TILE_Q, False, False), (TILE_N, head_dim, False, True),
                       (head_dim, TILE_Q, True, True)):
        idesc = _idesc_bwd(m, n, a, b)
        assert re.search(rf"\bUMOV UR\d+, {idesc:#x} ;", text), f"idesc {idesc:#x} not found"
    assert sass_instructions(backward[(name, "mono")].cubin) == ops


@needs_nvcc
@pytest.mark.parametrize("name", ["attn_document", "attn_document_d64"])
def test_document_backward_stores_grads_within_each_document(link_repo_kernel, name):
    """Documents end anywhere, so dK and dV leave Tensor Memory through the bounded
    store (16-byte global stores below the record's m_end), not a TMA box: the linked
    backward issues no TMA store, hands dK and dV over in Tensor Memory to one
    warpgroup, stays out of local memory and is the monolithic build's SASS."""
    linked, mono = (link_repo_kernel(name, ARCH, mode, "backward") for mode in ("linked", "mono"))
    transfers = {(t.kind, str(t.src), str(t.dst)) for t in linked.kernel.transfers}
    assert {("zero_copy", "core.dk", "dk_store.acc"),
            ("zero_copy", "core.dv", "dv_store.acc")} <= transfers
    assert "dk_store.store+dv_store.store" in {lane.name for lane in linked.kernel.lanes}
    ops = sass_instructions(linked.cubin)
    assert not [op for op in ops if op.startswith("UTMASTG")]
    assert any(op.startswith("STG.E.128") for op in ops)
    assert not {"LDL", "STL"} & {op.split(".")[0] for op in ops}
    assert ops == sass_instructions(mono.cubin)
