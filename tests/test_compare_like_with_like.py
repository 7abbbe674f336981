"""compare lists every difference in workload, model and hardware before its table, refuses to
gate on unlike runs, and --allow-different proceeds quietly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from perfsdk.experiments.likeness import differences
from perfsdk.store import Store

SMALL = ["--set", "workload.num_prompts=4", "--set", "workload.warmup_runs=0", "--set", "workload.min_iterations=2",
         "--set", "collectors.energy=false", "--set", "collectors.utilization=false", "--quiet"]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """Real CLI runs of the embedded model: 4 and 8 new tokens per request, and 4 in bfloat16."""
    from click.testing import CliRunner

    from perfsdk.cli import cli, register_plugin_commands

    register_plugin_commands()
    root = tmp_path_factory.mktemp("like")
    ids = {}
    for key, extra in (("t4", ["workload.generate.max_new_tokens=4"]),
                       ("t8", ["workload.generate.max_new_tokens=8"]),
                       ("bf16", ["workload.generate.max_new_tokens=4", "model.dtype=bfloat16"])):
        sets = [a for x in extra for a in ("--set", x)]
        r = CliRunner().invoke(cli, ["run", "--store", str(root), *SMALL, *sets], catch_exceptions=False)
        assert r.exit_code in (0, 1), r.output
        ids[key] = r.output.strip().splitlines()[-1]
    return root, ids


def test_differences_are_listed_before_the_table(store: tuple[Path, dict[str, str]], perfsdk_cli: Any) -> None:
    root, ids = store
    st = Store(root)
    assert [str(d) for d in differences(st.get(ids["t4"]), st.get(ids["t8"]))] == [
        "workload workload.generate.max_new_tokens: 4 -> 8"]
    assert [str(d) for d in differences(st.get(ids["t4"]), st.get(ids["bf16"]))] == [
        "model dtype: float32 -> bfloat16"]
    r = perfsdk_cli(["compare", ids["t4"], ids["t8"], ids["bf16"], "--store", str(root), "--metric", "e2e_s"])
    assert r.exit_code == 0, r.output
    # before the table, wrapped to the terminal's width between whole words
    assert r.output.index("did not measure the same thing") < r.output.index("candidates vs baseline")
    flat = " ".join(r.output.split())
    assert flat.startswith(
        "the runs compared did not measure the same thing (--allow-different: compare anyway, quietly): "
        f"{ids['t8']}: workload workload.generate.max_new_tokens: 4 -> 8 "
        f"{ids['bf16']}: model dtype: float32 -> bfloat16")
    assert max(len(line) for line in r.output.splitlines()) <= 80
    # --allow-different: the table alone
    r = perfsdk_cli(["compare", ids["t4"], ids["t8"], "--store", str(root), "--metric", "e2e_s", "--allow-different"])
    assert r.exit_code == 0 and "did not measure the same thing" not in r.output
    r = perfsdk_cli(["compare", ids["t4"], ids["t8"], "--store", str(root), "--metric", "e2e_s", "--json"])
    assert json.loads(r.output)["differences"] == [
        {"baseline_run": ids["t4"], "candidate_run": ids["t8"], "group": "workload",
         "field": "workload.generate.max_new_tokens", "baseline": 4, "candidate": 8}]


def test_a_gate_on_unlike_runs_is_an_error(store: tuple[Path, dict[str, str]], perfsdk_cli: Any) -> None:
    root, ids = store
    r = perfsdk_cli(["compare", ids["t4"], ids["t8"], "--store", str(root), "--fail-if-slower", "5%"])
    assert r.exit_code == 2
    assert "--fail-if-slower judges like with like" in r.output
    r = perfsdk_cli(["compare", ids["t4"], ids["t8"], "--store", str(root), "--fail-if-slower", "1000%",
                     "--allow-different"])
    assert r.exit_code == 0, r.output
    # the same run against itself: nothing differs, nothing listed
    r = perfsdk_cli(["compare", ids["t4"], ids["t4"], "--store", str(root), "--metric", "e2e_s"])
    assert r.exit_code == 0 and "did not measure the same thing" not in r.output
