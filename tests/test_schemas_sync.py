"""The checked-in schemas/ folder is exactly what `perfsdk schema` generates."""

from __future__ import annotations

import json
from pathlib import Path

from perfsdk.cli import schema_documents

SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"


def test_schemas_are_up_to_date():
    docs = schema_documents()
    assert {"config.schema.json", "run-result.schema.json", "hardware.schema.json"} <= set(docs)
    for name, doc in docs.items():
        path = SCHEMAS / name
        assert path.is_file(), f"schemas/{name} missing: run `perfsdk schema`"
        expected = json.dumps(doc, indent=2, sort_keys=True) + "\n"
        assert path.read_text() == expected, f"schemas/{name} is out of date: run `perfsdk schema`"


def test_schema_version_and_required_fields():
    doc = json.loads((SCHEMAS / "run-result.schema.json").read_text())
    assert set(doc["required"]) >= {"run_id", "name", "status", "started_at", "perfsdk_version"}
    assert doc["properties"]["schema_version"]["default"] == "1.0"
    cfg = json.loads((SCHEMAS / "config.schema.json").read_text())
    assert cfg["additionalProperties"] is False
