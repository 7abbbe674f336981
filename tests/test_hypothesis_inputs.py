"""Property-based tests: any input gives a validated object or a clear error, never a traceback
from deep inside; CSV is spreadsheet-safe; stored names stay inside the store."""

from __future__ import annotations

import csv
import io
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfsdk.config import Config, ConfigError, load_config
from perfsdk.exporters.builtin import CsvExporter
from perfsdk.exporters.flatten import FORMULA_PREFIXES
from perfsdk.hardware import HardwareProfile, HardwareProfileError, load_profile_file, parse_profile
from perfsdk.schemas import ErrorRecord, Record, RunResult
from perfsdk.store import Store, StoreError

SETTINGS = settings(max_examples=int(os.environ.get("PERFSDK_HYPOTHESIS_EXAMPLES", "60")), deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                    st.text(max_size=20))
keys = st.one_of(st.sampled_from(["name", "model", "workload", "collectors", "exporters", "store", "tags", "id",
                                  "dtype", "device", "prompts", "batching", "batch_size", "max_batch_tokens",
                                  "generate", "max_new_tokens", "arrival", "pattern", "rate_per_s", "latency",
                                  "quantization", "num_prompts", "threads", "seed"]),
                 st.text(max_size=10), st.integers(-3, 3))
json_like = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                          st.dictionaries(keys, inner, max_size=5)), max_leaves=25)


def _config_or_error(source: Any, overrides: list[str] | None = None) -> None:
    try:
        cfg = load_config(source, overrides)
    except ConfigError as err:
        assert str(err)  # a message naming the field or file
        return
    assert isinstance(cfg, Config)


@SETTINGS
@given(json_like)
def test_config_loader_on_arbitrary_data(data: Any) -> None:
    _config_or_error(data)


@SETTINGS
@given(st.dictionaries(keys, json_like, max_size=6))
def test_config_loader_on_arbitrary_mappings(data: dict[Any, Any]) -> None:
    _config_or_error(data)


@SETTINGS
@given(st.one_of(st.text(max_size=200), json_like.map(lambda d: yaml.safe_dump(d))))
def test_config_loader_on_arbitrary_yaml_text(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.yaml"
        path.write_text(text, encoding="utf-8")
        _config_or_error(str(path))


@SETTINGS
@given(st.lists(st.text(max_size=30), max_size=4))
def test_config_overrides_on_arbitrary_text(items: list[str]) -> None:
    _config_or_error({}, items)


def test_yaml_is_loaded_safely(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.yaml"
    path.write_text(f"name: !!python/object/apply:os.system ['touch {marker}']\n")
    try:
        load_config(str(path))
    except ConfigError as err:
        assert "not valid YAML" in str(err)
    else:
        raise AssertionError("a python tag was accepted")
    assert not marker.exists()


def test_nul_bytes_in_paths_are_config_errors(tmp_path: Path) -> None:
    path = tmp_path / "bench.yaml"
    path.write_text('workload: {prompts: "a\\0b.txt"}\nmodel: {id: "./m\\0x"}\n')
    _config_or_error(str(path))


# -- hardware profiles ------------------------------------------------------------------------

HW_FIELDS = ["name", "kind", "variant", "source", "memory_bandwidth_gbs", "memory_pj_per_bit", "memory_capacity_gb",
             "peak_tflops", "compute_pj_per_flop", "host_to_device_gbs", "host_to_device_pj_per_bit",
             "device_to_host_gbs", "device_to_host_pj_per_bit", "static_power_w", "compute_efficiency", "profiles",
             "fp16", "fp32", "bf16"]
VALID_CPU = {"name": "x", "kind": "cpu", "variant": "v", "source": "s", "memory_bandwidth_gbs": 10,
             "memory_pj_per_bit": 1, "memory_capacity_gb": 8, "peak_tflops": {"fp32": 1}, "compute_pj_per_flop": 1}


def _profile_or_error(fn: Any, arg: Any) -> None:
    try:
        out = fn(arg)
    except HardwareProfileError as err:
        assert str(err)
        return
    items = out if isinstance(out, list) else [out]
    assert all(isinstance(p, HardwareProfile) for p in items)


@SETTINGS
@given(st.dictionaries(st.sampled_from(HW_FIELDS), json_like, max_size=8))
def test_hardware_profile_on_arbitrary_mappings(data: dict[str, Any]) -> None:
    _profile_or_error(parse_profile, data)


@SETTINGS
@given(st.dictionaries(st.sampled_from(list(VALID_CPU)), scalars, max_size=4))
def test_hardware_profile_near_valid(changes: dict[str, Any]) -> None:
    _profile_or_error(parse_profile, {**VALID_CPU, **changes})


@SETTINGS
@given(st.one_of(st.text(max_size=200), json_like.map(yaml.safe_dump),
                 st.lists(st.dictionaries(st.sampled_from(HW_FIELDS), scalars, max_size=5), max_size=3)
                 .map(lambda ps: yaml.safe_dump({"profiles": ps}))))
def test_hardware_profile_file_on_arbitrary_yaml(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "hw.yaml"
        path.write_text(text, encoding="utf-8")
        _profile_or_error(load_profile_file, path)


# -- exporters --------------------------------------------------------------------------------

texts = st.text(max_size=15)
numbers = st.one_of(st.integers(-10**9, 10**9), st.floats(allow_nan=False, allow_infinity=False, width=32))


def _run(name: str, tags: dict[str, str], records: list[tuple[str, Any]], msg: str, value: Any) -> RunResult:
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    return RunResult(run_id="r1", name=name or "x", status="partial", started_at=now, perfsdk_version="0",
                     tags=tags, records=[Record(name=n or "r", value=v) for n, v in records],
                     errors=[ErrorRecord(source="c", type="E", message=msg)],
                     collectors={"mine": {"field": value, "text": msg}})


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


@SETTINGS
@given(texts, st.dictionaries(texts, texts, max_size=3), st.lists(st.tuples(texts, st.one_of(texts, numbers)), max_size=3),
       texts, st.one_of(texts, numbers))
def test_csv_round_trips_without_formula_cells(name: str, tags: dict[str, str], records: list[tuple[str, Any]],
                                                msg: str, value: Any) -> None:
    run = _run(name, tags, records, msg, value)
    buf = io.StringIO()
    assert CsvExporter().export([run], buf)
    rows = list(csv.reader(io.StringIO(buf.getvalue())))
    assert len(rows) == 2 and len(rows[0]) == len(rows[1])
    header, row = rows
    cells = dict(zip(header, row))
    for cell in header + row:
        if cell.startswith(FORMULA_PREFIXES):
            assert _is_number(cell), f"formula-like cell {cell!r}"
    # text comes back exactly, behind a quote when it looked like a formula
    expected_name = run.name if not run.name.startswith(FORMULA_PREFIXES) else "'" + run.name
    assert cells["name"] == expected_name
    got = cells["collectors.mine.text"]
    assert got == (msg if not msg.startswith(FORMULA_PREFIXES) else "'" + msg)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        assert float(cells["collectors.mine.field"]) == float(value)


# -- store names ------------------------------------------------------------------------------

name_text = st.one_of(st.text(max_size=30), st.sampled_from(["..", "../../x", "/etc/passwd", "a/b", "a\\b", ".", "~",
                                                               "..\\..\\x", "series/../../../x"]))


@SETTINGS
@given(name_text, st.lists(name_text, max_size=3, unique=True), st.lists(name_text, max_size=3, unique=True))
def test_names_cannot_escape_the_store(run_id: str, series: list[str], artifacts: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "store"
        store = Store(root)
        now = datetime(2026, 1, 1, tzinfo=timezone.utc)
        res = RunResult(run_id=run_id or "x", name="n", status="ok", started_at=now, perfsdk_version="0")
        try:
            folder = store.save(res, series={n: [{"i": i}] for i, n in enumerate(series)},
                                artifacts={n: str(i).encode() for i, n in enumerate(artifacts)})
        except StoreError:
            assert not (Path(tmp) / "x").exists()
            assert all(p == root or root in p.parents for p in Path(tmp).rglob("*"))
            return
        runs = (root / "runs").resolve()
        assert folder.resolve().parent == runs
        stored = store.get(res.run_id)
        for i, n in enumerate(series):
            assert store.read_series(res.run_id, n) == [{"i": i}]
        for i, n in enumerate(artifacts):
            assert (folder / stored.artifacts[n]).read_bytes() == str(i).encode()
        for p in Path(tmp).rglob("*"):
            assert root in p.parents or p == root
            assert os.path.realpath(p).startswith(str(Path(tmp).resolve()))
        assert all(folder.resolve() in (folder / f).resolve().parents
                   for f in [*stored.series.values(), *stored.artifacts.values()])
