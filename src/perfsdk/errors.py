"""One formatter for validation errors: ``field.path: message; ...`` everywhere perfsdk reports one."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError


def validation_messages(err: ValidationError, prefix: str = "", model: Any = None) -> list[str]:
    """One ``path: message`` per problem; ``unknown key`` for extra fields (with a "did you
    mean" hint when ``model``, the validated pydantic class, has a close field name), ``field
    required`` for missing ones; ``prefix`` (e.g. ``collectors.latency``) leads every path."""
    out = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-"))
        if prefix:
            path = f"{prefix}.{path}" if path else prefix
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
            if model is not None:
                from perfsdk.suggest import unknown_key_hint

                msg += unknown_key_hint(model, [p for p in e["loc"] if not str(p).startswith("function-")])
        elif e["type"] == "missing":
            msg = "field required"
        else:
            msg = str(e["msg"]).removeprefix("Value error, ")
        out.append(f"{path or '<root>'}: {msg}")
    return out


def format_validation_error(err: ValidationError, prefix: str = "", model: Any = None) -> str:
    """All problems of ``err`` on one line, ``; ``-separated."""
    return "; ".join(validation_messages(err, prefix, model))
