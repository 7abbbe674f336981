"""Per-module timing through forward hooks, split into encode, prefill and decode.

The ``layers`` collector answers "which layers take the time". On the selected measured steps it
puts a forward pre-hook and a forward hook on the model's modules, timestamps each call on the
session clock (synchronizing CUDA first when the model runs there, so a timestamp means "the
work before it has finished", not "it was launched"), and removes every hook when the step
ends, whether it succeeded or raised.

Phases: inside ``generate`` the first call of the top module is the prefill, every later call is
one decode step; each module call is attributed to the phase of the top-module call that
contains it. Calls inside the model's encode modules (an encoder-decoder's encoder, a vision or
audio tower and its projector: :mod:`perfsdk.models.encode`) are ``encode``, whether
``transformers`` runs them before the first top-module call (as ``generate`` does) or inside it;
the encode phase's time is that of the outermost encode-module calls, and an encode call that
ran inside a top-module call is taken out of that call's phase time. The context length of each
top-level call is read from the KV cache it receives (cached positions + new positions).
``s.forward`` steps have a single phase, ``forward``.

Coverage: the time spent in the *coverage modules* — the top module's children, where a child
that holds a block stack (an ``nn.ModuleList``/``nn.ModuleDict``) is replaced by its own
children, so for a decoder LM these are the embedding, each decoder layer, the final norm, the
rotary embedding and the LM head; the encode modules are coverage modules too, unless coverage
modules already sit inside them (a call nested in another coverage module's call counts once) —
divided by the step time. What is missing is the code between modules (masks, cache updates,
sampling, ``generate`` bookkeeping).

Overhead: hooks slow the model down. ``overhead_pct`` compares the instrumented steps with the
measured steps of the same shape that were *not* instrumented (same kind, batch, input token
counts and number of generated positions), with medians so that one preempted step does not
decide it: ``(sum_k n_k * median_instrumented_k / sum_k n_k * median_baseline_k - 1) * 100`` over
the shapes ``k`` that have both, ``n_k`` instrumented steps each. ``hook_time_s`` is the time spent inside the hook functions themselves
(a lower bound of the cost: it leaves out PyTorch's slower call path when hooks exist).

Per-function accounting (``per_function: true``) counts and times the matmul, attention, softmax,
activation and normalization operations of the instrumented steps through the shared operation
capture. ``perfsdk layers RUN`` prints the tables of a stored run (``--functions``, ``--log``).

The package's modules, one job each: ``config`` (settings), ``result`` (what is stored),
``hooks`` (which modules are timed, and the hooks that time them), ``functions`` (per-function
accounting), ``collector`` (lifecycle and the result it builds), ``tables`` (terminal and HTML
tables), ``cli`` (the ``perfsdk layers`` command).
"""

from perfsdk.collectors.layers.collector import LayersCollector
from perfsdk.collectors.layers.config import LayersConfig, StepSelection
from perfsdk.collectors.layers.functions import CATEGORY_LABELS, FUNCTION_CATEGORIES
from perfsdk.collectors.layers.hooks import ROOT_PATH, coverage_paths, module_params
from perfsdk.collectors.layers.result import (
    FunctionOpRow,
    FunctionRow,
    FunctionTotalRow,
    LayersResult,
    ModuleRow,
    ModuleTypeRow,
    PhaseRow,
)

__all__ = [
    "CATEGORY_LABELS",
    "FUNCTION_CATEGORIES",
    "ROOT_PATH",
    "FunctionOpRow",
    "FunctionRow",
    "FunctionTotalRow",
    "LayersCollector",
    "LayersConfig",
    "LayersResult",
    "ModuleRow",
    "ModuleTypeRow",
    "PhaseRow",
    "StepSelection",
    "coverage_paths",
    "module_params",
]
