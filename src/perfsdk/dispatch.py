"""Calling the lifecycle hooks of a session's collectors: one at a time, isolated, timed, traced.

pluggy would stop at the first exception of a hook call; measuring must not. The dispatcher
resolves each hook's implementations once (in pluggy's call order: ``tryfirst`` first, then the
most recently registered), then calls them one by one:

- **isolation**: an exception in one implementation is handed to ``on_error(owner, hook, exc)``
  (the session records it and the run becomes ``partial``); the others still run;
- **timing**: every call's duration goes to a :class:`~perfsdk.overhead.HookTimes` under the
  owning collector and the hook name, so the run reports what the measurement itself cost;
- **tracing**: with ``trace`` (``PERFSDK_TRACE_HOOKS=1``) every call is logged.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pluggy
import structlog

from perfsdk.overhead import HookTimes

log = structlog.get_logger("perfsdk.dispatch")

#: Name prefix of the collector instances a session registers on its plugin manager.
COLLECTOR_PREFIX = "collector:"


def owner_of(plugin_name: str) -> str:
    """The collector name of a registered instance (``collector:latency`` -> ``latency``)."""
    return plugin_name.split(":", 1)[1] if plugin_name.startswith(COLLECTOR_PREFIX) else plugin_name


class HookDispatcher:
    """Dispatches lifecycle hooks of ``pm`` one implementation at a time (see module docs)."""

    def __init__(self, pm: pluggy.PluginManager, on_error: Callable[[str, str, BaseException], None],
                 times: HookTimes | None = None, trace: bool = False) -> None:
        self.pm = pm
        self.on_error = on_error
        self.times = times if times is not None else HookTimes()
        self.trace = trace
        #: when true, calls count as overhead outside the measured steps (instrumented copies)
        self.unmeasured = False
        self._impls: dict[str, list[Any]] = {}
        self._calls: dict[str, list[tuple[Any, tuple[str, ...], str, str]]] = {}

    def reset(self) -> None:
        """Forget the resolved implementations (after registering or unregistering plugins)."""
        self._impls.clear()
        self._calls.clear()

    def impls(self, hook: str) -> list[Any]:
        """The hook's implementations in call order (wrappers excluded)."""
        impls = self._impls.get(hook)
        if impls is None:
            hc = getattr(self.pm.hook, hook)
            impls = [i for i in reversed(hc.get_hookimpls()) if not (i.hookwrapper or i.wrapper)]
            self._impls[hook] = impls
        return impls

    def dispatch(self, hook: str, **kwargs: Any) -> None:
        """Call every implementation of ``hook`` with its arguments from ``kwargs``."""
        calls = self._calls.get(hook)
        if calls is None:  # resolved once per hook: owner names and argument order
            calls = [(i.function, i.argnames, owner_of(i.plugin_name), i.plugin_name) for i in self.impls(hook)]
            self._calls[hook] = calls
        for function, argnames, owner, plugin_name in calls:
            if self.trace:
                log.info("hook call", hook=hook, plugin=plugin_name)
            t0 = time.perf_counter_ns()
            try:
                function(*[kwargs[a] for a in argnames])
            except Exception as exc:
                self.on_error(owner, hook, exc)
            self.times.add(owner, hook, time.perf_counter_ns() - t0, measured=not self.unmeasured)

    def collect(self, hook: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """Call every implementation of ``hook`` and return ``(owner, result)`` for each one that
        returned something other than ``None`` (``perfsdk_finalize``)."""
        out: list[tuple[str, Any]] = []
        for impl in self.impls(hook):
            owner = owner_of(impl.plugin_name)
            if self.trace:
                log.info("hook call", hook=hook, plugin=impl.plugin_name)
            t0 = time.perf_counter_ns()
            try:
                res = impl.function(*[kwargs[a] for a in impl.argnames])
            except Exception as exc:
                self.on_error(owner, hook, exc)
                continue
            finally:
                self.times.add(owner, hook, time.perf_counter_ns() - t0)
            if res is not None:
                out.append((owner, res))
        return out
