"""``perfsdk.doctor``: one check per source, with the reason and the fix."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

import perfsdk.doctor as doctor
from perfsdk.energy.fake import make_powercap_tree


def test_checks_cover_every_source(tmp_path: Path) -> None:
    checks = doctor.run_checks(rapl_root=str(tmp_path / "absent"))
    assert [c.name for c in checks] == ["transformers", "cuda", "nvml", "rapl", "codecarbon", "bitsandbytes", "float8"]
    rapl = checks[3]
    assert not rapl.available and "does not exist" in rapl.reason and "rapl_root" in (rapl.fix or "")
    for c in checks:
        assert c.reason
        assert c.available or c.fix  # whatever is missing says what to do


def test_rapl_ok_and_root_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_powercap_tree(tmp_path, {"intel-rapl:0": ("package-0", 5, 100), "intel-rapl:0:0": ("dram", 1, 100)})
    ok, reason = doctor.rapl_status(str(tmp_path))
    assert ok and reason == "package: package-0; dram: dram"

    def denied(p: Path) -> str:
        if p.name == "energy_uj":
            raise PermissionError(13, "Permission denied")
        return p.read_text()

    monkeypatch.setattr(doctor, "rapl_status", partial(doctor.rapl_status, read_text=denied))
    rapl = next(c for c in doctor.run_checks(rapl_root=str(tmp_path)) if c.name == "rapl")
    assert not rapl.available and "root only" in rapl.reason
    assert rapl.fix == f"sudo chmod o+r {tmp_path}/intel-rapl:*/energy_uj {tmp_path}/intel-rapl:*:*/energy_uj (or run as root)"


def test_nvml_and_cuda_on_this_machine() -> None:
    ok, reason = doctor.nvml_status()
    if ok:
        pytest.skip("NVML works here")
    assert reason
    nv = next(c for c in doctor.run_checks() if c.name == "nvml")
    assert nv.fix


def test_codecarbon_check_names_offline_settings() -> None:
    cc = doctor.codecarbon_check()
    if not cc.available:
        assert cc.fix == "pip install codecarbon"
    else:
        assert "offline" in cc.reason and "country_iso_code" in cc.reason


def test_doctor_command_prints_every_check() -> None:
    import json

    from click.testing import CliRunner

    from perfsdk.cli import cli

    res = CliRunner().invoke(cli, ["doctor", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert [r["name"] for r in rows] == ["transformers", "cuda", "nvml", "rapl", "codecarbon", "bitsandbytes", "float8"]
    assert all(set(r) == {"name", "available", "reason", "fix"} for r in rows)


def test_bitsandbytes_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name, *a))
    bnb = doctor.bitsandbytes_check()
    assert (bnb.available, bnb.reason) == (False, "unavailable: not installed")
    assert bnb.fix and bnb.fix.startswith("pip install bitsandbytes")


def test_float8_check_says_where_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    import perfsdk.models.float8 as f8

    monkeypatch.setattr(doctor, "cuda_status", lambda: (False, "no GPU"))
    monkeypatch.setattr(f8, "float8_status", lambda device: (False, f"no float8 on {device}"))
    check = doctor.float8_check()
    assert (check.available, check.reason) == (False, "unavailable: no float8 on cpu")
    monkeypatch.setattr(f8, "float8_status", lambda device: (True, f"runs on {device}"))
    assert doctor.float8_check().reason == "runs on cpu"


def test_doctor_shows_the_transformers_release_and_the_tested_range(perfsdk_cli):
    from perfsdk.doctor import transformers_check
    from perfsdk.models.internals import TESTED_TRANSFORMERS, tested_range_text, transformers_version

    low, high = TESTED_TRANSFORMERS
    assert transformers_check(low).reason == f"transformers {low} (tested: {low} – {high})"
    out = transformers_check("4.30.0")
    assert out.available and "outside the tested range" in out.reason and out.fix
    r = perfsdk_cli(["doctor", "--json"])
    assert r.exit_code == 0, r.output
    import json

    checks = {c["name"]: c for c in json.loads(r.output)["checks"]} if isinstance(json.loads(r.output), dict) \
        else {c["name"]: c for c in json.loads(r.output)}
    assert checks["transformers"]["reason"].startswith(f"transformers {transformers_version()}")
    assert tested_range_text() in checks["transformers"]["reason"]
