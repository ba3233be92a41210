"""The linked code against the contracts, with real nvcc and nvJitLink (no GPU needed).

Each case writes two small components into a temporary folder: one that breaks (or
keeps) its contract, linked beside a well-behaved one, and expects the link to fail
naming the component, or to pass.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from pipelink.build import build_objects
from pipelink.link import LinkOptions, link_kernel
from pipelink.recipe import ComponentIndex, load_recipe
from pipelink.verify import ContractViolation

from ..conftest import requires_nvcc
from .sass import sass

pytestmark = requires_nvcc

ENTRY = """\
#include "pl_{name}.h"
extern "C" __device__ void pl_{name}_main(const pl_place_{name}& at, const pl_args_{name}& args,
                                     const pl::KernelInfo&, const pl::WorkTile& tile,
                                     pl_state_{name}_main&) {{
  const uint32_t t = pl::thread_in_role(at.role.main);
{body}
}}
"""

# Uses its placed barrier, as every PipeLink component does.
PLACED = """\
  pl::named_sync(at.bar.sync, 128);
  if (t == 0) args.out[tile.m_block] = 1.0f;"""

# A third-party habit: the barrier id and count typed into the source.
HARD_CODED = """\
  asm volatile("bar.sync 13, 64;" ::: "memory");
  if (t == 0) args.out[tile.m_block] = 2.0f;"""

# 20 KiB of static shared memory the contract may or may not declare.
STATIC_SMEM = """\
  __shared__ float scratch[5376];  // 21504 bytes
  scratch[t] = args.out[t];
  __syncwarp();
  args.out[t] = scratch[(t + 1) % 128];"""

# 96 values made in order and used in reverse: all live at once, about 100 registers.
HUNGRY = """\
  float v[96];
#pragma unroll
  for (int i = 0; i < 96; ++i) {
    uint32_t c;
    asm volatile("mov.u32 %0, %%clock;" : "=r"(c));
    v[i] = __uint_as_float(c);
  }
  float s = 0.0f;
#pragma unroll
  for (int i = 95; i >= 0; --i) s = fmaf(s, v[i], 1.0f);
  args.out[tile.m_block * 128 + t] = s;"""


def component(root: Path, name: str, body: str, extra: str = "", registers: int = 64,
              uses: str = "[]") -> None:
    folder = root / "components" / name
    folder.mkdir(parents=True)
    (folder / "contract.yaml").write_text(textwrap.dedent(f"""\
        component: {name}
        arch: [sm_90a]
        roles: {{main: {{warps: 4, registers: {registers}, uses: {uses}}}}}
        args: [{{name: out, type: ptr, dtype: f32}}]
        """) + extra)
    (folder / f"{name}.cu").write_text(ENTRY.format(name=name, body=body))


def link_pair(root: Path, a: str, b: str, extra: str = "") -> object:
    (root / "r.yaml").write_text(f"recipe: pair\narch: [sm_90a]\ninstances: {{a: {a}, b: {b}}}\n"
                                 + extra)
    recipe = load_recipe(root / "r.yaml")
    index = ComponentIndex((root / "components",))
    objects = build_objects(recipe, "sm_90a", index, root / "obj")
    return link_kernel(recipe, objects, root / "out", LinkOptions("sm_90a"), index=index)


PLACED_BARRIER = "named_barriers: {sync: {threads: 128}}\n"

# (contract of the hard-coding component, what the error says; None: links clean)
BARRIER_CASES = [
    ("", "hard-codes named barrier id 13"),
    ("named_barriers: {sync: {threads: 64}}\n", "hard-codes named barrier id 13"),
    ("named_barriers: {sync: {threads: 128, fixed: 13}}\n",
     "uses named barrier 13 with 64 threads"),
    ("named_barriers: {sync: {threads: 64, fixed: 13}}\n", None),
]


@pytest.mark.parametrize("contract,error", BARRIER_CASES,
                         ids=["undeclared", "relocatable", "wrong_threads", "fixed"])
def test_hard_coded_barrier_ids(tmp_path, contract, error):
    component(tmp_path, "legacy", HARD_CODED, contract)
    component(tmp_path, "modern", PLACED, PLACED_BARRIER)
    if error is None:
        result = link_pair(tmp_path, "legacy", "modern")
        placed = result.placement.barriers["b.sync"]
        assert result.placement.barriers["a.sync"] == 13 and placed != 13
        assert {(13, 64), (placed, 128)} <= _sass_barriers(result.cubin)
        return
    with pytest.raises(ContractViolation) as err:
        link_pair(tmp_path, "legacy", "modern")
    assert error in err.value.message
    assert err.value.component == "legacy" and err.value.instance == "a"
    assert "component 'legacy' (instance 'a')" in err.value.message
    assert not (tmp_path / "out" / "pair.cubin").exists()


@pytest.mark.parametrize("body,contract,error", [
    (PLACED.replace("128", "64"), PLACED_BARRIER,
     "syncs a named barrier with 64 threads ('barrier.sync %r"),
    # An id computed at run time, not read from the placement.
    (PLACED.replace("at.bar.sync", "uint32_t(tile.m_block) % 15 + 1"), "",
     "uses a named barrier ('barrier.sync %r"),
], ids=["wrong_threads", "undeclared"])
def test_placed_barrier_counts(tmp_path, body, contract, error):
    component(tmp_path, "odd", body, contract)
    component(tmp_path, "modern", PLACED, PLACED_BARRIER)
    with pytest.raises(ContractViolation) as err:
        link_pair(tmp_path, "odd", "modern")
    assert error in err.value.message and err.value.component == "odd"


def _sass_barriers(cubin: Path) -> set[tuple[int, int]]:
    return {(int(i, 16), int(n, 16)) for i, n in
            re.findall(r"BAR\.SYNC\S*\s+(0x[0-9a-f]+),\s*(0x[0-9a-f]+)", sass(cubin))}


def test_undeclared_static_shared_memory_is_an_error(tmp_path):
    component(tmp_path, "scratchy", STATIC_SMEM)
    component(tmp_path, "modern", PLACED, PLACED_BARRIER)
    with pytest.raises(ContractViolation) as err:
        link_pair(tmp_path, "scratchy", "modern")
    text = err.value.message
    assert "component 'scratchy' (instance 'a') declares 21504 bytes" in text
    assert "static_smem: 0" in text and "static_smem: 21504" in err.value.hint


# Fills shared memory with stages of 16 KiB: 14 fit in 227 KiB alone, 12 beside 21 KiB.
BIG_RING = ("tunables: {stages: [1, 14]}\n"
            "smem: {ring: {bytes: stages*16384, align: 1024}}\n" + PLACED_BARRIER)


@pytest.mark.parametrize("static,stages", [(None, 14), (21504, 12)])
def test_declared_static_shared_memory_is_counted_by_the_placer(tmp_path, static, stages):
    if static is None:
        component(tmp_path, "scratchy", PLACED.replace("1.0f", "3.0f"), PLACED_BARRIER)
    else:
        component(tmp_path, "scratchy", STATIC_SMEM, f"static_smem: {static}\n")
    component(tmp_path, "ring", PLACED, BIG_RING)
    result = link_pair(tmp_path, "scratchy", "ring")
    assert result.placement.tunables["b.stages"] == stages
    assert (static or 0) + result.placement.smem_bytes <= 227 * 1024


@pytest.mark.parametrize("registers,spills", [(24, True), (128, False)])
def test_setmaxnreg_budget_below_use_spills_and_is_reported(tmp_path, registers, spills):
    # "modern" moves registers with setmaxnreg, so "hungry"'s warpgroup is cut to the
    # registers its contract states (it runs no whole-warpgroup role: no spare for it).
    component(tmp_path, "hungry", HUNGRY, registers=registers)
    component(tmp_path, "modern", PLACED, PLACED_BARRIER, registers=200, uses="[setmaxnreg]")
    if not spills:
        result = link_pair(tmp_path, "hungry", "modern")
        assert registers in result.placement.warpgroup_regs
        return
    with pytest.raises(ContractViolation) as err:
        link_pair(tmp_path, "hungry", "modern")
    text = err.value.message
    assert "ptxas spilled registers" in text
    assert re.search(r"\b[1-9]\d* bytes spill stores, [1-9]\d* bytes spill loads", text)
    assert "a.main needs 24" in text and "budgets per warpgroup [24, 256]" in text

# Every shipped recipe linking clean (verification included) is checked, kernel by
# kernel, in test_work_ring.py.
