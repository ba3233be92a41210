"""Structural SASS reference of CUTLASS's own Blackwell (sm_100a) warp-specialised GEMM.

Compiles ``cutlass_gemm_sm100.cu`` (CUTLASS 4.x ``CollectiveBuilder`` GEMM, bf16 A[M,K] @
B[N,K]^T -> bf16 C[M,N], fp32 accumulation) twice, one kernel per nvcc:

* ``1sm``: MMA tile 128x256x64, cluster 1x1x1, ``KernelTmaWarpSpecialized1SmSm100``;
* ``2sm``: MMA tile 256x256x64 over a CTA pair, cluster 2x1x1,
  ``KernelTmaWarpSpecialized2SmSm100``;

plus ``tcgen05_probes.cu`` (one tiny kernel per PTX instruction), into a temporary folder,
disassembles every cubin with ``cuobjdump`` (pip wheel ``nvidia-cuda-cuobjdump``) and writes
``cutlass_reference.json`` beside this file with: toolchain and CUTLASS versions, the exact
commands and compile times, the PTX -> SASS opcode table from the probes, and per kernel the
registers, shared memory, threads per CTA, warp roles, SASS instruction-class counts and the
per-k-tile instruction mix of the MMA-issuing and TMA-issuing main loops.

No GPU is needed. Run from the repository root::

    .venv/bin/python bench/sm100/reference.py            # writes bench/sm100/cutlass_reference.json
    .venv/bin/python bench/sm100/reference.py --keep DIR # also keeps cubins and SASS in DIR

:func:`instruction_mix` is the reusable part: give it the ``cuobjdump -sass`` text of one
kernel (any kernel, e.g. PipeLink's own sm_100a GEMM) and it returns the same counts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GEMM_SOURCE = HERE / "cutlass_gemm_sm100.cu"
PROBE_SOURCE = HERE / "tcgen05_probes.cu"
OUTPUT = HERE / "cutlass_reference.json"
ARCH = "sm_100a"


# ---------------------------------------------------------------------------------------
# Configurations
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GemmConfig:
    """One CUTLASS kernel of ``cutlass_gemm_sm100.cu`` (selected by ``PL_SM100_CONFIG``)."""

    key: str
    macro: int
    tag: str                      # suffix of the pl_sm100_gemm_<tag>_facts array
    mma_tile: tuple[int, int, int]
    cluster: tuple[int, int, int]
    kernel_schedule: str
    epilogue_schedule: str


CONFIGS = (
    GemmConfig("1sm_128x256x64_cluster1x1x1", 1, "1sm", (128, 256, 64), (1, 1, 1),
               "cutlass::gemm::KernelTmaWarpSpecialized1SmSm100",
               "cutlass::epilogue::TmaWarpSpecialized1Sm"),
    GemmConfig("2sm_256x256x64_cluster2x1x1", 2, "2sm", (256, 256, 64), (2, 1, 1),
               "cutlass::gemm::KernelTmaWarpSpecialized2SmSm100",
               "cutlass::epilogue::TmaWarpSpecialized2Sm"),
)

# Order of the pl_sm100_gemm_<tag>_facts[] array in cutlass_gemm_sm100.cu.
FACT_NAMES = ("max_threads_per_block", "dynamic_smem_bytes", "mainloop_stages",
              "accumulator_stages", "scheduler_stages", "epilogue_threads")

# The PTX each probe kernel of tcgen05_probes.cu issues (probe_<name>).
PROBE_PTX = {
    "tcgen05_alloc_cg1": "tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32",
    "tcgen05_dealloc_cg1": "tcgen05.dealloc.cta_group::1.sync.aligned.b32",
    "tcgen05_relinquish_alloc_permit_cg1":
        "tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned",
    "tcgen05_alloc_cg2": "tcgen05.alloc.cta_group::2.sync.aligned.shared::cta.b32",
    "tcgen05_dealloc_cg2": "tcgen05.dealloc.cta_group::2.sync.aligned.b32",
    "tcgen05_relinquish_alloc_permit_cg2":
        "tcgen05.relinquish_alloc_permit.cta_group::2.sync.aligned",
    "tcgen05_mma_cg1_f16_ss": "tcgen05.mma.cta_group::1.kind::f16 [d], adesc, bdesc, idesc, p",
    "tcgen05_mma_cg1_f16_ts": "tcgen05.mma.cta_group::1.kind::f16 [d], [a_tmem], bdesc, idesc, p",
    "tcgen05_mma_cg1_f16_ss_disable_lane":
        "tcgen05.mma.cta_group::1.kind::f16 [d], adesc, bdesc, idesc, {mask x4}, p",
    "tcgen05_mma_cg2_f16_ss": "tcgen05.mma.cta_group::2.kind::f16 [d], adesc, bdesc, idesc, p",
    "tcgen05_commit_cg1":
        "tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64",
    "tcgen05_commit_cg2":
        "tcgen05.commit.cta_group::2.mbarrier::arrive::one.shared::cluster.b64",
    "tcgen05_commit_cg2_multicast": "tcgen05.commit.cta_group::2.mbarrier::arrive::one"
                                    ".shared::cluster.multicast::cluster.b64",
    "tcgen05_ld_32x32b_x16": "tcgen05.ld.sync.aligned.32x32b.x16.b32 (+ tcgen05.wait::ld)",
    "tcgen05_st_32x32b_x16": "tcgen05.st.sync.aligned.32x32b.x16.b32 (+ tcgen05.wait::st)",
    "tcgen05_wait_ld": "tcgen05.wait::ld.sync.aligned",
    "tcgen05_wait_st": "tcgen05.wait::st.sync.aligned",
    "tcgen05_fence_before_thread_sync": "tcgen05.fence::before_thread_sync",
    "tcgen05_fence_after_thread_sync": "tcgen05.fence::after_thread_sync",
    "tcgen05_cp_128x256b": "tcgen05.cp.cta_group::1.128x256b",
    "mbarrier_init": "mbarrier.init.shared::cta.b64",
    "mbarrier_arrive": "mbarrier.arrive.shared::cta.b64",
    "mbarrier_arrive_expect_tx": "mbarrier.arrive.expect_tx.shared::cta.b64",
    "mbarrier_try_wait_parity": "mbarrier.try_wait.parity.shared::cta.b64 (once)",
    "mbarrier_test_wait_parity": "mbarrier.test_wait.parity.shared::cta.b64",
    "mbarrier_wait_parity_spin": "mbarrier.try_wait.parity.shared::cta.b64 in a bra loop",
    "mbarrier_wait_parity_spin_hint":
        "mbarrier.try_wait.parity.shared::cta.b64 p, [a], parity, 0x989680 in a loop "
        "(CUTLASS ClusterBarrier::wait)",
    "mbarrier_arrive_expect_tx_remote_cta":
        "mapa + mbarrier.arrive.expect_tx.shared::cluster.b64 (peer CTA)",
    "fence_mbarrier_init_cluster": "fence.mbarrier_init.release.cluster",
    "mbarrier_arrive_remote_cta": "mapa + mbarrier.arrive.shared::cluster.b64 (peer CTA)",
    "fence_mbarrier_init": "fence.mbarrier_init.release.cluster (no cluster)",
    "tma_load_2d": "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes",
    "tma_load_2d_multicast": "cp.async.bulk.tensor.2d...complete_tx::bytes.multicast::cluster",
    "tma_load_2d_cta_group2": "cp.async.bulk.tensor.2d.cta_group::2.shared::cluster.global"
                              ".mbarrier::complete_tx::bytes",
    "tma_load_2d_cta_group2_multicast":
        "cp.async.bulk.tensor.2d.cta_group::2...complete_tx::bytes.multicast::cluster",
    "tma_store_2d": "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group",
    "bulk_commit_group": "cp.async.bulk.commit_group",
    "bulk_wait_group_read": "cp.async.bulk.wait_group.read 0",
    "bulk_copy_g2s": "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes",
    "prefetch_tensormap": "prefetch.tensormap",
    "fence_proxy_async_shared_cta": "fence.proxy.async.shared::cta",
    "clc_try_cancel_multicast": "clusterlaunchcontrol.try_cancel.async.shared::cta"
                                ".mbarrier::complete_tx::bytes.multicast::cluster::all.b128",
    "clc_query_cancel": "clusterlaunchcontrol.query_cancel.{is_canceled,get_first_ctaid}",
    "named_barrier_sync": "bar.sync 1, 128",
    "named_barrier_arrive": "bar.arrive 1, 128",
    "cluster_arrive_wait": "barrier.cluster.arrive.release + barrier.cluster.wait.acquire",
    "elect_sync": "elect.sync",
}


# ---------------------------------------------------------------------------------------
# SASS parsing and instruction classes (the reusable part)
# ---------------------------------------------------------------------------------------

INSTR_RE = re.compile(r"^\s*/\*(?P<addr>[0-9a-f]{4,})\*/\s+(?P<pred>@!?U?P[T0-9]+\s+)?"
                      r"(?P<op>[A-Z][A-Za-z0-9_.]*)(?P<operands>[^;]*);")
FUNCTION_RE = re.compile(r"^\s*Function\s*:\s*(\S+)", re.MULTILINE)
TARGET_RE = re.compile(r"(0x[0-9a-f]+)\s*$")

# (class, opcode regex), first match wins. Opcodes include their modifiers.
CLASSES: tuple[tuple[str, str], ...] = (
    ("tcgen05_mma", r"UTC\w*MMA"),                       # tcgen05.mma (UTCHMMA, ...)
    ("tcgen05_commit", r"UTCBAR"),                       # tcgen05.commit
    ("tcgen05_cp", r"UTCCP"),                            # tcgen05.cp
    ("tmem_alloc", r"UTCATOMSWS\.(2CTA\.)?FIND_AND_SET"),  # tcgen05.alloc
    ("tmem_dealloc", r"UTCATOMSWS\.(2CTA\.)?AND"),       # tcgen05.dealloc
    ("tmem_relinquish", r"UVIRTCOUNT\.DEALLOC"),         # tcgen05.relinquish_alloc_permit
    ("tcgen05_other", r"UTC"),
    ("tmem_load", r"LDTM"),                              # tcgen05.ld
    ("tmem_store", r"STTM"),                             # tcgen05.st
    ("tma_load", r"UTMALDG"),                            # cp.async.bulk.tensor g->s
    ("tma_store", r"UTMASTG"),                           # cp.async.bulk.tensor s->g
    ("tma_prefetch", r"UTMACCTL|UTMAPF"),                # prefetch.tensormap
    ("bulk_commit_group", r"UTMACMDFLUSH"),              # cp.async.bulk.commit_group
    ("bulk_copy", r"UBLKCP"),                            # cp.async.bulk (non-tensor)
    ("tma_other", r"UTMA|UBLK"),
    ("mbarrier_init", r"SYNCS\.EXCH"),                   # mbarrier.init
    ("mbarrier_try_wait", r"SYNCS\.PHASECHK\.\S*TRYWAIT"),  # mbarrier.try_wait
    ("mbarrier_test_wait", r"SYNCS\.PHASECHK"),          # mbarrier.test_wait / retry
    ("mbarrier_arrive_remote", r"SYNCS\.ARRIVE\.\S*RED\.\S*A1T0"),  # arrive on peer CTA
    ("mbarrier_arrive_expect_tx_remote", r"SYNCS\.ARRIVE\.\S*RED"),
    ("mbarrier_arrive", r"SYNCS\.ARRIVE\.\S*A1T0"),      # mbarrier.arrive
    ("mbarrier_arrive_expect_tx", r"SYNCS\.ARRIVE"),     # mbarrier.arrive.expect_tx
    ("syncs_other", r"SYNCS"),
    ("nanosleep", r"NANOSLEEP"),                         # .SYNCS: try_wait suspend hint
    ("named_barrier", r"BAR\."),                         # bar.sync / bar.arrive
    ("cluster_barrier", r"UCGABAR"),                     # barrier.cluster.*
    ("clc_try_cancel", r"UGETNEXTWORKID"),               # clusterlaunchcontrol.try_cancel
    ("fence_proxy_async", r"FENCE\.VIEW\.ASYNC\.S"),     # fence.proxy.async.shared::cta
    ("fence_tmem_store", r"FENCE\.VIEW\.ASYNC\.T"),      # tcgen05.wait::st
    ("fence_other", r"FENCE|MEMBAR|ERRBAR|CGAERRBAR|CCTL"),
    ("elect", r"ELECT"),
    ("hgmma", r"HGMMA"),                                 # sm_90 wgmma: must be 0
    ("mma_sync", r"HMMA|IMMA|QMMA|OMMA|DMMA"),
    ("local_load", r"LDL"),
    ("local_store", r"STL"),
    ("global_load", r"LDG"),
    ("global_store", r"STG"),
    ("shared_load", r"LDS"),
    ("shared_store", r"STS"),
    ("shared_atomic", r"ATOMS"),
    ("trap", r"BPT"),
    ("control", r"BRA|BSSY|BSYNC|CALL|RET|EXIT|WARPSYNC|DEPBAR|YIELD"),
    ("uniform_alu", r"U"),
    ("float_alu", r"F|HFMA2|HADD2|HMUL2|I2F|F2I"),
    ("int_alu", r".*"),
)
_CLASS_RES = tuple((name, re.compile(pattern)) for name, pattern in CLASSES)

# Sums reported beside the fine classes.
GROUPS: dict[str, tuple[str, ...]] = {
    "tcgen05_mma": ("tcgen05_mma",),
    "tcgen05_commit": ("tcgen05_commit",),
    "tma": ("tma_load", "tma_store", "bulk_copy"),
    "mbarrier": ("mbarrier_init", "mbarrier_try_wait", "mbarrier_test_wait",
                 "mbarrier_arrive_remote", "mbarrier_arrive_expect_tx_remote",
                 "mbarrier_arrive", "mbarrier_arrive_expect_tx", "syncs_other"),
    "named_barrier": ("named_barrier",),
    "tmem_ld_st": ("tmem_load", "tmem_store"),
    "tmem_alloc_dealloc_relinquish": ("tmem_alloc", "tmem_dealloc", "tmem_relinquish"),
    "hgmma": ("hgmma",),
    "local_memory": ("local_load", "local_store"),
}
# Classes whose opcode spellings are listed in full (the ALU ones are only counted).
ALU_CLASSES = frozenset({"uniform_alu", "float_alu", "int_alu", "control"})

# The class whose instructions mark one k-tile in a loop that issues `cls`.
K_TILE_MARKERS: dict[str, tuple[str, ...]] = {
    "tcgen05_mma": ("tcgen05_commit",),   # one commit releases one smem stage
    "tma_load": ("mbarrier_arrive_expect_tx", "mbarrier_arrive_expect_tx_remote"),
}


@dataclass(frozen=True)
class Instr:
    """One SASS instruction: address, guard predicate, opcode with modifiers, operands."""

    addr: int
    pred: str
    opcode: str
    operands: str


def parse_sass(sass_text: str) -> list[Instr]:
    """Every instruction line of ``cuobjdump -sass`` text, in order."""
    out = []
    for line in sass_text.splitlines():
        m = INSTR_RE.match(line)
        if m:
            out.append(Instr(int(m["addr"], 16), (m["pred"] or "").strip(), m["op"],
                             m["operands"].strip()))
    return out


def split_functions(sass_text: str) -> dict[str, str]:
    """``cuobjdump -sass`` text of a whole cubin -> {mangled kernel name: its SASS}."""
    marks = list(FUNCTION_RE.finditer(sass_text))
    return {m[1]: sass_text[m.start():marks[i + 1].start() if i + 1 < len(marks) else None]
            for i, m in enumerate(marks)}


def classify(opcode: str) -> str:
    """The instruction class of one opcode (see ``CLASSES``)."""
    return next(name for name, rx in _CLASS_RES if rx.match(opcode))


def count_classes(instrs: list[Instr]) -> Counter[str]:
    return Counter(classify(i.opcode) for i in instrs if i.opcode != "NOP")


def opcodes_by_class(instrs: list[Instr]) -> dict[str, dict[str, int]]:
    by: dict[str, Counter[str]] = {}
    for i in instrs:
        cls = classify(i.opcode)
        if i.opcode != "NOP" and cls not in ALU_CLASSES:
            by.setdefault(cls, Counter())[i.opcode] += 1
    return {cls: dict(c.most_common()) for cls, c in sorted(by.items())}


def group_counts(classes: Counter[str]) -> dict[str, int]:
    return {g: sum(classes.get(c, 0) for c in members) for g, members in GROUPS.items()}


def back_edges(instrs: list[Instr]) -> list[tuple[int, int]]:
    """(loop head, latch) for every branch that jumps back (or to itself).

    ptxas puts the slow paths (e.g. the mbarrier retry loop TRYWAIT / NANOSLEEP.SYNCS /
    PHASECHK) after the kernel's last EXIT and jumps back into the code from there; such
    returns are not loops and are skipped. Loop bodies are therefore the inline fast path.
    """
    exits = [i.addr for i in instrs if i.opcode == "EXIT"]
    last_exit = max(exits, default=max((i.addr for i in instrs), default=0))
    edges = []
    for i in instrs:
        m = TARGET_RE.search(i.operands)
        if not (i.opcode.startswith("BRA") and m):
            continue
        target = int(m[1], 16)
        if target <= i.addr and not (i.addr > last_exit >= target):
            edges.append((target, i.addr))
    return edges


def innermost_loops(instrs: list[Instr], cls: str) -> list[tuple[int, int]]:
    """Loops holding an instruction of ``cls`` that hold no smaller such loop."""
    addrs = [i.addr for i in instrs if classify(i.opcode) == cls]
    loops = sorted({(h, t) for h, t in back_edges(instrs) if any(h <= a <= t for a in addrs)})

    def inside(inner: tuple[int, int], outer: tuple[int, int]) -> bool:
        return inner != outer and outer[0] <= inner[0] and inner[1] <= outer[1]

    return [lp for lp in loops if not any(inside(o, lp) for o in loops)]


def loop_summary(instrs: list[Instr], loop: tuple[int, int], cls: str) -> dict:
    """Static instruction mix of one loop body and its share per k-tile."""
    body = [i for i in instrs if loop[0] <= i.addr <= loop[1] and i.opcode != "NOP"]
    classes = count_classes(body)
    markers = sum(classes.get(c, 0) for c in K_TILE_MARKERS.get(cls, ()))
    k_tiles = max(1, markers)
    return {
        "head": f"0x{loop[0]:04x}", "latch": f"0x{loop[1]:04x}",
        "instructions": len(body),
        "k_tiles_per_iteration": k_tiles,
        "k_tile_rule": "+".join(K_TILE_MARKERS.get(cls, ())) or "one iteration",
        "classes": dict(classes.most_common()),
        "per_k_tile": {c: round(n / k_tiles, 3) for c, n in classes.most_common()},
        "instructions_per_k_tile": round(len(body) / k_tiles, 3),
        "opcode_sequence": [f"{i.pred + ' ' if i.pred else ''}{i.opcode}" for i in body],
    }


def loops_issuing(instrs: list[Instr], cls: str) -> list[dict]:
    return [loop_summary(instrs, lp, cls) for lp in innermost_loops(instrs, cls)]


def instruction_mix(sass_text: str) -> dict:
    """SASS instruction classes of one kernel (``cuobjdump -sass`` text of one Function).

    Returns total instructions (NOPs apart), counts per fine class and per group (tcgen05
    MMA/commit, TMA, mbarrier, named barriers, TMEM ld/st and alloc, HGMMA, local memory),
    every opcode spelling per non-ALU class, all ``UTC*`` opcodes, and the innermost loops
    that issue tcgen05.mma and TMA loads with their per-k-tile mix. For a whole-cubin dump
    with several kernels use :func:`kernels_mix`.
    """
    if len(FUNCTION_RE.findall(sass_text)) > 1:
        raise ValueError("several kernels in this SASS: use kernels_mix()")
    instrs = parse_sass(sass_text)
    classes = count_classes(instrs)
    return {
        "total_instructions": sum(classes.values()),
        "nop": sum(i.opcode == "NOP" for i in instrs),
        "groups": group_counts(classes),
        "classes": dict(classes.most_common()),
        "utc_opcodes": dict(Counter(i.opcode for i in instrs
                                    if i.opcode.startswith("UTC")).most_common()),
        "opcodes": opcodes_by_class(instrs),
        "loops": {"tcgen05_mma": loops_issuing(instrs, "tcgen05_mma"),
                  "tma_load": loops_issuing(instrs, "tma_load")},
    }


def kernels_mix(sass_text: str) -> dict[str, dict]:
    """:func:`instruction_mix` of every kernel of a whole-cubin ``cuobjdump -sass`` dump."""
    return {name: instruction_mix(text) for name, text in split_functions(sass_text).items()}


# ---------------------------------------------------------------------------------------
# Tools
# ---------------------------------------------------------------------------------------

def find_nvcc() -> str:
    try:
        from pipelink.toolchain import find_nvcc as pipelink_find_nvcc
        return pipelink_find_nvcc()[0]
    except Exception:  # noqa: BLE001 - the project module is optional here
        found = shutil.which("nvcc")
        if not found:
            raise SystemExit("nvcc not found (CUDA >= 12.8 needed for sm_100a)") from None
        return found


def find_cuobjdump() -> str:
    """As tests/integration/sass.py: the nvidia-cuda-cuobjdump wheel, then PATH."""
    for site in map(Path, sys.path):
        for sub in ("nvidia/cuda_cuobjdump/bin/cuobjdump", "nvidia/cu13/bin/cuobjdump"):
            if (site / sub).is_file():
                return str(site / sub)
    found = shutil.which("cuobjdump")
    if not found:
        raise SystemExit("cuobjdump not found: .venv/bin/pip install nvidia-cuda-cuobjdump "
                         "nvidia-cuda-nvdisasm")
    return found


def cutlass_root() -> Path:
    """CUTLASS ``include`` folder of the nvidia-cutlass wheel (tools/ lies beside it)."""
    try:
        from pipelink.compile import cutlass_include
        return cutlass_include()
    except Exception:  # noqa: BLE001 - fall back to the wheel's layout
        from importlib.util import find_spec
        spec = find_spec("cutlass_library")
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit("CUTLASS headers not found: pip install nvidia-cutlass") from None
        return Path(list(spec.submodule_search_locations)[0]) / "source" / "include"


def tool_output(cmd: list[str]) -> str:
    """stdout of a tool; cuobjdump runs nvdisasm, which must lie on PATH beside it."""
    env = {**os.environ, "PATH": f"{Path(cmd[0]).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout


def version_line(tool: str) -> str:
    text = tool_output([tool, "--version"])
    m = re.search(r"release \S+ V([\d.]+)", text)
    return m[1] if m else text.strip().splitlines()[-1]


def cutlass_header_version(include: Path) -> str:
    text = (include / "cutlass" / "version.h").read_text()
    parts = [re.search(rf"#define CUTLASS_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m[1] if m else "?" for m in parts)


def wheel_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("nvidia-cutlass")
    except PackageNotFoundError:
        return "unknown"


def nvcc_command(nvcc: str, source: Path, cubin: Path, include: Path | None,
                 defines: tuple[str, ...] = ()) -> list[str]:
    cmd = [nvcc, "-std=c++17", f"-arch={ARCH}", "-cubin", "--expt-relaxed-constexpr"]
    if include is not None:
        cmd += [f"-I{include}", f"-I{include.parent / 'tools' / 'util' / 'include'}"]
    return cmd + [f"-D{d}" for d in defines] + [str(source), "-o", str(cubin)]


def compile_timed(cmd: list[str]) -> float:
    """Runs one nvcc; returns its wall time in seconds."""
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"nvcc failed ({done.returncode}):\n{' '.join(cmd)}\n"
                         f"{done.stderr[-6000:]}")
    return round(time.perf_counter() - t0, 1)


def shown(cmd: list[str], include: Path | None, tmp: Path) -> str:
    """A command line with machine-specific paths replaced by placeholders."""
    text = " ".join(Path(c).name if i == 0 else c for i, c in enumerate(cmd))
    if include is not None:
        text = text.replace(str(include.parent), "$CUTLASS")
    return text.replace(str(tmp), "$TMP").replace(str(ROOT) + "/", "")


# ---------------------------------------------------------------------------------------
# cubin facts: resource usage, ELF attributes, the facts array
# ---------------------------------------------------------------------------------------

def resource_usage(text: str) -> dict[str, dict[str, int]]:
    """``cuobjdump -res-usage`` -> {kernel: {REG, SHARED, LOCAL, STACK, ...}}."""
    out, name = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            name = m[1]
        elif name and "REG:" in line:
            out[name] = {k: int(v) for k, v in re.findall(r"(\w+(?:\[\d+\])?):(\d+)", line)}
    return out


def elf_section(elf: str, name: str) -> list[str]:
    """Lines of one section's dump in ``cuobjdump -elf`` text."""
    lines = elf.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == name)
    body = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        body.append(line)
    return body


def elf_symbol(elf: str, symbol: str) -> tuple[int, int]:
    """(value, size) of a symbol of the ELF symbol table."""
    m = re.search(rf"^\s*0x[0-9a-f]+\s+(0x[0-9a-f]+|0)\s+(0x[0-9a-f]+|0)\s+\S+\s+\S+\s+\S+\s+"
                  rf"{re.escape(symbol)}\s*$", elf, re.MULTILINE)
    if not m:
        raise KeyError(symbol)
    return int(m[1], 16), int(m[2], 16)


def read_facts(elf: str, tag: str) -> dict[str, int]:
    """The pl_sm100_gemm_<tag>_facts[] array from .nv.global.init (32-bit words)."""
    words = [int(w, 16) for line in elf_section(elf, ".nv.global.init") for w in line.split()]
    offset, size = elf_symbol(elf, f"pl_sm100_gemm_{tag}_facts")
    values = words[offset // 4: (offset + size) // 4]
    return dict(zip(FACT_NAMES, values, strict=True))


def eiattr(elf: str, attribute: str) -> str | None:
    m = re.search(rf"Attribute:\s*{attribute}\s*\n\s*Format:[^\n]*\n\s*Value:\s*([^\n]*)", elf)
    return m[1].strip() if m else None


def mangled_fields(name: str) -> dict[str, int | str]:
    """Template numbers visible in the kernel's mangled name."""
    out: dict[str, int | str] = {}
    m = re.search(r"MainloopSm100TmaUmmaWarpSpecializedILi(\d+)ELi(\d+)ELi(\d+)E", name)
    if m:
        out.update(zip(("mainloop_stages", "scheduler_stages", "accumulator_stages"),
                       map(int, m.groups()), strict=True))
    m = re.search(r"Sm100TmaWarpSpecializedILi(\d+)ELi(\d+)ELi(\d+)E", name)
    if m:
        out.update(zip(("epilogue_stages_c", "epilogue_stages_d", "epilogue_fragment_size"),
                       map(int, m.groups()), strict=True))
    m = re.search(r"SM100_MMA_(\w+?)_(SS|TS)I", name)
    if m:
        out["mma_atom"] = f"SM100_MMA_{m[1]}_{m[2]}"
    m = re.search(r"TMEM4LOAD\d+(SM100_TMEM_LOAD_\w+?)E", name)
    if m:
        out["tmem_load_atom"] = m[1]
    return out


def warp_roles(include: Path, threads: int, epilogue_threads: int) -> dict:
    """Warp roles of CUTLASS's sm100 TMA warp-specialised kernel (its WarpCategory enum)."""
    header = include / "cutlass" / "gemm" / "kernel" / "sm100_gemm_tma_warpspecialized.hpp"
    enum = re.search(r"enum class WarpCategory[^{]*\{(.*?)\}", header.read_text(), re.DOTALL)
    roles = dict(re.findall(r"(\w+)\s*=\s*(\d+)", enum[1])) if enum else {}
    warps = threads // 32
    first_epi = int(roles.get("Epilogue", warps))
    by_warp = {str(w): name for name, w in roles.items() if int(w) < first_epi}
    by_warp.update({str(w): "Epilogue" for w in range(first_epi, warps)})
    return {
        "source": "cutlass/gemm/kernel/sm100_gemm_tma_warpspecialized.hpp WarpCategory",
        "warps": warps, "by_warp": by_warp, "epilogue_threads": epilogue_threads,
        "notes": {"MMA": "one elected thread issues tcgen05.mma + tcgen05.commit; also "
                         "allocates/frees TMEM",
                  "Sched": "CLC tile scheduler (clusterlaunchcontrol.try_cancel); only the "
                           "first CTA of the cluster",
                  "MainloopLoad": "TMA producer for A and B",
                  "EpilogueLoad": "TMA loads of C: idle here (ElementC = void)",
                  "Epilogue": "tcgen05.ld TMEM -> registers, convert, st.shared, TMA store"},
    }


# ---------------------------------------------------------------------------------------
# Probes: PTX -> SASS
# ---------------------------------------------------------------------------------------

PLUMBING = re.compile(r"(NOP|MOV|IMAD|IADD3|VIADD|LOP3|SHF|LEA|ISETP|SEL|S2R|S2UR|LDC|LDCU|"
                      r"UMOV|ULEA|UIADD3|ULOP3|USHF|UPRMT|PRMT|PLOP3|UPLOP3|BRA|BSSY|BSYNC|"
                      r"R2UR|HFMA2|CS2R|EXIT|CALL|RET|UISETP|USEL|UFLO|VOTEU|REDUX|STG)(\.|$)")
SUPPORT = re.compile(r"(LDS|STS|ATOMS|WARPSYNC|BPT|NANOSLEEP$|DEPBAR)")


def opcode_counts(sass_text: str) -> Counter[str]:
    return Counter(i.opcode for i in parse_sass(sass_text))


def probe_row(probe: Counter[str], base: Counter[str], ptx: str) -> dict:
    """SASS a probe adds over its baseline: the instruction proper and its support code."""
    extra = {op: n - base.get(op, 0) for op, n in sorted(probe.items()) if n > base.get(op, 0)}
    special = [op for op in extra if not PLUMBING.match(op)]
    sass = [op for op in special if not SUPPORT.match(op)]
    if len(sass) > 1 and "ELECT" in sass:
        sass.remove("ELECT")           # the elect-one wrapper around a uniform instruction
    return {"ptx": ptx, "sass": sass or ["(none)"],
            "support": [op for op in special if op not in sass and op != "ELECT"],
            "wrapped_in_elect_loop": "ELECT" in extra and "BRA.U.ANY" in extra,
            "all_extra": extra}


def probe_table(probe_sass: str) -> dict[str, dict]:
    funcs = {name.removeprefix("probe_"): opcode_counts(text)
             for name, text in split_functions(probe_sass).items()}
    missing = set(PROBE_PTX) - set(funcs)
    if missing:
        raise SystemExit(f"probe kernels missing from the cubin: {sorted(missing)}")
    base, cluster_base = funcs["baseline"], funcs["cluster_baseline"]
    table = {}
    for name, ptx in PROBE_PTX.items():
        table[name] = probe_row(funcs[name], base, ptx)
        both = probe_row(funcs[name], cluster_base, ptx)
        if len(both["all_extra"]) < len(table[name]["all_extra"]):
            table[name] = both
    return table


# ---------------------------------------------------------------------------------------
# Per-kernel report
# ---------------------------------------------------------------------------------------

def mainloop_digest(mix: dict, tile_k: int) -> dict:
    """Short per-k-tile view of the first MMA loop and the first TMA loop."""
    out: dict = {}
    mma = mix["loops"]["tcgen05_mma"]
    if mma:
        lp = mma[0]
        per_tile = lp["per_k_tile"].get("tcgen05_mma", 0)
        out["mma_loop"] = {
            "head": lp["head"], "latch": lp["latch"],
            "k_tiles_per_iteration": lp["k_tiles_per_iteration"],
            "instructions_per_k_tile": lp["instructions_per_k_tile"],
            "tcgen05_mma_per_k_tile": per_tile,
            "k_per_mma_instruction": tile_k / per_tile if per_tile else None,
            "per_k_tile": lp["per_k_tile"],
        }
    tma = mix["loops"]["tma_load"]
    if tma:
        lp = tma[-1]   # CUTLASS: a prologue loop (first `Stages` k-tiles), then the rest
        out["tma_loop"] = {
            "head": lp["head"], "latch": lp["latch"],
            "loops_found": [f"{x['head']}-{x['latch']}" for x in tma],
            "k_tiles_per_iteration": lp["k_tiles_per_iteration"],
            "instructions_per_k_tile": lp["instructions_per_k_tile"],
            "tma_loads_per_k_tile": lp["per_k_tile"].get("tma_load", 0),
            "per_k_tile": lp["per_k_tile"],
        }
    return out


def kernel_report(cfg: GemmConfig, cubin: Path, cuobjdump: str, include: Path) -> dict:
    sass = tool_output([cuobjdump, "-sass", str(cubin)])
    elf = tool_output([cuobjdump, "-elf", str(cubin)])
    usage = resource_usage(tool_output([cuobjdump, "-res-usage", str(cubin)]))
    funcs = split_functions(sass)
    if len(funcs) != 1:
        raise SystemExit(f"{cubin.name}: expected one kernel, found {len(funcs)}")
    (name, text), = funcs.items()
    facts = read_facts(elf, cfg.tag)
    mix = instruction_mix(text)
    res = usage.get(name, {})
    return {
        "config": {"mma_tile_mnk": cfg.mma_tile, "cluster_mnk": cfg.cluster,
                   "kernel_schedule": cfg.kernel_schedule,
                   "epilogue_schedule": cfg.epilogue_schedule,
                   "define": f"PL_SM100_CONFIG={cfg.macro}"},
        "kernel": name,
        "template_fields": mangled_fields(name),
        "registers": res.get("REG"),
        "static_smem_bytes": res.get("SHARED"),
        "local_bytes": res.get("LOCAL"), "stack_bytes": res.get("STACK"),
        "dynamic_smem_bytes": facts["dynamic_smem_bytes"],
        "threads_per_cta": facts["max_threads_per_block"],
        "eiattr_max_threads": eiattr(elf, "EIATTR_MAX_THREADS"),
        "eiattr_num_barriers": eiattr(elf, "EIATTR_NUM_BARRIERS"),
        "facts": facts,
        "tmem_columns_allocated": 512,  # TmemAllocator::Sm100TmemCapacityColumns, always
        "warp_roles": warp_roles(include, facts["max_threads_per_block"],
                                 facts["epilogue_threads"]),
        "mainloop": mainloop_digest(mix, cfg.mma_tile[2]),
        "instruction_mix": mix,
    }


def build(tmp: Path, nvcc: str, include: Path) -> tuple[dict[str, Path], Path, dict, dict]:
    """Compiles the two GEMMs and the probes concurrently (one nvcc each)."""
    cubins = {cfg.key: tmp / f"cutlass_gemm_{cfg.tag}.cubin" for cfg in CONFIGS}
    cmds = {cfg.key: nvcc_command(nvcc, GEMM_SOURCE, cubins[cfg.key], include,
                                  (f"PL_SM100_CONFIG={cfg.macro}",)) for cfg in CONFIGS}
    probes = tmp / "tcgen05_probes.cubin"
    cmds["probes"] = nvcc_command(nvcc, PROBE_SOURCE, probes, None)
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        seconds = dict(zip(cmds, pool.map(compile_timed, cmds.values()), strict=True))
    shown_cmds = {k: shown(c, include, tmp) for k, c in cmds.items()}
    return cubins, probes, shown_cmds, seconds


def run(keep: Path | None) -> dict:
    nvcc, cuobjdump, include = find_nvcc(), find_cuobjdump(), cutlass_root()
    with tempfile.TemporaryDirectory(prefix="pl_sm100_") as name:
        tmp = Path(name)
        t0 = time.perf_counter()
        cubins, probes, cmds, seconds = build(tmp, nvcc, include)
        wall = round(time.perf_counter() - t0, 1)
        kernels = {cfg.key: kernel_report(cfg, cubins[cfg.key], cuobjdump, include)
                   for cfg in CONFIGS}
        table = probe_table(tool_output([cuobjdump, "-sass", str(probes)]))
        if keep is not None:
            keep_outputs(tmp, keep, cuobjdump)
    return {
        "what": "CUTLASS sm_100a warp-specialised GEMM, SASS structure (bench/sm100/reference.py)",
        "problem": "C[M,N] bf16 row-major = A[M,K] bf16 K-major @ B[N,K]^T bf16 K-major, "
                   "fp32 accumulate, no source operand (ElementC = void)",
        "versions": {"cutlass_headers": cutlass_header_version(include),
                     "nvidia_cutlass_wheel": wheel_version(),
                     "nvcc": version_line(nvcc), "cuobjdump": version_line(cuobjdump),
                     "host": platform.machine()},
        "commands": cmds,
        "compile_seconds": {**seconds, "wall_all_concurrent": wall},
        "ptx_to_sass": table,
        "kernels": kernels,
    }


def keep_outputs(tmp: Path, keep: Path, cuobjdump: str) -> None:
    keep.mkdir(parents=True, exist_ok=True)
    for cubin in tmp.glob("*.cubin"):
        shutil.copy2(cubin, keep / cubin.name)
        (keep / f"{cubin.stem}.sass").write_text(tool_output([cuobjdump, "-sass", str(cubin)]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=OUTPUT, help="JSON to write")
    ap.add_argument("--keep", type=Path, default=None, help="folder to keep cubins/SASS in")
    args = ap.parse_args()
    report = run(args.keep)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    for key, k in report["kernels"].items():
        print(key, json.dumps({"regs": k["registers"], "smem": k["dynamic_smem_bytes"],
                               "threads": k["threads_per_cta"], **k["mainloop"]}, indent=1))
    print("compile seconds:", report["compile_seconds"])
    print("wrote", args.out)


if __name__ == "__main__":
    main()
