"""Function ports: a mask or score modifier linked into an attention core by LTO. The
checker pairs callers with providers by interface, refuses what cannot link (a wrong
interface, a caller left unconnected, one object's functions given two providers, a
function component that claims warps), and the header and glue spell the symbols
both sides agree on. Nothing here compiles: the real contracts, the real recipe."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipelink import glue, header
from pipelink.check import check
from pipelink.contract import contract_from_data, load_contract
from pipelink.errors import CheckError, ContractError
from pipelink.place import place
from pipelink.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2]


def bound_for(recipe_path: Path, arch: str = "sm_90a", kernel: str = "forward") -> dict[str, Any]:
    recipe = load_recipe(recipe_path).kernels()[kernel]
    return recipe, {name: load_contract(ROOT / "components" / inst.component / "contract.yaml")
                    .bind(inst.params) for name, inst in recipe.instances(arch).items()}


def write_recipe(tmp_path: Path, mutate) -> Path:  # noqa: ANN001
    data = yaml.safe_load((ROOT / "recipes" / "attn_causal.yaml").read_text())
    mutate(data["kernels"]["forward"])
    path = tmp_path / "attn_causal.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_the_causal_recipe_pairs_each_caller_with_its_provider():
    recipe, bound = bound_for(ROOT / "recipes" / "attn_causal.yaml")
    kernel = check(recipe, "sm_90a", bound)
    pairs = sorted((str(t.src), str(t.dst)) for t in kernel.transfers if t.kind == "function")
    assert pairs == [("blocks.blocks", "core.blocks"), ("blocks.blocks", "load.blocks"),
                     ("mask.mask", "core.mask"), ("mask.mask", "sched.mask"),
                     ("score.score", "core.score")]
    # The function components run in no warps: no lane holds them.
    assert not any(inst in ("mask", "score", "blocks")
                   for lane in kernel.lanes for inst, _ in lane.members)


def test_glue_forwards_each_caller_symbol_to_the_provider():
    recipe, bound = bound_for(ROOT / "recipes" / "attn_causal.yaml")
    kernel = check(recipe, "sm_90a", bound)
    text = glue.generate(kernel, place(kernel.problem))
    core, mask = bound["core"], bound["mask"]
    caller = core.symbol("pl_attn_fwd_core_mask_keep")
    provider = mask.symbol("pl_causal_mask_mask_keep")
    body = re.search(rf'extern "C" __device__ bool {caller}\(const pl::KernelInfo& k, '
                     rf"int32_t q, int32_t kv\) \{{(.*?)\n\}}", text, re.S)
    assert body, text
    assert f"return {provider}(pl_at_mask, args, k, q, kv);" in body.group(1)


def test_headers_declare_both_sides():
    _, bound = bound_for(ROOT / "recipes" / "attn_causal.yaml")
    core = header.generate(bound["core"])
    assert (f'extern "C" __device__ float {bound["core"].symbol("pl_attn_fwd_core_score_score")}'
            "(const pl::KernelInfo& k, float s, int32_t batch, int32_t head, int32_t q, "
            "int32_t kv);") in core
    assert "#define pl_attn_fwd_core_mask_keep " in core
    mask = header.generate(bound["mask"])
    t = header.type_names(bound["mask"])
    assert (f'extern "C" __device__ pl::attn::Span '
            f'{bound["mask"].symbol("pl_causal_mask_mask_kv_range")}(const {t["place"]}& at, '
            f"const {t['args']}& args, const pl::KernelInfo& k, int32_t q_begin, "
            "int32_t q_end, int32_t kv_len);") in mask


def test_the_backward_core_calls_the_forward_mask():
    """The backward links the same mask and score components: its core asks keep() and
    partial(), and score(), grad() and identity(); its scheduler q_range() (the queries
    that see a key tile); the loader and the core take each step's query tile from one
    q_tiles provider (contiguous here)."""
    recipe, bound = bound_for(ROOT / "recipes" / "attn_causal.yaml", kernel="backward")
    kernel = check(recipe, "sm_90a", bound)
    pairs = sorted((str(t.src), str(t.dst)) for t in kernel.transfers if t.kind == "function")
    assert pairs == [("mask.mask", "core.mask"), ("mask.mask", "sched.mask"),
                     ("q_tiles.q_tiles", "core.q_tiles"), ("q_tiles.q_tiles", "load.q_tiles"),
                     ("score.score", "core.score")]
    text = glue.generate(kernel, place(kernel.problem))
    caller = bound["sched"].symbol("pl_attn_bwd_scheduler_mask_q_range")
    assert f"return {bound['mask'].symbol('pl_causal_mask_mask_q_range')}(" in text
    assert caller in text
    assert f"return {bound['score'].symbol('pl_no_score_score_grad')}(" in text


def _swap_score_for_mask(data: dict) -> None:
    data["connect"] = [c.replace("score.score -> core.score", "mask.mask -> core.score")
                       for c in data["connect"]]


def _drop_score(data: dict) -> None:
    data["connect"] = [c for c in data["connect"] if c != "score.score -> core.score"]


@pytest.mark.parametrize("mutate,needles", [
    (_swap_score_for_mask, ["connect[", "'mask.mask' (causal_mask) -> 'core.score' "
                            "(attn_fwd_core)", "calls interface attn_score, the provider "
                            "provides attn_mask"]),
    (_drop_score, ["input port 'core.score' (function", "is not connected",
                   "under connect:"]),
])
def test_bad_connections_are_refused(tmp_path, mutate, needles):
    path = write_recipe(tmp_path, mutate)
    recipe, bound = bound_for(path)
    with pytest.raises(CheckError) as err:
        check(recipe, "sm_90a", bound)
    text = str(err.value) + (err.value.hint or "")
    assert str(path) in text
    for needle in needles:
        assert needle in text, text


def test_one_object_with_two_providers_is_refused(tmp_path):
    """Two instances of one core object share their function symbols: both must be
    linked to one mask."""
    def mutate(data: dict) -> None:
        data["instances"]["core2"] = copy.deepcopy(data["instances"]["core"])
        data["instances"]["mask2"] = {"component": "no_mask"}
        data["connect"] += ["mask2.mask -> core2.mask", "score.score -> core2.score"]
    path = write_recipe(tmp_path, mutate)
    recipe, bound = bound_for(path)
    with pytest.raises(CheckError, match="connected to two providers"):
        check(recipe, "sm_90a", bound)


@pytest.mark.parametrize("extra,needle", [
    ({"roles": {"main": {"warps": 1}}}, "declares roles"),
    ({"smem": {"table": {"bytes": 64, "align": 16}}}, "declares smem"),
    ({"ports": {"mask": {"dir": "in", "kind": "function", "interface": "attn_mask"}}},
     "not function out ports"),
])
def test_function_components_own_nothing(extra, needle):
    data = yaml.safe_load((ROOT / "components" / "causal_mask" / "contract.yaml").read_text())
    data.update(extra)
    with pytest.raises(ContractError, match=needle):
        contract_from_data(data, "components/causal_mask/contract.yaml")


def test_an_unknown_interface_is_a_schema_error():
    data = yaml.safe_load((ROOT / "components" / "causal_mask" / "contract.yaml").read_text())
    data["ports"]["mask"]["interface"] = "attn_masks"
    with pytest.raises(ContractError, match="interface"):
        contract_from_data(data, "components/causal_mask/contract.yaml")


def test_a_provider_missing_an_interface_function_is_named():
    """A score modifier written before attn_score gained identity() defines score()
    alone: nvJitLink's unresolved hashed symbol (its log, as ptxas writes it) becomes
    an error naming the component, port and function, with the definition to add."""
    from pipelink.errors import LinkError
    from pipelink.link import unresolved_symbol
    recipe, bound = bound_for(ROOT / "recipes" / "attn_causal.yaml")
    kernel = check(recipe, "sm_90a", bound)
    symbol = bound["score"].symbol("pl_no_score_score_identity")
    log = f"ptxas fatal   : Unresolved extern function '{symbol}'\nERROR NVJITLINK_ERROR"
    error = unresolved_symbol(kernel, {}, LinkError("nvJitLink failed", log=log))
    text = str(error)
    assert "component 'no_score'" in text and "function 'identity'" in text
    assert "port 'score'" in text and "interface 'attn_score'" in text
    assert ("bool pl_no_score_score_identity(const pl_place_no_score&, "
            "const pl_args_no_score&, const pl::KernelInfo&)") in text
    # Another unresolved name (not a provider's) is left to nvJitLink's own message.
    other = LinkError("nvJitLink failed", log="Unresolved extern function 'memcpy_x'")
    assert unresolved_symbol(kernel, {}, other) is None
