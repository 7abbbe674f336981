"""Backends: what runs a config's workload.

A backend turns the workload's requests into steps on the session's clock and owns nothing
else: not the prompts (the workload), not the statistics (the collectors). Built-ins:
``transformers`` (the model in this process) and ``openai`` (any OpenAI-compatible HTTP
endpoint). Third parties register more through ``perfsdk_register_backends``.
"""

from perfsdk.backends.base import Backend, backend_for

__all__ = ["Backend", "backend_for"]
