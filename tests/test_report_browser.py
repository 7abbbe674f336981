"""Reports: figures and headings in a real headless browser (Chromium), plus the PNG folder.

Chromium comes from Debian (``apt-get install -y chromium``); without it the browser tests
are skipped with that reason, the HTML checks still run.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from perfsdk.experiments.report import write_report
from perfsdk.experiments.sweep import SweepRunner, load_sweep, read_manifest
from perfsdk.store import Store

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None,
                                    reason="chromium not installed (apt-get update && apt-get install -y chromium)")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars"]


def _tiny_generate(model: Any) -> Any:
    def workload(session: Any) -> None:
        import torch

        bs = session.config.workload.batching.batch_size
        session.load(model=model)
        gen = torch.Generator().manual_seed(bs)
        for _ in range(2):
            ids = torch.randint(3, 250, (bs, 6), generator=gen)
            session.generate(model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=5,
                             min_new_tokens=5, do_sample=False, pad_token_id=0)
        session.record("accuracy", 1.0 - 0.05 * bs)
    return workload


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from perfsdk.testing import build_tiny_causal_lm

    tmp = tmp_path_factory.mktemp("report")
    spec = {"name": "browser", "base": {"exporters": [], "collectors": {"energy": False}},
            "axes": {"workload.batching.batch_size": [1, 2, 4], "model.dtype": ["float32", "bfloat16"]},
            "objectives": [{"maximize": "collectors.latency.output_tokens_per_s"}, {"maximize": "records.accuracy"}]}
    (tmp / "s.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    sweep = load_sweep(tmp / "s.yaml")
    store = tmp / "store"
    SweepRunner(sweep, store, workload=_tiny_generate(build_tiny_causal_lm())).run()
    run_id = read_manifest(store, sweep.sweep_id)["points"][0]["run_id"]
    sweep_html, _ = write_report(Store(store), sweep.sweep_id, tmp / "out" / "sweep.html")
    run_html, _ = write_report(Store(store), run_id, tmp / "out" / "run.html")
    return {"sweep": sweep_html, "run": run_html, "tmp": tmp}


def test_report_files(reports: dict[str, Path]) -> None:
    sweep_pngs = sorted(p.name for p in (reports["sweep"].parent / "sweep_files").iterdir())
    assert sweep_pngs == ["01-batch-size.png", "02-pareto.png", "03-latency-cdf.png"]
    run_pngs = sorted(p.name for p in (reports["run"].parent / "run_files").iterdir())
    assert run_pngs[:2] == ["01-latency-cdf.png", "02-per-token-latency.png"]
    for png in (reports["sweep"].parent / "sweep_files").iterdir():
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = reports["sweep"].read_text()
    assert "src='http" not in page and 'src="http' not in page  # self-contained


def _dump_dom(page: Path, tmp: Path) -> str:
    out = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp / 'profile'}", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@needs_chromium
def test_sweep_report_in_browser(reports: dict[str, Path]) -> None:
    dom = _dump_dom(reports["sweep"], reports["tmp"])
    imgs = re.findall(r"<img[^>]+src=\"data:image/png;base64,", dom)
    assert len(imgs) == 3
    for heading in ("Sweep", "Batch-size panels", "Pareto front", "Latency CDF per point"):
        assert f"<h2>{heading}</h2>" in dom
    assert re.search(r"<h1>Sweep browser \(browser-[0-9a-f]{10}\)</h1>", dom)
    shot = reports["tmp"] / "sweep.png"
    out = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={reports['tmp'] / 'profile2'}",
                          f"--screenshot={shot}", "--window-size=1280,2400", reports["sweep"].as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and shot.read_bytes()[:4] == b"\x89PNG"


@needs_chromium
def test_run_report_in_browser(reports: dict[str, Path]) -> None:
    dom = _dump_dom(reports["run"], reports["tmp"])
    assert len(re.findall(r"<img[^>]+src=\"data:image/png;base64,", dom)) >= 2
    for heading in ("Summary", "Latency", "Utilization over time", "Memory", "Records"):
        assert f"<h2>{heading}</h2>" in dom
