"""Plugin manager factory, built-in plugins, entry points, allow-list and tracing.

Built-in collectors and exporters are ordinary plugin modules listed in ``DEFAULT_PLUGINS``
and load through the very same hooks as third-party packages (entry-point group ``perfsdk``).

Environment switches:

- ``PERFSDK_DISABLE_PLUGIN_AUTOLOAD=1`` — do not load entry-point plugins.
- ``PERFSDK_PLUGINS=a,b`` — load only these entry-point plugins (by entry-point name).
- ``PERFSDK_TRACE_HOOKS=1`` — log every hook call.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import importlib.metadata
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pluggy
import structlog

from perfsdk import envflags, hookspecs
from perfsdk.collector import Collector, Exporter

log = structlog.get_logger("perfsdk.plugins")

PROJECT = "perfsdk"
ENTRY_POINT_GROUP = "perfsdk"

hookimpl = pluggy.HookimplMarker(PROJECT)

DEFAULT_PLUGINS: list[str] = [
    # collectors: every built-in one in perfsdk.collectors, each module registering its own
    "perfsdk.collectors.latency",
    "perfsdk.collectors.memory",
    "perfsdk.collectors.quality",
    "perfsdk.collectors.energy",
    "perfsdk.collectors.utilization",
    "perfsdk.collectors.layers.collector",
    "perfsdk.collectors.torch_profiler",
    "perfsdk.collectors.flops",
    "perfsdk.collectors.simulation",
    "perfsdk.collectors.server_metrics",
    # exporters
    "perfsdk.exporters.builtin",
    # backends: what runs a step (in-process transformers, an OpenAI-compatible endpoint)
    "perfsdk.backends.transformers",
    "perfsdk.backends.openai",
    # session-wide: multi-process runs (torchrun, Accelerate, MPI) gathered into one
    "perfsdk.distributed",
    # commands beyond the core ones of perfsdk.cli.main
    "perfsdk.cli.store",
    "perfsdk.cli.experiments",
    "perfsdk.cli.flops",
    "perfsdk.cli.simulate",
    "perfsdk.cli.layers",
]


class PluginError(RuntimeError):
    """A plugin could not be loaded or registered something invalid."""


@dataclass
class PluginRegistry:
    """What the loaded plugins registered, and where each thing came from."""

    collectors: dict[str, type[Collector]] = field(default_factory=dict)
    exporters: dict[str, type[Exporter]] = field(default_factory=dict)
    backends: dict[str, type[Any]] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)  # "collector:name" -> plugin name
    distributions: dict[str, str] = field(default_factory=dict)  # plugin name -> "dist version"
    load_errors: list[tuple[str, str]] = field(default_factory=list)


from perfsdk.envflags import flag as _env_flag  # noqa: E402


def allowed_plugins(explicit: list[str] | None = None) -> set[str] | None:
    """The allow-list from ``PERFSDK_PLUGINS`` (or an explicit list), or ``None`` for all."""
    if explicit is not None:
        return {p.strip() for p in explicit if p.strip()}
    raw = envflags.text("PERFSDK_PLUGINS")
    if raw is None:
        return None
    return {p.strip() for p in raw.split(",") if p.strip()}


def autoload_disabled() -> bool:
    return _env_flag("PERFSDK_DISABLE_PLUGIN_AUTOLOAD")


def _plugin_label(pm: pluggy.PluginManager, plugin: Any) -> str:
    name = pm.get_name(plugin)
    return name if name else getattr(plugin, "__name__", repr(plugin))


def get_plugin_manager(*, load_entry_points: bool | None = None, allow: list[str] | None = None,
                       extra_plugins: list[Any] | None = None) -> pluggy.PluginManager:
    """A new plugin manager with hookspecs, built-ins and (unless disabled) entry points."""
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(hookspecs)
    for modname in DEFAULT_PLUGINS:
        mod = importlib.import_module(modname)
        pm.register(mod, name=modname)
    if load_entry_points is None:
        load_entry_points = not autoload_disabled()
    if load_entry_points:
        _load_entry_points(pm, allowed_plugins(allow))
    for plugin in [*_PROCESS_PLUGINS, *(extra_plugins or [])]:
        if not pm.is_registered(plugin):
            pm.register(plugin, name=_unique_name(pm, plugin))
    pm.check_pending()
    if _env_flag("PERFSDK_TRACE_HOOKS"):
        enable_tracing(pm)
    return pm


def _unique_name(pm: pluggy.PluginManager, plugin: Any) -> str:
    """A readable plugin name: the module's name, or the class of a plugin object."""
    base = getattr(plugin, "__name__", None) or f"{type(plugin).__module__}.{type(plugin).__qualname__}"
    name, n = base, 1
    while pm.get_plugin(name) is not None:
        n += 1
        name = f"{base}#{n}"
    return name


_SHARED: dict[tuple[Any, ...], pluggy.PluginManager] = {}


def shared_plugin_manager() -> pluggy.PluginManager:
    """One plugin manager per process (and per state of the environment switches), for code
    that has no session: the CLI's commands, catalogue look-ups. Entry points are loaded once,
    not once per caller. A session builds its own manager (it registers its collectors on it)."""
    allow = allowed_plugins()
    key = (autoload_disabled(), tuple(sorted(allow)) if allow is not None else None,
           tuple(id(p) for p in _PROCESS_PLUGINS))
    pm = _SHARED.get(key)
    if pm is None:
        pm = _SHARED[key] = get_plugin_manager()
    return pm


def _load_entry_points(pm: pluggy.PluginManager, allow: set[str] | None) -> None:
    errors: list[tuple[str, str]] = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if allow is not None and ep.name not in allow:
            continue
        if pm.get_plugin(ep.name) is not None or pm.is_blocked(ep.name):
            continue
        try:
            plugin = ep.load()
        except Exception as exc:  # a broken third-party package must not break perfsdk
            log.warning("plugin failed to load", plugin=ep.name, error=repr(exc))
            errors.append((ep.name, repr(exc)))
            continue
        pm.register(plugin, name=ep.name)
        dist = getattr(ep, "dist", None)
        if dist is not None:
            pm._perfsdk_dists = getattr(pm, "_perfsdk_dists", {})  # type: ignore[attr-defined]
            pm._perfsdk_dists[ep.name] = f"{dist.metadata['Name']} {dist.version}"  # type: ignore[attr-defined]
    pm._perfsdk_load_errors = errors  # type: ignore[attr-defined]


def enable_tracing(pm: pluggy.PluginManager) -> None:
    """Log every hook call made through ``pm.hook`` (the session traces its own dispatch)."""

    def before(hook_name: str, hook_impls: Any, kwargs: Any) -> None:
        log.info("hook call", hook=hook_name, impls=[i.plugin_name for i in hook_impls])

    def after(outcome: Any, hook_name: str, hook_impls: Any, kwargs: Any) -> None:
        log.info("hook done", hook=hook_name)

    pm.add_hookcall_monitoring(before, after)


def collect_registry(pm: pluggy.PluginManager, strict: bool = True) -> PluginRegistry:
    """Run the discovery hooks and return what was registered, validated and de-duplicated.

    With ``strict=False`` a plugin whose discovery hook raises (or registers something invalid)
    is skipped: the problem is logged and kept in ``load_errors`` instead of raised.
    """
    reg = PluginRegistry()
    reg.distributions = dict(getattr(pm, "_perfsdk_dists", {}))
    reg.load_errors = list(getattr(pm, "_perfsdk_load_errors", []))

    from perfsdk.backends.base import Backend

    kinds: list[tuple[str, str, type, dict[str, Any]]] = [
        ("collector", "perfsdk_register_collectors", Collector, reg.collectors),
        ("exporter", "perfsdk_register_exporters", Exporter, reg.exporters),
        ("backend", "perfsdk_register_backends", Backend, reg.backends),
    ]
    for kind, hook, base, into in kinds:
        for impl in reversed(getattr(pm.hook, hook).get_hookimpls()):
            register = _registrar(kind, base, into, reg, impl.plugin_name)
            _call_discovery(impl, reg, strict, register=register)
    return reg


def _registrar(kind: str, base: type, into: dict[str, Any], reg: PluginRegistry, owner: str) -> Any:
    """The ``register`` callback a discovery hook gets: checks the class, keeps names unique."""

    def register(cls: type) -> None:
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise PluginError(f"plugin {owner}: register() expects a perfsdk.{base.__name__} subclass, got {cls!r}")
        if not cls.name:  # type: ignore[attr-defined]
            raise PluginError(f"plugin {owner}: {kind} {cls.__name__} has no name")
        name = cls.name  # type: ignore[attr-defined]
        prev = into.get(name)
        if prev is not None and prev is not cls:
            raise PluginError(f"plugin {owner}: {kind} name {name!r} already registered by "
                              f"{reg.origins.get(kind + ':' + name)}")
        into[name] = cls
        reg.origins[f"{kind}:{name}"] = owner

    return register


def _call_discovery(impl: Any, reg: PluginRegistry, strict: bool, **kwargs: Any) -> None:
    try:
        impl.function(**kwargs)
    except Exception as exc:
        if strict:
            raise
        log.warning("plugin failed during discovery", plugin=impl.plugin_name, error=repr(exc))
        reg.load_errors.append((impl.plugin_name, repr(exc)))


def collect_hardware(pm: pluggy.PluginManager) -> list[tuple[str, Any]]:
    """Run ``perfsdk_register_hardware``: a list of (plugin name, profile-like object)."""
    out: list[tuple[str, Any]] = []
    for impl in reversed(pm.hook.perfsdk_register_hardware.get_hookimpls()):
        owner = impl.plugin_name
        impl.function(register=lambda profile, _o=owner: out.append((_o, profile)))
    return out


def plugin_inventory(pm: pluggy.PluginManager, include_builtin: bool = False) -> list[dict[str, Any]]:
    """One entry per plugin: name, distribution, collectors, exporters, hardware, hooks."""
    reg = collect_registry(pm)
    hardware = collect_hardware(pm)
    rows = []
    for plugin in pm.get_plugins():
        name = _plugin_label(pm, plugin)
        builtin = name in DEFAULT_PLUGINS
        if builtin and not include_builtin:
            continue
        hooks = sorted(h.name for h in (pm.get_hookcallers(plugin) or []))
        rows.append(
            {
                "name": name,
                "builtin": builtin,
                "distribution": "perfsdk (built-in)" if builtin else reg.distributions.get(name),
                "collectors": sorted(k.split(":", 1)[1] for k, v in reg.origins.items() if v == name and k.startswith("collector:")),
                "exporters": sorted(k.split(":", 1)[1] for k, v in reg.origins.items() if v == name and k.startswith("exporter:")),
                "backends": sorted(k.split(":", 1)[1] for k, v in reg.origins.items() if v == name and k.startswith("backend:")),
                "hardware": sorted(_hw_name(p) for o, p in hardware if o == name),
                "hooks": hooks,
            }
        )
    rows.sort(key=lambda r: (r["builtin"], r["name"]))
    return rows


def _hw_name(profile: Any) -> str:
    if isinstance(profile, dict):
        return str(profile.get("name", "?"))
    return str(getattr(profile, "name", profile))


# -- the registry that reads stored runs ---------------------------------------------------------

#: Plugin objects registered for every plugin manager of this process (see register_plugin).
_PROCESS_PLUGINS: list[Any] = []
_CURRENT: contextvars.ContextVar[PluginRegistry | None] = contextvars.ContextVar("perfsdk_registry", default=None)


def register_plugin(plugin: Any) -> None:
    """Register a plugin object (a module or an object with ``perfsdk_*`` hooks) for every plugin
    manager this process creates from now on: sessions, the CLI and the readers of stored runs."""
    if plugin not in _PROCESS_PLUGINS:
        _PROCESS_PLUGINS.append(plugin)
    _default_registry.cache_clear()


def unregister_plugin(plugin: Any) -> None:
    """Undo :func:`register_plugin`."""
    if plugin in _PROCESS_PLUGINS:
        _PROCESS_PLUGINS.remove(plugin)
    _default_registry.cache_clear()


@functools.lru_cache(maxsize=4)
def _default_registry(_key: tuple[Any, ...]) -> PluginRegistry:
    return collect_registry(shared_plugin_manager(), strict=False)


def installed_registry() -> PluginRegistry:
    """The collectors and exporters installed here: what reads stored runs back.

    Inside :func:`using_registry` (a session storing and exporting its run, a CLI command) that
    registry; otherwise one built from the built-ins, entry points (honouring the environment
    switches) and :func:`register_plugin`'s plugins, made once per process.
    """
    cur = _CURRENT.get()
    if cur is not None:
        return cur
    key = (autoload_disabled(), os.environ.get("PERFSDK_PLUGINS"), tuple(id(p) for p in _PROCESS_PLUGINS))
    return _default_registry(key)


@contextlib.contextmanager
def using_registry(registry: PluginRegistry) -> Iterator[PluginRegistry]:
    """Make ``registry`` the one :func:`installed_registry` returns inside the block."""
    token = _CURRENT.set(registry)
    try:
        yield registry
    finally:
        _CURRENT.reset(token)


def ordered_collectors(names: Any, registry: PluginRegistry | None = None) -> list[str]:
    """Collector names in presentation order: as registered (built-ins first), then the rest."""
    reg = registry or installed_registry()
    present = list(names)
    known = list(reg.collectors)

    def rank(n: str) -> tuple[int, int]:
        origin = reg.origins.get("collector:" + n, "")
        builtin = DEFAULT_PLUGINS.index(origin) if origin in DEFAULT_PLUGINS else len(DEFAULT_PLUGINS)
        return builtin, (known.index(n) if n in known else len(known))

    return sorted(present, key=rank)
