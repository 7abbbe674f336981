"""The embedded model, model loading, prompt sets and the workload runner.

- :mod:`perfsdk.models.arch` — :class:`~perfsdk.models.arch.Architecture`, read once from a
  ``transformers`` config by :func:`~perfsdk.models.arch.architecture_from_config`; FLOPs,
  simulation, the KV-cache size and the run's ``model`` section all use it.
- :mod:`perfsdk.models.resolve` — what ``perfsdk flops MODEL`` / ``simulate --model`` accept,
  resolved to a config (built-in, folder, bundled name, cached Hugging Face id).
- :mod:`perfsdk.models.tiny` — ``builtin:tiny-llama`` (and size variants), built locally.
- :mod:`perfsdk.models.loader` — :func:`~perfsdk.models.loader.load_model` from a ``ModelConfig``.
- :mod:`perfsdk.models.prompts` — built-in prompt sets and prompt files.
- :mod:`perfsdk.models.runner` — :func:`~perfsdk.models.runner.run_workload` for config-driven runs.

Submodules import torch/transformers lazily; importing this package is cheap.
"""
