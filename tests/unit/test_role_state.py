"""A component of several roles, without a compiler: attn_fwd_umma_core's MMA warp and
softmax warpgroup both read every work record through one work port that names no role,
and each keeps the PipeState of the rings between them (roles.<r>.state) in its
glue-owned state beside its ports'. Broken variants are refused naming the contract key."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipelink.check import check
from pipelink.contract import EVERY_ROLE, contract_from_data, load_contract
from pipelink.errors import CheckError, ContractError
from pipelink.header import generate
from pipelink.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2]
ARCH = "sm_100a"
CORE = ROOT / "components" / "attn_fwd_umma_core" / "contract.yaml"


def _core_data() -> dict[str, Any]:
    return yaml.safe_load(CORE.read_text())


def _forward_check(tmp_path: Path, edit: Any = None):  # noqa: ANN202
    """attn_causal's forward for sm_100a checked, its core's contract edited by `edit`."""
    data = _core_data()
    if edit:
        edit(data)
    core = tmp_path / "attn_fwd_umma_core" / "contract.yaml"
    core.parent.mkdir(parents=True)
    core.write_text(yaml.safe_dump(data, sort_keys=False))
    forward = load_recipe(ROOT / "recipes" / "attn_causal.yaml").select(["forward"])["forward"]
    bound = {}
    for inst, i in forward.instances(ARCH).items():
        path = core if i.component == "attn_fwd_umma_core" else \
            ROOT / "components" / i.component / "contract.yaml"
        bound[inst] = load_contract(path).bind(i.params)
    return check(forward, ARCH, bound)


def test_every_role_reads_the_roleless_work_port():
    contract = load_contract(CORE)
    work = contract.ports["work"]
    assert work.role == EVERY_ROLE
    assert work.seen_by("mma") and work.seen_by("softmax")
    assert contract.ports["k"].seen_by("mma") and not contract.ports["k"].seen_by("softmax")


def test_the_work_ring_counts_both_roles(tmp_path):
    kernel = _forward_check(tmp_path)
    ring = kernel.work
    assert {"core.mma", "core.softmax+store.store"} <= set(ring.consumers)
    # loader 1 + MMA warp 1 + softmax warpgroup 4 warps, one arrival per warp
    assert ring.arrivals == 1 + 1 + 4


def test_each_role_keeps_its_own_ring_states():
    text = generate(load_contract(CORE).bind({}))

    def members(role: str) -> list[str]:
        body = re.search(rf"struct pl_state_attn_fwd_umma_core_{role}_\w+ \{{\n(.*?)\}};", text,
                         re.S)
        assert body, role
        return re.findall(r"pl::PipeState (\w+);", body.group(1))

    assert members("mma") == ["k", "q", "v", "s", "p"]
    assert members("softmax") == ["s", "o"]
    assert "pl::PipeState s;  // roles.mma.state" in text


def test_a_state_named_like_a_port_is_refused():
    data = _core_data()
    data["roles"]["mma"]["state"] = ["s", "k"]
    with pytest.raises(ContractError) as info:
        contract_from_data(data, str(CORE))
    message = str(info.value)
    assert "roles.mma.state" in message and "its port 'k'" in message
    assert "apart from its ports" in message


def test_a_state_list_is_names():
    data = _core_data()
    data["roles"]["softmax"]["state"] = ["s", "s"]
    with pytest.raises(ContractError, match="roles.softmax.state"):
        contract_from_data(data, str(CORE))


def test_a_work_port_seen_by_one_role_leaves_the_other_without_records(tmp_path):
    def mma_only(data: dict[str, Any]) -> None:
        data["ports"]["work"]["role"] = "mma"

    with pytest.raises(CheckError) as info:
        _forward_check(tmp_path, mma_only)
    message = str(info.value)
    assert "role 'core.softmax' (attn_fwd_umma_core) runs once per work item" in message
    assert "reads no work record" in message
