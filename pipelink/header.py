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

from .contract import RING_PORTS, BoundContract, Contract
from .interfaces import INTERFACES, Function

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
                  ("port", "ports"), ("counter", "counters"), ("scratch", "scratch"))


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
            # The glue owns register hand-offs and the work ring; functions are symbols.
            names = sorted(n for n, p in c.ports.items()
                           if p.kind not in ("registers", "work", "function"))
        else:
            names = sorted(c.section(section))
        fields = [(_place_type(c, section, n), n, f"{section}.{n}") for n in names]
        if fields:
            sections.append((member, fields))
    return sections


def _place_type(c: Contract, section: str, name: str) -> str:
    if section == "roles":
        return "pl::RolePlace"
    if section == "ports":
        return {"smem_pipeline": "pl::PipePort", "tmem": "pl::TmemPort"}.get(
            c.ports[name].kind, "pl::GlobalPort")
    return "uint32_t"   # offsets, ids, counts; a counter's byte offset in the workspace


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
    return [(CXX_DTYPE[bound.dtype(p.dtype, f"ports.{p.name}.dtype")], p.name,
             bound.eval(p.spec["count"], f"ports.{p.name}.count"))
            for _, p in sorted(c.ports.items())
            if p.kind == "registers" and p.role == role]


def pipeline_ports(bound: BoundContract, role: str) -> list[str]:
    c = bound.contract
    return [n for n, p in sorted(c.ports.items())
            if p.kind in RING_PORTS and p.role == role]


def function_of(c: Contract, port: str, function: str) -> Function:
    """One function of the interface a function port names."""
    return next(f for f in INTERFACES[c.ports[port].spec["interface"]].functions
                if f.name == function)


def type_names(bound: BoundContract) -> dict[str, str]:
    """Type names a bound contract's header defines, unique per params hash so the
    glue (and a monolithic build) can hold two param sets of one component."""
    c, h = bound.name, bound.params_hash()
    names = {"params": f"pl_params_{c}_{h}", "place": f"pl_place_{c}_{h}",
             "args": f"pl_args_{c}_{h}"}
    names.update({f"state.{r}": f"pl_state_{c}_{r}_{h}" for r in bound.contract.roles})
    return names


def schedules(bound: BoundContract, role: str) -> bool:
    """Whether a role produces the kernel's work records (its entry returns one)."""
    return any(p.kind == "work" and p.dir == "out" and p.role == role
               for p in bound.contract.ports.values())


def leading_parameters(place: str, args: str, names: bool = True) -> str:
    """What every role entry and every provided function takes first: the component's
    placement, its arguments and the kernel's info (types alone with names=False)."""
    parts = ((f"const {place}&", "at"), (f"const {args}&", "args"), ("const pl::KernelInfo&", "k"))
    return ", ".join(f"{ctype} {name}" if names else ctype for ctype, name in parts)


def entry_signature(bound: BoundContract, role: str) -> str:
    """Parameter list of a role's per-tile entry (a scheduler role's: per record)."""
    t = type_names(bound)
    first = leading_parameters(t["place"], t["args"])
    if schedules(bound, role):
        return f"{first}, uint32_t iteration, {t[f'state.{role}']}& st"
    regs = "".join(f", {ct} (&{n})[{k}]" for ct, n, k in register_ports(bound, role))
    return f"{first}, const pl::WorkTile& tile, {t[f'state.{role}']}& st{regs}"


def hook_signature(bound: BoundContract, role: str) -> str:
    t = type_names(bound)
    return f"{leading_parameters(t['place'], t['args'])}, {t[f'state.{role}']}& st"


def generate(bound: BoundContract) -> str:
    """The header. Types and entries carry the params hash; outside the glue
    (``PL_GLUE`` undefined) plain aliases let the component say ``pl_place_<c>``
    and define ``pl_<c>_<role>``."""
    c = bound.contract
    name = bound.name
    t = type_names(bound)
    guard = f"PL_HEADER_{name.upper()}_{bound.params_hash().upper()}"
    out = [f"// pl_{name}.h: generated from the contract of '{name}' "
           f"(params {bound.params_hash()}); do not edit.",
           f"#ifndef {guard}", f"#define {guard}", "",
           "#include <cstdint>", "#include <cuda_bf16.h>", "#include <cuda_fp16.h>",
           "#include <cuda_fp8.h>", "",
           '#include "pipelink/pipelink.cuh"', "",
           "// Compile-time params: one object per value set.",
           f"struct {t['params']} {{"]
    for key, value in sorted(bound.params.items()):
        if isinstance(value, str) and value in CXX_DTYPE:
            out.append(f"  using {key} = {CXX_DTYPE[value]};  // {value}")
        elif isinstance(value, str):
            out.append(f'  static constexpr const char* {key} = "{value}";')
        else:
            out.append(f"  static constexpr int {key} = {value};")
    out += ["};", "", "// Where the linker put this component: filled in by the glue.",
            f"struct {t['place']} {{"]
    for member, fields in place_fields(bound):
        out.append("  struct {")
        out += [f"    {ctype} {field};  // {key}" for ctype, field, key in fields]
        out.append(f"  }} {member};")
    out += ["};", "", "// Runtime arguments, in contract order.", f"struct {t['args']} {{"]
    out += [f"  {ctype} {field};" for ctype, field in arg_fields(bound)]
    out += ["};", ""]
    symbols = {k: bound.symbol(v) for k, v in bound.entries().items()}
    aliases = [f"using pl_params_{name} = {t['params']};",
               f"using pl_place_{name} = {t['place']};", f"using pl_args_{name} = {t['args']};"]
    for role in sorted(c.roles):
        spec = c.roles[role]
        out.append(f"// Pipeline state of role '{role}', kept by the glue across work tiles.")
        out.append(f"struct {t[f'state.{role}']} {{")
        out += [f"  pl::PipeState {p};" for p in pipeline_ports(bound, role)]
        out += [f"  pl::PipeState {s};  // roles.{role}.state" for s in spec.state]
        returns = "pl::WorkTile" if schedules(bound, role) else "void"
        out += ["};", f'extern "C" __device__ {returns} {symbols[role]}'
                      f"({entry_signature(bound, role)});"]
        aliases += [f"using pl_state_{name}_{role} = {t[f'state.{role}']};",
                    f"#undef {spec.entry}", f"#define {spec.entry} {symbols[role]}"]
        for hook in ("init", "tail"):
            if getattr(spec, hook):
                out.append(f'extern "C" __device__ void {symbols[f"{role}.{hook}"]}'
                           f"({hook_signature(bound, role)});")
                aliases += [f"#undef {spec.entry}_{hook}",
                            f"#define {spec.entry}_{hook} {symbols[f'{role}.{hook}']}"]
        out.append("")
    for direction in ("in", "out"):
        for key, name_ in bound.functions(direction).items():
            port, fn = key.split(".")
            f = function_of(c, port, fn)
            first = ("const pl::KernelInfo& k" if direction == "in" else
                     leading_parameters(t["place"], t["args"]))
            what = ("calls; the glue forwards it to the connected provider" if direction == "in"
                    else "provides")
            out += [f"// Function '{fn}' of interface '{c.ports[port].spec['interface']}' that "
                    f"port '{port}' {what}.",
                    f'extern "C" __device__ {f.returns} {bound.symbol(name_)}'
                    f"({f.signature(first)});"]
            aliases += [f"#undef {name_}", f"#define {name_} {bound.symbol(name_)}"]
    out += ["", "// Plain names for the component's own source.", "#ifndef PL_GLUE", *aliases,
            "#endif", "", f"#endif  // {guard}", ""]
    return "\n".join(out)
