"""Multi-kernel recipes with real nvcc and nvJitLink, no GPU: ``linear`` (forward, dgrad,
wgrad) links for sm_90a and sm_100a into one folder per kernel beside kernels.json; the
kernels share the objects their params share and keep distinct entries; dgrad and
wgrad read their transposed operands MN-major, in place; the CLI's ``--kernel`` picks one;
SCons builds a multi-kernel recipe, shares objects between its kernels, rebuilds
nothing the second time, and stops on a bad autograd section before compiling."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from pipelink import cli
from pipelink.build import build_objects, default_index
from pipelink.link import LinkOptions, kernels_index, link_recipe
from pipelink.recipe import MAIN, load_recipe

from .sass import sass, sass_instructions
from .test_scons import hashes, make_tree  # noqa: F401  (a fixture)

ROOT = Path(__file__).resolve().parents[2]
ARCHS = ("sm_90a", "sm_100a")
KERNELS = ("forward", "dgrad", "wgrad")
OUTPUTS = {"kernel.json", "placement.json", "placement.svg", "glue.cu"}
MMA = {"sm_90a": "HGMMA", "sm_100a": "UTC"}      # the mainloop's SASS, per arch

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")


@pytest.fixture(scope="module")
def linear(tmp_path_factory: pytest.TempPathFactory, object_dir: Path) -> dict[str, Path]:
    """arch -> the folder linear.yaml linked into."""
    out = tmp_path_factory.mktemp("linear")
    index = default_index(ROOT)
    recipe = load_recipe(ROOT / "recipes" / "linear.yaml")
    folders, objects = {}, {}
    for arch in ARCHS:
        objects[arch] = {k: build_objects(view, arch, index, object_dir)
                         for k, view in recipe.kernels().items()}
        link_recipe(recipe, objects[arch], out / arch, LinkOptions(arch), index=index)
        folders[arch] = out / arch
    # The yardsticks: dgrad as one translation unit, and gemm.yaml (the same pipeline).
    link_recipe(recipe, objects["sm_90a"], out / "mono", LinkOptions("sm_90a", mode="mono"),
                kernels=["dgrad"], index=index)
    gemm = load_recipe(ROOT / "recipes" / "gemm.yaml")
    link_recipe(gemm, {MAIN: build_objects(gemm, "sm_90a", index, object_dir)},
                out / "gemm", LinkOptions("sm_90a"), index=index)
    folders["mono"], folders["gemm"] = out / "mono", out / "gemm"
    return folders


@pytest.mark.parametrize("arch", ARCHS)
def test_each_kernel_links_into_its_own_folder(linear, arch):
    folder = linear[arch]
    assert sorted(p.name for p in folder.iterdir() if p.name != "obj") == \
        sorted([*KERNELS, "kernels.json"])
    for kernel in KERNELS:
        assert {p.name for p in (folder / kernel).iterdir()} == \
            OUTPUTS | {f"linear_{kernel}.cubin"}


@pytest.mark.parametrize("arch", ARCHS)
def test_kernels_json_indexes_them(linear, arch):
    text = (linear[arch] / "kernels.json").read_text()
    assert text == kernels_index(load_recipe(ROOT / "recipes" / "linear.yaml"), arch)
    doc = json.loads(text)
    assert (doc["format"], doc["recipe"], doc["arch"]) == (1, "linear", arch)
    assert doc["kernels"] == {k: k for k in KERNELS}
    assert doc["autograd"]["grads"]["x"] == {"kernel": "dgrad", "inputs": ["grad.y", "w"],
                                             "output": "dx"}
    assert doc["autograd"]["grads"]["w"] == {"kernel": "wgrad", "inputs": ["grad.y", "x"],
                                             "output": "dw"}


@pytest.mark.parametrize("arch", ARCHS)
def test_kernels_share_objects_and_keep_distinct_entries(linear, arch):
    metas = {k: json.loads((linear[arch] / k / "kernel.json").read_text()) for k in KERNELS}
    for kernel, meta in metas.items():
        assert (meta["recipe"], meta["kernel"], meta["cubin"], meta["entry"]) == \
            ("linear", kernel, f"linear_{kernel}.cubin", f"pl_linear_{kernel}")
        cubin = (linear[arch] / kernel / meta["cubin"]).read_bytes()
        assert f"pl_linear_{kernel}".encode() in cubin
    # One object per (component, params, arch): the scheduler and the epilogue are the
    # same LTO-IR in all three; the loader and the mainloop differ by operand majorness.
    objects = {k: m["inputs"] for k, m in metas.items()}
    for instance in ("sched", "store"):
        assert len({o[instance] for o in objects.values()}) == 1, instance
    for instance in ("load", "mma"):
        assert len({o[instance] for o in objects.values()}) == 3, instance
    assert [m["launch"]["inputs"][0]["name"] for m in metas.values()] == ["x", "dy", "dy"]


@pytest.mark.parametrize("arch", ARCHS)
def test_every_kernel_runs_the_arch_mainloop(linear, arch):
    for kernel in KERNELS:
        ops = sass_instructions(linear[arch] / kernel / f"linear_{kernel}.cubin")
        assert any(op.startswith(MMA[arch]) for op in ops), (arch, kernel)


def test_forward_is_the_gemm_kernel_and_dgrad_matches_monolithic(linear):
    """forward: the components and params of gemm.yaml, other binds: the same
    instructions. dgrad reads B MN-major, wgrad A and B: the transpose bits are set on
    every HGMMA, and an MN-major 256-wide B stage is four TMA boxes. dgrad links as its
    monolithic build does."""
    gemm = sass_instructions(linear["gemm"] / "gemm.cubin")
    kernel_sass = {k: sass(linear["sm_90a"] / k / f"linear_{k}.cubin") for k in KERNELS}
    assert sass_instructions(linear["sm_90a"] / "forward" / "linear_forward.cubin") == gemm
    expect = {"forward": "", "dgrad": ".tnspB", "wgrad": ".tnspA.tnspB"}
    for kernel, bits in expect.items():
        mmas = [line for line in kernel_sass[kernel].splitlines() if "HGMMA" in line]
        assert mmas and all(f"]{bits}," in line for line in mmas), (kernel, mmas[:1])
        loads = kernel_sass[kernel].count("UTMALDG.3D")      # B's: 1 box, or 4 MN-major
        assert loads == (1 if kernel == "forward" else 4), (kernel, loads)
    mono = linear["mono"] / "dgrad" / "linear_dgrad.cubin"
    assert sorted(sass_instructions(mono)) == \
        sorted(sass_instructions(linear["sm_90a"] / "dgrad" / "linear_dgrad.cubin"))
    assert not (linear["mono"] / "forward").exists()     # --kernel dgrad linked dgrad only
    assert (linear["mono"] / "kernels.json").is_file()


def test_cli_checks_one_kernel_or_all(linear, capsys):
    build = str(linear["sm_90a"].parent / "obj" / "sm_90a")   # the fixture's objects
    recipe = str(ROOT / "recipes" / "linear.yaml")
    assert cli.main(["check", recipe, "--arch", "sm_90a", "--build", build,
                     "--kernel", "dgrad"]) == 0
    out = capsys.readouterr().out
    assert "linear/dgrad (sm_90a): ok" in out and "linear/forward" not in out
    assert "linear autograd: ok; forward forward, dx by dgrad, dw by wgrad" in out
    assert cli.main(["check", recipe, "--arch", "sm_90a", "--build", build]) == 0
    out = capsys.readouterr().out
    assert [line.split(" ")[0] for line in out.splitlines()] == \
        ["linear/forward", "linear/dgrad", "linear/wgrad", "linear"]
    assert cli.main(["check", recipe, "--arch", "sm_90a", "--build", build,
                     "--kernel", "bwd"]) == 2
    err = capsys.readouterr().err
    assert "recipe 'linear' has no kernel 'bwd'" in err and "Traceback" not in err


# -- SCons ------------------------------------------------------------------------------------

def _two_kernel_demo(tree) -> None:
    """demo2: pipeline_demo's kernel, and a second kernel that only sums y."""
    demo = yaml.safe_load(tree.recipe().read_text())
    launch = demo["launch"]
    second = {
        "instances": {k: demo["instances"][k] for k in ("load_y", "reduce_y", "store_y")},
        "connect": ["load_y.tiles -> reduce_y.x", "reduce_y.acc -> store_y.acc"],
        "launch": {"inputs": {"y": launch["inputs"]["y"]},
                   "outputs": {"ysums": launch["outputs"]["ysums"]},
                   "grid": launch["grid"],
                   "bind": {k: v for k, v in launch["bind"].items()
                            if k.split(".")[0] in ("load_y", "reduce_y")}
                   | {"store_y.out": "ysums"}},
    }
    shared = {k: v for k, v in demo.items() if k not in ("instances", "connect", "launch")}
    data = {**shared, "recipe": "demo2",
            "kernels": {"all": {k: demo[k] for k in ("instances", "connect", "launch")},
                        "ysum": second}}
    (tree.root / "recipes" / "demo2.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def test_scons_builds_a_multi_kernel_recipe_sharing_objects(make_tree):  # noqa: F811
    tree = make_tree("t")
    _two_kernel_demo(tree)
    dry = tree.scons("-n", "VERBOSE=1", "recipe=demo2")
    assert dry.rc == 0, dry.err
    assert "link recipes/demo2.yaml --arch sm_90a -o build/dev/sm_90a/demo2/all" in dry.out
    assert "--kernel all" in dry.out and "--kernel ysum" in dry.out
    run = tree.build("recipe=demo2")
    assert sorted(run.linked) == ["demo2_all sm_90a (linked) -> build/dev/sm_90a/demo2/all",
                                  "demo2_ysum sm_90a (linked) -> build/dev/sm_90a/demo2/ysum"]
    # five objects, each shared; per kernel its glue and the verifier's entry probe
    assert tree.nvcc_compiles() == 5 + 2 * 2
    out = tree.root / "build" / "dev" / "sm_90a" / "demo2"
    assert set(hashes(out)) == {"kernels.json"} | {
        f"{k}/{n}" for k in ("all", "ysum")
        for n in OUTPUTS | {f"demo2_{k}.cubin"}}
    assert json.loads((out / "kernels.json").read_text())["kernels"] == \
        {"all": "all", "ysum": "ysum"}
    again = tree.build("recipe=demo2")
    assert again.rebuilt == set() and again.linked == []


def test_scons_refuses_a_bad_autograd_before_compiling(make_tree):  # noqa: F811
    tree = make_tree("t")
    _two_kernel_demo(tree)
    path = tree.root / "recipes" / "demo2.yaml"
    data = yaml.safe_load(path.read_text())
    data["autograd"] = {"forward": "all", "grads": {"x": {"kernel": "ysum",
                                                          "inputs": ["grad.z"]}}}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    run = tree.scons("recipe=demo2")
    assert run.rc == 2, run.out + run.err
    assert "recipes/demo2.yaml: autograd.grads.x.inputs[0]: 'grad.z'" in run.err
    assert "Traceback" not in run.out + run.err and tree.nvcc_compiles() == 0
