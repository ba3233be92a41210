"""Generates a component's ABI header (``pl_<component>.h``) from its own contract.

The header is all a component needs to compile: its params as compile-time
constants, the placement struct the linker fills in, its runtime-argument struct,
the per-role pipeline state the glue keeps, and the entry declarations. Nothing in
it depends on any other component, so a component compiles once, alone.

Field order is sorted within each section so the struct layout depends only on the
contract's content, never on YAML key order; the glue emits initialisers in the
same order by calling :func:`place_fields`.
"""

from __future__ import annotations

from .contract import BoundContract

# C++ spelling of each dtype on the device side.
CXX_DTYPE: dict[str, str] = {
    "f32": "float", "tf32": "float", "bf16": "__nv_bfloat16", "f16": "__half",
    "e4m3": "__nv_fp8_e4m3", "e5m2": "__nv_fp8_e5m2", "i32": "int32_t", "u32": "uint32_t",
    "i8": "int8_t", "u8": "uint8_t",
}

CXX_ARG: dict[str, str] = {
    "u32": "uint32_t", "i32": "int32_t", "u64": "uint64_t", "f32": "float",
    "tensormap": "const pl::TensorMap*",
}


# Sections of the placement struct: (member, contract section). Each holds one
# field per name in that section, so a port and its buffer may share a name.
PLACE_SECTIONS = (("role", "roles"), ("smem", "smem"), ("mbar", "mbarriers"),
                  ("bar", "named_barriers"), ("tmem", "tmem"), ("tune", "tunables"),
                  ("port", "ports"))


def place_fields(bound: BoundContract) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """[(member, [(C++ type, field, contract key)])] of the placement struct, in layout
    order; empty sections are left out."""
    c = bound.contract
    sections = []
    for member, section in PLACE_SECTIONS:
        if section == "roles":
            names = sorted(c.roles)
        elif section == "tunables":
            names = sorted(c.tunables)
        elif section == "ports":
            names = sorted(n for n, p in c.ports.items() if p.kind != "registers")
        else:
            names = sorted(c.section(section))
        fields = [(_place_type(c, section, n), n, f"{section}.{n}") for n in names]
        if fields:
            sections.append((member, fields))
    return sections


def _place_type(c, section: str, name: str) -> str:
    if section == "roles":
        return "pl::RolePlace"
    if section == "ports":
        return "pl::PipePort" if c.ports[name].kind == "smem_pipeline" else "pl::GlobalPort"
    return "uint32_t"


def arg_fields(bound: BoundContract) -> list[tuple[str, str]]:
    """(C++ type, name) of the runtime-argument struct, in declaration order."""
    out = []
    for arg in bound.contract.data.get("args", []):
        if arg["type"] == "ptr":
            dtype = bound.dtype(arg.get("dtype", "u8"), f"args.{arg['name']}.dtype")
            ctype = f"{CXX_DTYPE[dtype]}*"
        else:
            ctype = CXX_ARG[arg["type"]]
        out.append((ctype, arg["name"]))
    return out


def register_ports(bound: BoundContract, role: str) -> list[tuple[str, str, int]]:
    """(C++ element type, port, count) of the register hand-offs a role's entry takes."""
    c = bound.contract
    return [(CXX_DTYPE[bound.dtype(p.dtype, f"ports.{p.name}.dtype")], p.name, bound.eval(p.spec["count"], f"ports.{p.name}.count"))
            for name, p in sorted(c.ports.items())
            if p.kind == "registers" and p.role == role]


def pipeline_ports(bound: BoundContract, role: str) -> list[str]:
    c = bound.contract
    return [n for n, p in sorted(c.ports.items())
            if p.kind == "smem_pipeline" and p.role == role]


def entry_signature(bound: BoundContract, role: str) -> str:
    """Parameter list of a role's per-tile entry."""
    c = bound.name
    regs = "".join(f", {t} (&{n})[{k}]" for t, n, k in register_ports(bound, role))
    return (f"const pl_place_{c}& at, const pl_args_{c}& args, const pl::KernelInfo& k, "
            f"const pl::WorkTile& tile, pl_state_{c}_{role}& st{regs}")


def hook_signature(bound: BoundContract, role: str) -> str:
    c = bound.name
    return (f"const pl_place_{c}& at, const pl_args_{c}& args, const pl::KernelInfo& k, "
            f"pl_state_{c}_{role}& st")


def generate(bound: BoundContract) -> str:
    c = bound.contract
    name = bound.name
    out = [f"// pl_{name}.h: generated from the contract of '{name}' "
           f"(params {bound.params_hash()}); do not edit.",
           "#pragma once", "",
           "#include <cstdint>", "#include <cuda_bf16.h>", "#include <cuda_fp16.h>",
           "#include <cuda_fp8.h>", "",
           '#include "pipelink/pipelink.cuh"', "",
           "// Compile-time params: one object per value set.",
           f"struct pl_params_{name} {{"]
    for key, value in sorted(bound.params.items()):
        if isinstance(value, str) and value in CXX_DTYPE:
            out.append(f"  using {key} = {CXX_DTYPE[value]};  // {value}")
        elif isinstance(value, str):
            out.append(f'  static constexpr const char* {key} = "{value}";')
        else:
            out.append(f"  static constexpr int {key} = {value};")
    out += ["};", "", "// Where the linker put this component: filled in by the glue.",
            f"struct pl_place_{name} {{"]
    for member, fields in place_fields(bound):
        out.append("  struct {")
        out += [f"    {ctype} {field};  // {key}" for ctype, field, key in fields]
        out.append(f"  }} {member};")
    out += ["};", "", "// Runtime arguments, in contract order.", f"struct pl_args_{name} {{"]
    out += [f"  {ctype} {field};" for ctype, field in arg_fields(bound)]
    out += ["};", ""]
    symbols = {k: bound.symbol(v) for k, v in bound.entries().items()}
    for role in sorted(c.roles):
        spec = c.roles[role]
        out.append(f"// Pipeline state of role '{role}', kept by the glue across work tiles.")
        out.append(f"struct pl_state_{name}_{role} {{")
        out += [f"  pl::PipeState {p};" for p in pipeline_ports(bound, role)]
        out += ["};", f"#define {spec.entry} {symbols[role]}",
                f'extern "C" __device__ void {spec.entry}({entry_signature(bound, role)});']
        for hook in ("init", "tail"):
            if getattr(spec, hook):
                out += [f"#define {spec.entry}_{hook} {symbols[f'{role}.{hook}']}",
                        f'extern "C" __device__ void {spec.entry}_{hook}'
                        f"({hook_signature(bound, role)});"]
        out.append("")
    if c.kind == "scheduler":
        out += [f"#define pl_{name}_tile {symbols['tile']}",
                f'extern "C" __device__ pl::WorkTile pl_{name}_tile('
                f"const pl_place_{name}& at, const pl_args_{name}& args, uint32_t iteration);", ""]
    return "\n".join(out)
