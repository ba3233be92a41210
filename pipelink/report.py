"""Readable views of a placement: :func:`explain` (a text map) and :func:`svg` (a picture).

Both are pure functions of the problem and the placement, so the same placement always
gives the same bytes (``placement.svg`` sits beside the cubin in reproducible builds).
"""

from __future__ import annotations

from html import escape

from .place import fmt_bytes
from .problem import ARCH_LIMITS, WARPGROUP_WARPS, Placement, Problem


def _phases(problem: Problem) -> int:
    lives = [x.live for x in (*problem.buffers, *problem.barriers) if x.live is not None]
    return max([1] + [live[1] for live in lives])


def _live_text(live: tuple[int, int] | None) -> str:
    if live is None:
        return "all"
    first, last = live
    return f"{first}" if last == first + 1 else f"{first}-{last - 1}"


def _table(rows: list[list[str]], right: frozenset[int] = frozenset()) -> list[str]:
    """Columns padded to their widest cell; ``right`` columns aligned right."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.rjust(w) if i in right else c.ljust(w)
                             for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
            for r in rows]


def explain(problem: Problem, placement: Placement) -> str:
    """The placement as text: totals, tunables, the shared-memory map in address order
    (gaps shown), named barriers, warpgroups with their roles and registers, and Tensor
    Memory columns. Every line that stands for a demand names its source."""
    p, limits = placement, ARCH_LIMITS[problem.arch]
    out = [f"placement for {problem.arch}: {p.warps} warps ({p.threads} threads, "
           f"{len(p.warpgroup_regs)} warpgroups), {fmt_bytes(p.smem_bytes)} of "
           f"{fmt_bytes(limits['smem_bytes'])} shared memory"]
    if p.solver:
        objective = p.solver.get("objective", {})
        extra = ", ".join(f"{k} {v}" for k, v in sorted(objective.items())) \
            if isinstance(objective, dict) else ""
        out.append(f"solver: {p.solver.get('status', '?')}" + (f" ({extra})" if extra else ""))
    out += _tunables(problem, p)
    out += _smem(problem, p)
    out += _barriers(problem, p)
    out += _warps(problem, p)
    out += _tmem(problem, p)
    return "\n".join(out) + "\n"


def _tunables(problem: Problem, p: Placement) -> list[str]:
    if not problem.tunables:
        return []
    rows = [["name", "value", "allowed", "weight", "source"]]
    for t in problem.tunables:
        allowed = ",".join(map(str, t.values))
        rows.append([t.name, str(p.tunables[t.name]), allowed, str(t.weight), t.source])
    ties = [f"  {a} = {b} (tied)" for a, b in dict.fromkeys(problem.equal)]
    return ["", "tunables", *_table(rows, frozenset({1, 3})), *ties]


def _smem(problem: Problem, p: Placement) -> list[str]:
    if not problem.buffers:
        return []
    buffers = {b.name: b for b in problem.buffers}
    shared = {b: a for a, b in problem.shared}
    rows = [["offset", "end", "size", "phases", "buffer", "source"]]
    at = 0
    for name, (offset, size) in sorted(p.smem.items(), key=lambda kv: (kv[1][0], kv[0])):
        if offset > at:
            rows.append([f"{at:#07x}", f"{offset:#07x}", fmt_bytes(offset - at), "", "(free)",
                         ""])
        b = buffers[name]
        label = f"{name} (= {shared[name]}, zero-copy)" if name in shared else name
        rows.append([f"{offset:#07x}", f"{offset + size:#07x}", fmt_bytes(size),
                     _live_text(b.live), label, b.source])
        at = max(at, offset + size)
    return ["", f"shared memory, address order ({fmt_bytes(p.smem_bytes)} = "
                f"{p.smem_bytes} bytes dynamic)", *_table(rows, frozenset({2}))]


def _barriers(problem: Problem, p: Placement) -> list[str]:
    if not problem.barriers:
        return []
    rows = [["id", "barrier", "threads", "phases", "source"]]
    for b in sorted(problem.barriers, key=lambda b: (p.barriers[b.name], b.name)):
        fixed = " (fixed)" if b.fixed is not None else ""
        rows.append([str(p.barriers[b.name]), b.name + fixed, str(b.threads),
                     _live_text(b.live), b.source])
    return ["", "named barriers (0 is __syncthreads)", *_table(rows, frozenset({0, 2}))]


def _warps(problem: Problem, p: Placement) -> list[str]:
    if not problem.roles:
        return []
    rows = [["warps", "role", "needs", "gets", "source"]]
    roles = {r.name: r for r in problem.roles}
    for name, slot in sorted(p.roles.items(), key=lambda kv: (kv[1].warp_base, kv[0])):
        r = roles[name]
        last = slot.warp_base + slot.warps - 1
        span = f"{slot.warp_base}" if last == slot.warp_base else f"{slot.warp_base}-{last}"
        groups = range(slot.warp_base // WARPGROUP_WARPS, last // WARPGROUP_WARPS + 1)
        gets = min(p.warpgroup_regs[w] for w in groups)
        kind = ", whole warpgroups" if r.warpgroup else ""
        rows.append([span, f"{name}{kind}", str(r.registers), str(gets), r.source])
    groups = [f"  warpgroup {w} (warps {w * WARPGROUP_WARPS}-{(w + 1) * WARPGROUP_WARPS - 1}):"
              f" setmaxnreg {regs}" for w, regs in enumerate(p.warpgroup_regs)]
    launch = (f"  launch: __launch_bounds__({p.threads}, 1) gives {p.launch_regs} registers "
              f"per thread; setmaxnreg values sum to {sum(p.warpgroup_regs)}")
    return ["", "warps and registers (registers per thread)", *_table(rows, frozenset({2, 3})),
            *groups, launch]


def _tmem(problem: Problem, p: Placement) -> list[str]:
    if not problem.tmem:
        return []
    rows = [["columns", "allocation", "source"]]
    sources = {t.name: t.source for t in problem.tmem}
    for name, (col, cols) in sorted(p.tmem.items(), key=lambda kv: (kv[1][0], kv[0])):
        rows.append([f"{col}-{col + cols - 1}", f"{name} ({cols})", sources[name]])
    return ["", "tensor memory", *_table(rows)]


# -- picture ------------------------------------------------------------------------------

WIDTH, MARGIN, ROW = 960, 48, 28
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac")


def _instance(name: str) -> str:
    return name.split(".", 1)[0]


def svg(problem: Problem, placement: Placement) -> str:
    """A self-contained SVG: shared memory as address x phase rectangles (one colour per
    instance), then warps as bars under their warpgroups' setmaxnreg values. Integer
    coordinates only, so the text is the same on every machine."""
    p, limits = placement, ARCH_LIMITS[problem.arch]
    instances = sorted({_instance(n) for n in (*p.smem, *p.roles, *p.barriers)})
    colour = {inst: PALETTE[i % len(PALETTE)] for i, inst in enumerate(instances)}
    phases = _phases(problem)
    span = WIDTH - 2 * MARGIN
    limit = limits["smem_bytes"]
    body: list[str] = []

    def x_of(addr: int) -> int:
        return MARGIN + addr * span // limit

    top = 40
    body.append(_text(MARGIN, top - 12, f"shared memory ({problem.arch}): "
                      f"{fmt_bytes(p.smem_bytes)} of {fmt_bytes(limit)}, address across, "
                      "phase down", 13, "bold"))
    height = phases * ROW
    body.append(f'<rect x="{MARGIN}" y="{top}" width="{span}" height="{height}" '
                f'fill="#f4f4f4" stroke="#888"/>')
    lives = {b.name: b.live for b in problem.buffers}
    for name, (offset, size) in sorted(p.smem.items(), key=lambda kv: (kv[1][0], kv[0])):
        first, last = lives[name] or (0, phases)
        x0, x1 = x_of(offset), max(x_of(offset + size), x_of(offset) + 1)
        y0 = top + first * ROW
        body.append(f'<rect x="{x0}" y="{y0 + 2}" width="{x1 - x0}" '
                    f'height="{(last - first) * ROW - 4}" fill="{colour[_instance(name)]}" '
                    f'stroke="#222" stroke-width="0.5"><title>{escape(name)}: offset {offset},'
                    f' {size} bytes, phases {_live_text(lives[name])}</title></rect>')
        if x1 - x0 >= 7 * len(name):
            body.append(_text(x0 + 3, y0 + ROW // 2 + 4, name, 11, fill="#fff"))
    peak = x_of(p.smem_bytes)
    body.append(f'<line x1="{peak}" y1="{top - 4}" x2="{peak}" y2="{top + height + 4}" '
                f'stroke="#c00" stroke-dasharray="4 2"/>')
    for ph in range(phases):
        body.append(_text(MARGIN - 6, top + ph * ROW + ROW // 2 + 4, str(ph), 10, anchor="end"))
    for k in range(0, limit + 1, 32 * 1024):
        body.append(_text(x_of(k), top + height + 14, f"{k // 1024}K", 10, anchor="middle"))
    top += height + 52
    top = _warp_panel(problem, p, body, top, colour)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{top}" '
            f'viewBox="0 0 {WIDTH} {top}" font-family="monospace">\n'
            + "\n".join(body) + "\n</svg>\n")


def _warp_panel(problem: Problem, p: Placement, body: list[str], top: int,
                colour: dict[str, str]) -> int:
    most = ARCH_LIMITS[problem.arch]["max_warps"]
    span = WIDTH - 2 * MARGIN
    cell = span // most
    body.append(_text(MARGIN, top - 12, f"warps: {p.threads} threads, launch "
                      f"{p.launch_regs} registers per thread; setmaxnreg per warpgroup",
                      13, "bold"))
    for w, regs in enumerate(p.warpgroup_regs):
        x = MARGIN + w * WARPGROUP_WARPS * cell
        body.append(f'<rect x="{x}" y="{top}" width="{WARPGROUP_WARPS * cell}" height="{ROW}" '
                    f'fill="#eee" stroke="#888"/>')
        body.append(_text(x + 4, top + ROW // 2 + 4, f"wg{w}: {regs} regs", 11))
    top += ROW + 4
    for name, slot in sorted(p.roles.items(), key=lambda kv: (kv[1].warp_base, kv[0])):
        x = MARGIN + slot.warp_base * cell
        body.append(f'<rect x="{x}" y="{top}" width="{slot.warps * cell}" height="{ROW}" '
                    f'fill="{colour[_instance(name)]}" stroke="#222" stroke-width="0.5">'
                    f'<title>{escape(name)}: warps {slot.warp_base}..'
                    f'{slot.warp_base + slot.warps - 1}</title></rect>')
        body.append(_text(x + 3, top + ROW // 2 + 4, name, 10))
        top += ROW + 2
    for k in range(0, most + 1, WARPGROUP_WARPS):
        body.append(_text(MARGIN + k * cell, top + 12, str(k), 10, anchor="middle"))
    return top + 28


def _text(x: int, y: int, text: str, size: int, weight: str = "normal", fill: str = "#111",
          anchor: str = "start") -> str:
    return (f'<text x="{x}" y="{y}" font-size="{size}" font-weight="{weight}" fill="{fill}" '
            f'text-anchor="{anchor}">{escape(text)}</text>')

