"""The generated references: ``docs/contract-reference.md`` and ``docs/recipe-reference.md``.

    python -m pipelink.docs            # rewrite both under the current folder
    python -m pipelink.docs --check    # exit 1, naming them, if either is stale

Both come from :mod:`pipelink.schema` (and the contract one from the expression language
in :mod:`pipelink.expr`), so what the docs say a file may contain is what validation
accepts. ``tests/unit/test_docs.py`` fails when a committed copy drifts.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from . import expr
from .schema import CONTRACT_SCHEMA, RECIPE_SCHEMA, markdown_reference


def contract_reference() -> str:
    return markdown_reference(CONTRACT_SCHEMA, "Contract reference") + _expressions()


def recipe_reference() -> str:
    return markdown_reference(RECIPE_SCHEMA, "Recipe reference") + _launch_expressions()


def _expressions() -> str:
    dtypes = ", ".join(f"`{d}` ({n} B)" for d, n in expr.DTYPE_BYTES.items())
    return "\n".join([
        "", "## Expressions", "",
        "A field typed *integer or string* takes an integer or an integer expression over",
        "the contract's params and tunables, e.g. `stages*rows*cols*sizeof(dtype)`. It may",
        "use integer literals, names, unary `+ -`, `+ - * // % **` and the functions",
        "`min`, `max`, `ceil_div(a, b)`, `align_up(a, b)`, `pow2_ceil(a)` (the least power",
        "of two >= a) and `sizeof(dtype)`, and one choice, `a if p == 'word' else b` (`==`",
        "or `!=` against a quoted word or an integer). Nothing else parses: no attributes,",
        "calls of other functions, other comparisons or true division. A named barrier's",
        "`when` is a condition: that comparison alone, e.g. `tile_m == 192`, over params.",
        "A `requires` rule's `check` is one comparison of two such expressions over params",
        "(`< <= > >= == !=`, e.g. `head_dim % 64 == 0`; `==` and `!=` also of a word param",
        "and a quoted word, `dtype == 'bf16'`) or `expression in (a, b, ...)` over integers;",
        "a recipe whose params break one is refused as it binds them, with its `why`, before",
        "anything compiles.",
        f"Expressions are at most {expr.MAX_EXPR_CHARS} characters; every value stays below",
        "2^64 in magnitude and exponents within 0..64. Fields the placer or the header",
        "need as one number per object (warps, registers, align, threads, when, count,",
        "shape, arrivals, consumer_arrivals, slots, readers, multicast, cta_group, box,",
        "swizzle, an argument's max, counters, scratch, cluster) may read params only,",
        "not tunables.", "",
        f"dtypes: {dtypes}.", ""])


def _launch_expressions() -> str:
    funcs = ", ".join(f"`{f}`" for f in expr.HOST_FUNCS)
    return "\n".join([
        "", "## Launch expressions", "",
        "Shapes, binds, the grid, require and dispatch conditions and contents bounds are",
        "integer expressions over the sizes (input dimensions, scalars, `num_sms`,",
        "`l2_bytes`), which the host evaluates at every call: integer literals, names,",
        f"unary `+ -`, `+ - * // % **` and {funcs}. A contract's `sizeof`,",
        "`pow2_ceil` and choices (`a if p == 'word' else b`) are not among them, and",
        "`pipelink check` refuses a division by a constant zero.", ""])


REFERENCES: dict[str, Callable[[], str]] = {
    "docs/contract-reference.md": contract_reference,
    "docs/recipe-reference.md": recipe_reference,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelink.docs",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("root", nargs="?", default=".", help="the checkout (default: .)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a committed reference is stale")
    args = parser.parse_args(argv)
    stale = []
    for rel, render in REFERENCES.items():
        path = Path(args.root) / rel
        text = render()
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(rel)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {rel}")
    if stale:
        print("stale: " + ", ".join(stale) + " (run python -m pipelink.docs)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
