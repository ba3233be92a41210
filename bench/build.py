"""Build-system benchmark: the SCons plugin on the largest recipe, as a user meets it.

    python bench/build.py [--recipe NAME] [--arch sm_90a] [--repeat 3] [--no-write]

Copies this checkout's build inputs (SConstruct, site_scons, pipelink, components,
recipes) to a temporary folder and runs ``python -m SCons -Q`` there with a fresh cache
and a fresh compile stage:

- clean build: empty cache, every component compiles and the kernel links;
- no-op rebuild: nothing changed (median of --repeat);
- one-component rebuild: one component's source edited; it recompiles, the kernel relinks;
- full-cache build: a second copy of the checkout, no build/, on the same cache;
- ``mode=release`` of every recipe for every arch on an empty cache, then a no-op.

Then the link step alone, in this process, split the way ``link_kernel`` times it
(check, place, glue = generate + nvcc, nvJitLink = cubin + the PTX it verifies), median
of --repeat. Prints a table and writes it under "## Build" in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipelink.build import default_index  # noqa: E402
from pipelink.errors import PipeLinkError  # noqa: E402
from pipelink.recipe import load_recipe  # noqa: E402
from pipelink.toolchain import discover  # noqa: E402

TREE = ("SConstruct", "site_scons", "pipelink", "components", "recipes")
NOOP_TARGET_S = 1.5
LINK_TARGET_S = 3.0


def copy_tree(dest: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    dest.mkdir(parents=True)
    for name in TREE:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        else:
            shutil.copy(src, dest / name)
    return dest


def scons(tree: Path, env: dict[str, str], *args: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "SCons", "-Q", "-C", str(tree), *args],
                          capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"scons failed in {tree}:\n{proc.stdout}{proc.stderr}")
    return wall, proc.stdout


def largest_recipe(arch: str) -> str:
    """The recipe with the most instances (then the most distinct objects) for arch."""
    from pipelink.sconsrun import plan
    best, key = None, (-1, -1)
    for path in sorted((ROOT / "recipes").glob("*.yaml")):
        try:
            p = plan(path, arch, default_index(ROOT))
        except PipeLinkError:
            continue
        size = (len(p.objects), len({o.object_name for o in p.objects.values()}))
        if size > key:
            best, key = path.stem, size
    if best is None:
        sys.exit(f"no recipe builds for {arch}")
    return best


def link_split(tree: Path, recipe_name: str, arch: str, repeat: int) -> dict[str, float]:
    """Median seconds of each link stage, in process, on the objects scons built."""
    from pipelink.glue import generate
    from pipelink.link import LinkOptions, link_kernel
    from pipelink.sconsrun import plan
    index = default_index(tree)
    recipe_path = tree / "recipes" / f"{recipe_name}.yaml"
    p = plan(recipe_path, arch, index)
    objects = {inst: tree / "build" / "obj" / arch / o.object_name
               for inst, o in p.objects.items()}
    recipe = load_recipe(recipe_path)
    runs: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as out:
        for _ in range(repeat):
            t0 = time.perf_counter()
            result = link_kernel(recipe, objects, out, LinkOptions(arch), index=index)
            total = time.perf_counter() - t0
            t0 = time.perf_counter()
            generate(result.kernel, result.placement)
            gen = time.perf_counter() - t0
            for key, value in {**result.timings, "glue_generate": gen,
                               "total": total}.items():
                runs.setdefault(key, []).append(value)
    return {k: statistics.median(v) for k, v in runs.items()}


def machine() -> str:
    model = ""
    try:
        found = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        model = found.group(1).strip() if found else ""
    except OSError:
        pass
    tc = discover()
    load = os.getloadavg()[0]  # other work on the machine slows the compile-bound rows
    return (f"{os.cpu_count()} cores{f' ({model})' if model else ''}, "
            f"nvcc {tc.versions()['nvcc']}, nvJitLink {tc.versions()['nvjitlink']}, "
            f"Python {platform.python_version()}; 1-minute load average {load:.1f} "
            "before the run")


def table(recipe: str, arch: str, n_objects: int, touched: str, times: dict[str, float],
          split: dict[str, float], repeat: int,
          release: tuple[int, int, float, float] | None = None, host: str = "") -> str:
    ms = lambda s: f"{s * 1000:.0f} ms"  # noqa: E731
    s = lambda v: f"{v:.2f} s"  # noqa: E731
    excl = split["check"] + split["place"] + split["glue_generate"] + split["nvjitlink"]
    rows = [
        ("clean build (empty cache)", s(times["clean"]), ""),
        ("no-op rebuild", s(times["noop"]), f"< {NOOP_TARGET_S} s"),
        (f"one-component rebuild (`{touched}` edited)", s(times["one"]), ""),
        ("full-cache build (second checkout)", s(times["cached"]), ""),
        ("link: check", ms(split["check"]), ""),
        ("link: place (CP-SAT)", ms(split["place"]), ""),
        ("link: glue (generate + nvcc)", ms(split["glue"]),
         f"generate alone {ms(split['glue_generate'])}"),
        ("link: nvJitLink (cubin + verified PTX)", ms(split["nvjitlink"]), ""),
        ("link step, excluding nvcc", ms(excl), f"< {LINK_TARGET_S:.0f} s"),
    ]
    if release:
        kernels, objects, clean_s, noop_s = release
        rows += [(f"`mode=release`, every recipe and arch ({kernels} kernels, {objects} "
                  "objects), empty cache", s(clean_s), ""),
                 ("`mode=release` no-op rebuild", s(noop_s), "")]
    out = [f"`python bench/build.py`: recipe `{recipe}` ({n_objects} objects) for {arch}, "
           f"`scons -j{os.cpu_count()}` in a fresh copy of the checkout with a fresh cache "
           f"and stage; link split is the median of {repeat} in-process links. "
           f"Machine: {host or machine()}.", "",
           "| step | time | target / note |", "|---|---|---|"]
    out += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(out) + "\n"


def write_section(path: Path, heading: str, body: str) -> None:
    """Replaces (or appends) one '## ' section of a Markdown file, leaving the rest."""
    text = path.read_text() if path.exists() else "# Results\n"
    lines = text.splitlines(keepends=True)
    section = [f"{heading}\n", "\n", body]
    starts = [i for i, line in enumerate(lines) if line.rstrip("\n") == heading]
    if starts:
        start = starts[0]
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
                   len(lines))
        tail = ["\n"] if end < len(lines) else []
        lines[start:end] = section + tail
    else:
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        lines += ["\n", *section]
    path.write_text("".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", help="default: the largest recipe")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument("--no-release", action="store_true",
                    help="skip timing a release build of every recipe")
    a = ap.parse_args()
    host = machine()
    recipe = a.recipe or largest_recipe(a.arch)
    with tempfile.TemporaryDirectory(prefix="pipelink-bench-") as tmp:
        tmp = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINK_")}
        env.update(PIPELINK_CACHE=str(tmp / "cache"), PIPELINK_STAGE=str(tmp / "stage"))
        os.environ["PIPELINK_STAGE"] = env["PIPELINK_STAGE"]
        args = (f"recipe={recipe}", f"arch={a.arch}")
        first = copy_tree(tmp / "one")
        times = {}
        times["clean"], out = scons(first, env, *args)
        n_objects = len(re.findall(r"^compile  ", out, re.M))
        times["noop"] = statistics.median(scons(first, env, *args)[0] for _ in range(a.repeat))
        from pipelink.sconsrun import plan
        p = plan(first / "recipes" / f"{recipe}.yaml", a.arch, default_index(first))
        counts: dict[str, int] = {}
        for o in {o.object_name: o for o in p.objects.values()}.values():
            counts[o.component] = counts.get(o.component, 0) + 1
        touched = min(counts, key=lambda c: (counts[c], c))  # one object to recompile
        obj = next(o for o in p.objects.values() if o.component == touched)
        with open(obj.source, "a") as f:
            f.write("\n// bench: edited\n")
        times["one"], out = scons(first, env, *args)
        assert len(re.findall(r"^compile  ", out, re.M)) == counts[touched], out
        times["cached"], out = scons(copy_tree(tmp / "two"), env, *args)
        assert not re.findall(r"^compile  ", out, re.M), out
        split = link_split(first, recipe, a.arch, a.repeat)
        release = None
        if not a.no_release:  # every recipe for every arch, on its own empty cache
            rel_env = {**env, "PIPELINK_CACHE": str(tmp / "cache-release")}
            third = copy_tree(tmp / "three")
            clean_s, out = scons(third, rel_env, "mode=release")
            kernels = int(re.search(r"(\d+) kernels?:", out).group(1))
            objects = int(re.search(r"(\d+) objects", out).group(1))
            noop_s = statistics.median(scons(third, rel_env, "mode=release")[0]
                                       for _ in range(a.repeat))
            release = (kernels, objects, clean_s, noop_s)
    text = table(recipe, a.arch, n_objects, touched, times, split, a.repeat, release, host)
    print(text)
    if not a.no_write:
        write_section(ROOT / "bench" / "RESULTS.md", "## Build", text)


if __name__ == "__main__":
    main()
