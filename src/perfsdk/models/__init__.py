"""The embedded model, model loading, prompt sets and the workload runner.

- :mod:`perfsdk.models.tiny` — ``builtin:tiny-llama`` (and size variants), built locally.
- :mod:`perfsdk.models.loader` — :func:`~perfsdk.models.loader.load_model` from a ``ModelConfig``.
- :mod:`perfsdk.models.prompts` — built-in prompt sets and prompt files.
- :mod:`perfsdk.models.runner` — :func:`~perfsdk.models.runner.run_workload` for config-driven runs.

Submodules import torch/transformers lazily; importing this package is cheap.
"""
