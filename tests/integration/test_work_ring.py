"""Every recipe, linked through the work ring, with real nvcc and nvJitLink (no GPU).

Each recipe in recipes/ links for each arch it names, and nvJitLink's LTO still folds
everything: no entry call and no placement (or work-ring) load in the PTX. The gemm
recipe's linked and monolithic cubins are identical instruction for instruction, and
the ring shows in the SASS as the loads and barriers it should be.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from pipelink.compile import cutlass_include
from pipelink.errors import ToolchainError
from pipelink.problem import WARPGROUP_WARPS
from pipelink.recipe import Recipe, load_recipe

from .sass import sass, sass_instructions

ROOT = Path(__file__).resolve().parents[2]
QUERY_ROWS_PER_WARPGROUP = 64      # attn_fwd_core: a consumer warpgroup per 64 query rows
pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
RECIPES = sorted(p.stem for p in (ROOT / "recipes").glob("*.yaml"))


@functools.cache
def _is_function(component: str) -> bool:
    contract = yaml.safe_load((ROOT / "components" / component / "contract.yaml").read_text())
    return contract.get("kind") == "function"


def _shape(recipe: Recipe, arch: str) -> str:
    """What a kernel's objects and glue come from, less what tests elsewhere cover: its
    non-function instances (component, params, tunables, loop), connections, phases
    and launch form. Kernels that differ only in function components (a mask, a score
    modifier: the forwarders' targets, tests/unit/test_function_ports.py) or in launch
    binds and checks link to the same code, so one of them is linked here; the GPU
    build links each whole."""
    instances = {name: [i.component, i.params, i.tunables, i.loop]
                 for name, i in recipe.instances(arch).items() if not _is_function(i.component)}
    launch = {k: v for k, v in recipe.launch.items() if k not in ("bind", "require", "contents")}
    return json.dumps([instances, [str(c.src) + str(c.dst) for c in recipe.connections],
                       recipe.phases, launch], sort_keys=True)


def _cases() -> list[tuple[str, str, str]]:
    """(recipe, kernel, arch) for each kernel shape: the first recipe to have it, a
    recipe that extends none before those that do (the other tests link those)."""
    seen, out = set(), []
    for name in sorted(RECIPES, key=lambda n: ("extends" in yaml.safe_load(
            (ROOT / "recipes" / f"{n}.yaml").read_text()), n)):
        for kernel, recipe in load_recipe(ROOT / "recipes" / f"{name}.yaml").select(None).items():
            for arch in recipe.archs:
                shape = (arch, _shape(recipe, arch))
                if shape not in seen:
                    seen.add(shape)
                    out.append((name, kernel, arch))
    return out


CASES = _cases()


def _cutlass_missing() -> bool:
    try:
        cutlass_include()
    except ToolchainError:
        return True
    return False


@pytest.fixture(scope="module")
def out(link_repo_kernel):  # noqa: ANN001, ANN201
    return link_repo_kernel       # the session's links: each recipe linked once


def _link(link, name: str, arch: str, mode: str = "linked", kernel: str = "main"):  # noqa: ANN001, ANN202
    if "cute" in name and _cutlass_missing():
        pytest.skip("needs the CUTLASS headers (pip install nvidia-cutlass==4.2.0.0)")
    return link(name, arch, mode, kernel)


@pytest.fixture(scope="module")
def gemm(out) -> dict[str, object]:  # noqa: ANN001
    return {mode: _link(out, "gemm", "sm_90a", mode) for mode in ("linked", "mono")}


@pytest.mark.parametrize("name,kernel,arch", CASES)
def test_every_recipe_links_with_folded_placement(out, name, kernel, arch):
    """Every kernel of every recipe links for every arch it names, and the linker's
    verification (folded placement, barriers, static shared memory, spills) passes."""
    result = _link(out, name, arch, kernel=kernel)
    assert "verify" in result.timings
    ptx = (result.cubin.parent / f"{result.kernel.recipe.name}.ptx").read_text()
    assert not re.search(r"\bcall(\.uni)?\b", ptx)
    assert not re.search(r"\bld\.[^\n]*\bpl_(at|cvt|work)_", ptx)
    rings = [w for w in result.kernel.works if w is not None]   # one per phase with one
    if name == "pipeline_demo":          # no scheduler: one tile per CTA from blockIdx
        assert not rings
        return
    # Every looping lane reads its phase's ring, one arrival per warp: on sm_90a the
    # loader warp and two consumer warpgroups (or two pingpong teams of one; the
    # attention forward one per 64 query rows, three at 192); on sm_100a the loader,
    # the MMA warp and the epilogue warpgroup (the attention backward: the gradient
    # warpgroup and one epilogue warpgroup for dK and dV, a lane); the sm_90a attention
    # backward also its dQ writer warp.
    attention_backward = name.startswith("attn_") and kernel.startswith("backward")
    consumer_warps = 2 * WARPGROUP_WARPS
    if name.startswith("attn_") and kernel.startswith("forward"):
        query_rows = result.kernel.recipe.instances(arch)["core"].params["tile_m"]
        consumer_warps = query_rows // QUERY_ROWS_PER_WARPGROUP * WARPGROUP_WARPS
    sm100_warpgroups = 2 if attention_backward else 1
    for ring in rings:
        assert ring.consumers[0].endswith("load.producer")
        assert ring.arrivals == {"sm_90a": 1 + consumer_warps + attention_backward,
                                 "sm_100a": 1 + 1 + WARPGROUP_WARPS * sm100_warpgroups}[arch]
    # Each ring's trip count is bound once, on its scheduler, where the scheduler takes
    # one (a K-packed grouped schedule reads every problem's k range from its ends, an
    # attention schedule each tile's key range from its mask or BlockMask).
    binds = result.kernel.recipe.launch["bind"]
    counted = [ring for ring in rings
               if any(arg["name"] == "k_tiles" for arg in
                      result.kernel.bound[ring.producer.instance].contract.data["args"])]
    assert sorted(k for k in binds if k.endswith(".k_tiles")) == \
        sorted(f"{ring.producer.instance}.k_tiles" for ring in counted)


def test_gemm_linked_and_monolithic_sass_are_identical(gemm):
    linked = sass_instructions(gemm["linked"].cubin)
    assert linked == sass_instructions(gemm["mono"].cubin)


@pytest.mark.parametrize("name,kernel,exps", [("attn_causal", "forward", 64),
                                              # Three consumer warpgroups (192 rows).
                                              ("attn_causal_d64", "forward", 64),
                                              ("attn_causal", "backward", 32),
                                              ("attn_causal_d64", "backward", 32),
                                              ("attn_block_sparse", "forward", 64),
                                              # Query tiles mapped from a BlockMask.
                                              ("attn_block_sparse", "backward", 32),
                                              # A score modifier's derivative (halves).
                                              ("attn_softcap", "backward", 32),
                                              ("attn_alibi", "backward", 32),
                                              # One staging buffer in the bounded store.
                                              ("attn_document_d64", "forward", 32),
                                              # Documents from ids (attn_documents).
                                              ("attn_document_ids", "backward", 32)])
def test_attention_with_linked_functions_matches_monolithic_sass(out, name, kernel, exps):
    """The mask, score modifier and block layout reach the cores through glue-defined
    forwarders: after LTO nothing of them remains but their inlined code, the same
    instructions a single translation unit gives; the register-A GEMMs read P (and dS)
    from registers."""
    linked, mono = (sass_instructions(_link(out, name, "sm_90a", mode, kernel).cubin)
                    for mode in ("linked", "mono"))
    assert linked == mono
    assert "CALL.REL.NOINC" not in linked and "CALL.ABS.NOINC" not in linked
    assert any(op.startswith("HGMMA") for op in linked) and linked.count("MUFU.EX2") >= exps
    assert not {"LDL", "STL"} & {op.split(".")[0] for op in linked}


@pytest.mark.parametrize("name,prefetches", [("attn_causal", 4), ("attn_causal_d64", 0)])
def test_backward_brings_the_next_records_keys_into_l2_where_one_stage_holds_them(
        out, name, prefetches):
    """With one K/V stage (head dim 128) a record's K and V load only once the last
    record lets go of theirs, so the loader prefetches them into L2 when it reaches the
    record: K and V, two 64-column boxes each. With two stages (head dim 64) the load
    itself starts that early and nothing is prefetched."""
    ops = sass_instructions(_link(out, name, "sm_90a", "linked", "backward").cubin)
    assert ops.count("UTMAPF.L2.3D") == prefetches


@pytest.mark.parametrize("name", ["attn_causal", "attn_causal_d64"])
def test_backward_memory_phases_keep_a_batch_of_loads_in_flight(out, name):
    """attn_bwd_prep and cast_bf16 issue the loads of `batch` vectors (8 on sm_90a, the
    recipe's) before they use the first: prep's O and dO, two 16-byte loads a vector, and
    the cast's two L2 loads (ld.global.cg) of 16 bytes a vector, all unrolled. One
    vector at a time left both phases at about half of DRAM speed."""
    batch = 8
    ops = sass_instructions(_link(out, name, "sm_90a", "linked", "backward").cubin)
    assert ops.count("LDG.E.128") == 2 * batch                 # prep: O and dO
    assert ops.count("LDG.E.128.STRONG.GPU") == 2 * batch      # the cast
    assert not {"LDL", "STL"} & {op.split(".")[0] for op in ops}


def test_where_linked_and_monolithic_sass_differ_the_compile_mode_does(out):
    """attn_sliding's backward is the one kernel whose linked and monolithic SASS differ:
    nvcc's whole-program cubin and the LTO path flatten one masked-probability branch of
    attn_bwd_core apart (docs/recipes/attention.md). The same monolithic unit compiled to
    LTO-IR and finished by nvJitLink gives the linked cubin byte for byte, so nothing of
    PipeLink's glue or split objects is in the difference."""
    linked, mono, mono_lto = (_link(out, "attn_sliding", "sm_90a", mode, "backward")
                              for mode in ("linked", "mono", "mono_lto"))
    assert sass_instructions(linked.cubin) != sass_instructions(mono.cubin)
    assert mono_lto.cubin.read_bytes() == linked.cubin.read_bytes()


def test_gemm_work_ring_in_sass(gemm):
    """The scheduler lane stores a 48-byte record (three 16-byte stores) and arrives on
    full; each consuming warp waits, loads what it reads of it and its first lane
    arrives on empty. Every offset is an immediate."""
    text = sass(gemm["linked"].cubin)
    p = gemm["linked"].placement
    records = p.smem["sched.work.records"][0]
    full = p.smem["sched.mbar.work.full"][0]
    empty = p.smem["sched.mbar.work.empty"][0]
    assert len(re.findall(rf"STS\.128 \[R\d+\+{records:#x}\]", text)) == 1
    assert len(re.findall(rf"STS\.128 \[R\d+\+{records + 16:#x}\]", text)) == 1
    assert len(re.findall(rf"STS\.128 \[R\d+\+{records + 32:#x}\]", text)) == 1
    # Consumers read fields in place: somewhere in the record, at immediate offsets.
    assert re.search(rf"LDS(\.\d+)? R\d+, \[R\d+\+{records:#x}\]", text)
    assert re.search(rf"SYNCS\.ARRIVE\.TRANS64\.A1T0 RZ, \[R\d+\+URZ\+{full:#x}\]", text)
    assert len(re.findall(rf"SYNCS\.ARRIVE\.TRANS64\.A1T0 RZ, \[R\d+\+URZ\+{empty:#x}\]",
                          text)) == 2
    assert "ATOM" not in text            # the static schedule needs no global atomic


def test_gemm_split_k_tail_in_sass(gemm):
    """A piece of a split tile stores its 128 fp32 accumulators per thread as 32 float4
    (L2 only), then one release store sets its flag to the launch token; the last
    piece spins on acquire loads, then reads each other piece's partial as 32 float4
    from L2. Nothing in the workspace needs zeroing (kernel.json lists no counters)."""
    result = gemm["linked"]
    ops = sass_instructions(result.cubin)
    assert ops.count("STG.E.128.STRONG.GPU") == 32
    assert ops.count("LDG.E.128.STRONG.GPU") == 32
    assert "MEMBAR.ALL.GPU" in ops and ops.count("STG.E.64.STRONG.GPU") == 1
    meta = json.loads(result.kernel_json.read_text())
    partials = result.kernel.workspace["sched.scratch.partials"]
    flags = result.kernel.workspace["sched.scratch.flags"]
    assert meta["workspace"]["counters"] == []
    assert partials.slot_bytes == 160 * 128 * 256 * 4 and flags.slot_bytes >= 160 * 8
    assert meta["workspace"]["bytes"] >= flags.slot_offset + flags.slot_bytes
    assert [f["name"] for f in meta["params"]["fields"][-2:]] == ["workspace", "launch"]
