"""The ``perfsdk`` command line.

:mod:`perfsdk.cli.main` holds the group and the core commands (``run``, ``export``,
``plugins``, ``schema``, ``doctor``); every other built-in command lives beside it in this
package and registers through ``perfsdk_register_commands``, the hook third-party plugins use:
``runs`` and ``store`` (:mod:`~perfsdk.cli.store`), ``sweep``, ``compare`` and ``report``
(:mod:`~perfsdk.cli.experiments`), ``flops`` (:mod:`~perfsdk.cli.flops`), ``simulate``,
``hardware`` and ``calibrate`` (:mod:`~perfsdk.cli.simulate`), ``layers`` (:mod:`~perfsdk.cli.layers`).
"""

from perfsdk.cli.main import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    RunInterrupted,
    cli,
    execute_run,
    main,
    register_plugin_commands,
    schema_documents,
)

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "RunInterrupted", "cli", "execute_run", "main",
           "register_plugin_commands", "schema_documents"]
