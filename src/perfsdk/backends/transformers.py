"""The in-process backend: the model runs in this process under ``transformers`` (or any
``nn.Module``), and each batch is a ``generate`` or ``forward`` step of the session."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from perfsdk.backends.base import Backend
from perfsdk.plugins import hookimpl


class TransformersBackend(Backend):
    """Loads ``model.id`` in this process and runs the workload batch by batch."""

    name = "transformers"
    description = "the model in this process (transformers or any nn.Module)"
    in_process = True

    @classmethod
    def handles(cls, config: Any) -> bool:
        return not config.model.endpoint

    def check(self) -> None:
        from perfsdk.models.loader import check_model_config
        from perfsdk.models.runner import in_process_arrival

        check_model_config(self.config.model)
        in_process_arrival(self.config.workload)

    def run_workload(self, session: Any, progress: Callable[[int, int], None] | None = None) -> None:
        from perfsdk.models.runner import run_in_process

        run_in_process(session, progress=progress)


@hookimpl
def perfsdk_register_backends(register: Any) -> None:
    register(TransformersBackend)
