"""Reading PTX for verification (barrier ids, thread counts, static shared memory, entry
calls LTO left), and naming an entry an object lacks at link time."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelink.check import Kernel, check
from pipelink.contract import load_contract
from pipelink.errors import LinkError, ToolchainError
from pipelink.link import unresolved_symbol
from pipelink.recipe import load_recipe
from pipelink.verify import PtxasReport, parse_ptx, verify_folded

ROOT = Path(__file__).resolve().parents[2]


def _module(body: str, decls: str = "") -> str:
    return (f".version 9.0\n.target sm_90a\n{decls}\n.func pl_x_main(\n\t.param .b64 p\n)\n"
            "{\n" + body + "\n}\n")


# (PTX body, expected (id, threads, whole block) of each named-barrier instruction)
BARRIERS = [
    ("\tbar.sync \t0;", [(0, None, True)]),
    ("\tbar.sync 13, 64;", [(13, 64, False)]),
    ("\tbarrier.sync.aligned 0x3, 256;", [(3, 256, False)]),
    ("\tbar.arrive 2, 128;", [(2, 128, False)]),
    ("\tmov.u32 \t%r1, 13;\n\tmov.u32 \t%r2, 64;\n\tbar.sync %r1, %r2;", [(13, 64, False)]),
    ("\tld.u32 \t%r1, [%rd1];\n\tbar.sync %r1, 128;", [(None, 128, False)]),
    ("\tmov.u32 \t%r1, 1;\n\tadd.s32 \t%r1, %r1, 1;\n\tbar.sync %r1, 128;", [(None, 128, False)]),
    ("\tbar.red.popc.u32 %r3, 5, 96, %p1;", [(5, 96, False)]),
    ("\t@%p1 bar.cta.sync 7, 32;", [(7, 32, False)]),
    ("\tbar.warp.sync \t-1;\n\tmbarrier.arrive.shared::cta.b64 %rd1, [%r1];", []),
]


@pytest.mark.parametrize("body,expected", BARRIERS)
def test_barrier_ids_and_counts(body, expected):
    uses = parse_ptx(_module(body)).functions["pl_x_main"].barriers
    assert [(u.id, u.threads, u.all_threads) for u in uses] == expected


SHARED = [
    (".shared .align 4 .b8 _ZZ1fE7scratch[21504];", {"_ZZ1fE7scratch": 21504}),
    (".shared .align 16 .f32 tile[32][33];", {"tile": 4224}),
    (".shared .u64 flag;", {"flag": 8}),
    (".extern .shared .align 1024 .b8 _ZN2pl15pl_dynamic_smemE[];", {}),
]


@pytest.mark.parametrize("decl,expected", SHARED)
def test_static_shared_sizes_and_owners(decl, expected):
    name = next(iter(expected), "_ZN2pl15pl_dynamic_smemE")
    module = parse_ptx(_module(f"\tmov.u32 %r1, {name};", decl))
    assert module.shared == expected
    assert module.shared_of(module.reachable(["pl_x_main"])) == expected


def test_prototypes_are_not_functions_and_calls_are_followed():
    ptx = (".func helper\n(\n\t.param .b32 a\n)\n;\n"
           ".shared .align 4 .b8 buf[64];\n"
           ".func pl_x_main()\n{\n\tcall.uni helper, (%r1);\n}\n"
           ".func helper(\n\t.param .b32 a\n)\n{\n\tst.shared.u32 [buf], 1;\n\tbar.sync 9;\n}\n")
    module = parse_ptx(ptx)
    assert sorted(module.functions) == ["helper", "pl_x_main"]
    assert module.reachable(["pl_x_main"]) == {"pl_x_main", "helper"}
    assert module.shared_of(["pl_x_main", "helper"]) == {"buf": 64}


def test_ptxas_report():
    log = ("ptxas info    : Compiling entry function 'pl_pair' for 'sm_90a'\n"
           "ptxas         .     216 bytes stack frame, 212 bytes spill stores, "
           "208 bytes spill loads\n"
           "ptxas info    : Used 255 registers, used 1 barriers, 21504 bytes smem\n")
    assert PtxasReport.parse(log) == PtxasReport(255, 212, 208, 216, 21504)
    assert PtxasReport.parse("") == PtxasReport()


# -- the linked kernel against the placement (the toy kernel: store.done, 128 threads) --


@pytest.fixture
def toy(tree):
    from pipelink.place import place
    from tests.conftest import toy_recipe
    tree.toy()
    kernel = tree.check(tree.recipe(toy_recipe()))
    return kernel, place(kernel.problem)


@pytest.mark.parametrize("line,error", [
    ("bar.sync 0;", None),
    ("bar.sync {id}, 128;", None),
    ("bar.sync 13, 64;", "uses named barrier id 13 ('bar.sync 13, 64;'), which the placement"),
    ("bar.arrive {id}, 64;", "with 64 threads ('bar.arrive {id}, 64;'), but it is placed for "
                             "store.done (128 threads)"),
])
def test_linked_barriers_against_the_placement(toy, line, error):
    from pipelink.verify import ContractViolation, check_linked_barriers
    kernel, placement = toy
    ident = placement.barriers["store.done"]
    ptx = _module("\t" + line.format(id=ident)).replace(".func pl_x_main", ".entry pl_toy")
    if error is None:
        check_linked_barriers(ptx, kernel, placement)
        return
    with pytest.raises(ContractViolation) as err:
        check_linked_barriers(ptx, kernel, placement)
    assert error.format(id=ident) in err.value.message


@pytest.mark.parametrize("report,error", [
    (PtxasReport(smem=21504), None),
    (PtxasReport(smem=21504, registers=168), None),
    (PtxasReport(smem=21505),
     "21505 bytes of static plus 210944 bytes of dynamic shared memory, 233472 B with the "
     "dynamic part aligned to 1024"),
    (PtxasReport(smem=20481), None),
    (PtxasReport(spill_stores=8, spill_loads=4, registers=255),
     "8 bytes spill stores, 4 bytes spill loads"),
])
def test_kernel_resources(toy, report, error):
    from dataclasses import replace

    from pipelink.verify import ContractViolation, check_resources
    kernel, placement = toy
    placement = replace(placement, smem_bytes=227 * 1024 - 21504)
    if error is None:
        check_resources(report, kernel, placement)
        return
    with pytest.raises(ContractViolation) as err:
        check_resources(report, kernel, placement)
    assert error in err.value.message


@pytest.mark.parametrize("static,left", [(0, 232448), (1, 231424), (21504, 210944),
                                         (21505, 209920)])
def test_placer_counts_static_shared_memory_with_the_dynamic_alignment(static, left):
    from pipelink.problem import Problem
    assert Problem("sm_90a", static_smem=static).limits["smem_bytes"] == left


TOY = """recipe: toy_pair
arch: [sm_90a]
instances:
  load: {component: tile_loader, params: {dtype: bf16}}
  reduce: row_reduce
  store: row_store
connect:
  - load.tiles -> reduce.x
  - reduce.acc -> store.acc
"""


def _toy_kernel(tmp_path: Path) -> Kernel:
    (tmp_path / "toy_pair.yaml").write_text(TOY)
    recipe = load_recipe(tmp_path / "toy_pair.yaml")
    bound = {name: load_contract(ROOT / "components" / inst.component / "contract.yaml")
             .bind(inst.params) for name, inst in recipe.instances("sm_90a").items()}
    return check(recipe, "sm_90a", bound)


# ptxas's printer puts the callee on the line after `call.uni` (a __noinline__ entry).
SPLIT_CALL = "\t{\n\tcall.uni \n\t{symbol}, \n\t(\n\tparam0, \n\tparam1\n\t);\n\t}"


@pytest.mark.parametrize("call", [SPLIT_CALL, "\tcall.uni {symbol}, (param0);"],
                         ids=["split", "one_line"])
def test_a_surviving_entry_call_is_refused_naming_the_instance(tmp_path, call):
    kernel = _toy_kernel(tmp_path)
    symbol = kernel.bound["reduce"].symbol("pl_row_reduce_reduce")
    with pytest.raises(LinkError, match=r"1 entry call\(s\).*instance 'reduce' \(row_reduce\)"):
        verify_folded(_module(call.replace("{symbol}", symbol)), kernel)


def test_folded_code_passes(tmp_path):
    verify_folded(_module("\tcall.uni helper, (%r1);\n\tbar.sync 0;"), _toy_kernel(tmp_path))


UNRESOLVED_LOGS = {  # ptxas's words, from nvJitLink and from nvcc on the monolithic unit
    "linked": (LinkError, "ptxas fatal   : Unresolved extern function '{}'\nERROR NVJITLINK_ERROR"),
    "mono": (ToolchainError, "mono.cu(144): warning #186-D\n"
                             "ptxas fatal   : Unresolved extern function '{}'"),
}


@pytest.mark.parametrize("mode", UNRESOLVED_LOGS)
def test_an_entry_the_object_lacks_is_named(tmp_path, mode):
    """A misspelt entry is never emitted (nor, linked, an inline one): ptxas's
    unresolved symbol becomes an error naming the component, instance and role."""
    kernel = _toy_kernel(tmp_path)
    symbol = kernel.bound["reduce"].symbol("pl_row_reduce_reduce")
    kind, log = UNRESOLVED_LOGS[mode]
    error = unresolved_symbol(kernel, {}, kind("failed", log=log.format(symbol)))
    assert error is not None
    text = str(error)
    assert "component 'row_reduce' (instance 'reduce')" in text
    assert "pl_row_reduce_reduce, the entry of role 'reduce'" in text
    assert "__forceinline__" in text
    other = LinkError("nvJitLink failed", log="Unresolved extern function 'memcpy_x'")
    assert unresolved_symbol(kernel, {}, other) is None
