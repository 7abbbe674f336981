"""CodeCarbon as one more energy source, offline and quiet, with CO2 for a configured country.

It runs ``codecarbon.OfflineEmissionsTracker`` from session start to finalize, so it yields
one row, for the ``session`` window only: CodeCarbon measures on its own schedule (15 s by
default) and cannot see a single generate call. No network (offline tracker), no files
(``output_methods=[]``), no lock file (``allow_multiple_runs=True``), logging at ``error``.
Its row is labeled ``method: estimated``: CodeCarbon's RAM figure is always a model, and its
CPU figure is one too (TDP × load) unless it found RAPL; ``cpu_mode`` says which.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import structlog

log = structlog.get_logger("perfsdk.energy.codecarbon")

@dataclass
class CodeCarbonReading:
    """What CodeCarbon reported for the session."""

    energy_j: float
    cpu_energy_j: float
    gpu_energy_j: float
    ram_energy_j: float
    co2_kg: float
    duration_s: float
    country_iso_code: str | None
    region: str | None
    cpu_mode: str | None
    tracking_mode: str
    method: str


def codecarbon_status() -> tuple[bool, str]:
    """Whether CodeCarbon can be imported, and its version."""
    try:
        import codecarbon
    except ImportError:
        return False, "codecarbon is not installed (pip install codecarbon)"
    return True, f"codecarbon {getattr(codecarbon, '__version__', '?')}"


class CodeCarbonSource:
    """Starts an offline tracker at :meth:`start` and reads its totals at :meth:`stop`."""

    name = "codecarbon"

    def __init__(self, country_iso_code: str = "USA", region: str | None = None,
                 tracking_mode: str = "machine", measure_power_secs: float = 15.0) -> None:
        self.country_iso_code = country_iso_code
        self.region = region
        self.tracking_mode = tracking_mode
        self.measure_power_secs = measure_power_secs
        self.available = False
        self.reason = "not started"
        self._tracker: Any = None

    def start(self) -> tuple[bool, str]:
        ok, why = codecarbon_status()
        if not ok:
            self.reason = why
            return False, why
        from codecarbon import OfflineEmissionsTracker

        cc_log = logging.getLogger("codecarbon")
        cc_log.setLevel(logging.ERROR)  # importing codecarbon resets it to INFO
        kwargs: dict[str, Any] = dict(
            country_iso_code=self.country_iso_code,
            output_methods=[],
            save_to_file=False,
            log_level="error",
            allow_multiple_runs=True,
            measure_power_secs=self.measure_power_secs,
            tracking_mode=self.tracking_mode,
            project_name="perfsdk",
        )
        if self.region:
            kwargs["region"] = self.region
        try:
            self._tracker = OfflineEmissionsTracker(**kwargs)
            self._tracker.start()
        except Exception as exc:
            self._tracker = None
            self.reason = f"CodeCarbon failed to start: {exc!r}"
            log.warning("codecarbon failed to start", error=repr(exc))
            return False, self.reason
        self.available = True
        self.reason = f"{why}, offline, country {self.country_iso_code}" + (f", region {self.region}" if self.region else "")
        return True, self.reason

    @staticmethod
    def _cpu_mode(tracker: Any) -> str | None:
        for hw in getattr(tracker, "_hardware", []) or []:
            mode = getattr(hw, "_mode", None)
            if type(hw).__name__ == "CPU" and mode:
                return str(mode)
        return None

    def stop(self) -> CodeCarbonReading | None:
        """Stop the tracker (idempotent); ``None`` if it never ran or failed to stop."""
        tr, self._tracker = self._tracker, None
        if tr is None:
            return None
        try:
            cpu_mode = self._cpu_mode(tr)
            timers = [getattr(sch, "_timer", None) for sch in
                      (getattr(tr, "_scheduler", None), getattr(tr, "_scheduler_monitor_power", None))]
            tr.stop()
            # CodeCarbon cancels its timer threads but does not wait for them: do, so that
            # no thread outlives the session.
            for timer in timers:
                if timer is not None and timer.is_alive():
                    timer.join(timeout=2)
            d = tr.final_emissions_data
        except Exception as exc:
            self.reason = f"CodeCarbon failed to stop: {exc!r}"
            log.warning("codecarbon failed to stop", error=repr(exc))
            return None
        if d is None:
            self.reason = "CodeCarbon returned no data"
            return None
        kwh = 3.6e6
        return CodeCarbonReading(
            energy_j=float(d.energy_consumed) * kwh,
            cpu_energy_j=float(d.cpu_energy or 0.0) * kwh,
            gpu_energy_j=float(d.gpu_energy or 0.0) * kwh,
            ram_energy_j=float(d.ram_energy or 0.0) * kwh,
            co2_kg=float(d.emissions),
            duration_s=float(d.duration),
            country_iso_code=getattr(d, "country_iso_code", None) or self.country_iso_code,
            region=getattr(d, "region", None) or self.region,
            cpu_mode=cpu_mode,
            tracking_mode=self.tracking_mode,
            method="estimated",
        )
