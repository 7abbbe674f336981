"""docs/writing-a-collector.md: every Python snippet runs as printed, one after the other in one
module, and the collector it builds measures, presents and merges its result."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import perfsdk

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "writing-a-collector.md"


def snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", TUTORIAL.read_text(encoding="utf-8"), flags=re.S)


def test_every_snippet_runs_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(ROOT)  # step 7 names the plugin folder relative to the repository
    ns: dict[str, Any] = {"__name__": "tutorial"}
    code = snippets()
    assert len(code) >= 6
    for k, text in enumerate(code):
        if "perfsdk.session(" in text:
            monkeypatch.chdir(tmp_path)  # the run of step 3 is stored in ./perfsdk-results
        try:
            exec(compile(text, f"{TUTORIAL.name} snippet {k + 1}", "exec"), ns)
        finally:
            monkeypatch.chdir(ROOT)
    out = capsys.readouterr().out
    # step 3 ran a real session; its result is the step-1 Result with the step-2 hooks' values
    stored = list((tmp_path / "perfsdk-results" / "runs").iterdir())
    assert len(stored) == 1
    run = perfsdk.Store(tmp_path / "perfsdk-results").get(stored[0].name)
    res = run.collectors["pyruntime"]
    assert set(res) == {"gc_collections", "gc_pause_s", "gc_pause_max_s", "ctx_switches_voluntary"}
    assert res["gc_collections"] >= 0 and res["gc_pause_max_s"] <= res["gc_pause_s"] + 1e-12
    assert "gc_collections" in out
    # step 3b: summary rows and the rank merge work on the step-1 Result
    cls = ns["PyRuntimeCollector"]
    r1 = cls.Result(gc_collections=2, gc_pause_s=0.003, gc_pause_max_s=0.002, ctx_switches_voluntary=5)
    r2 = cls.Result(gc_collections=1, gc_pause_s=0.001, gc_pause_max_s=0.001, ctx_switches_voluntary=7)
    assert cls.summary_rows(r1) == [("GC pause total / max", "3.000 ms / 2.000 ms")]
    merged = cls.merge_ranks([perfsdk.RankShare(0, 2, None, r1), perfsdk.RankShare(1, 2, None, r2)])
    assert merged == cls.Result(gc_collections=3, gc_pause_s=0.004, gc_pause_max_s=0.002, ctx_switches_voluntary=12)
    # the instrumented-step collector traces only its own copy of a step
    with perfsdk.session({"store": None, "collectors": {"energy": False, "utilization": False}},
                         collectors=[ns["CallTraceCollector"]]) as s:
        model, tok = s.load()
        for _ in range(2):
            s.generate(model, **s.tokenize(tok, ["hello"]), max_new_tokens=2)
    assert s.result.status == "ok"


def test_testing_helpers_need_no_pytest() -> None:
    """The default install has no pytest: perfsdk.testing's helpers (which the torchrun example
    imports) still import, and so does every example script's module."""
    code = ("import sys; sys.modules['pytest'] = None\n"
            "from perfsdk.testing import build_tiny_causal_lm, PluginInstaller\n"
            "assert not hasattr(sys.modules['perfsdk.testing'], 'perfsdk_cli')\n"
            "import runpy, pathlib\n"
            "for p in sorted(pathlib.Path('examples').glob('*.py')):\n"
            "    runpy.run_path(str(p), run_name='not_main')\n"
            "print(build_tiny_causal_lm().config.num_hidden_layers)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "2"
