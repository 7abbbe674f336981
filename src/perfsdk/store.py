"""The result store: one folder per run plus a SQLite index.

Layout::

    <root>/index.sqlite
    <root>/runs/<run_id>/result.json        # the validated RunResult
    <root>/runs/<run_id>/series/<name>.jsonl # raw time series (per-token timestamps, samples)
    <root>/runs/<run_id>/artifacts/<file>    # e.g. profiler traces
    <root>/runs/<run_id>/export.<ext>        # exports written at the end of the run

A run folder is written under a temporary name and renamed into place, so a reader never sees
a half-written run and a process killed mid-write leaves only a ``.tmp-*`` folder behind (ignored,
cleaned by ``perfsdk store repair``). The index is updated after the rename in a SQLite
transaction; the folders are the source of truth and the index can always be rebuilt.

Files and folders get the modes the process umask allows (``0o666 & ~umask`` and
``0o777 & ~umask``), like any file the user creates, although they are written through private
temporary names first: a store shared by a team (umask 002) stays readable and writable by it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Iterable
from contextlib import closing
from pathlib import Path
from typing import Any

import structlog

from perfsdk.collector import Exporter
from perfsdk.schemas import RunResult

log = structlog.get_logger("perfsdk.store")

_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")
RESULT_FILE = "result.json"


class StoreError(RuntimeError):
    """The store could not read or write a run."""


class RunNotFound(StoreError):
    """No run with this id (or id prefix) in the store."""


class DamagedRun(StoreError):
    """The run's folder is there but its result cannot be read (``perfsdk store repair``)."""


class AmbiguousRunId(StoreError):
    """An id prefix that matches more than one run; ``candidates`` lists them."""

    def __init__(self, message: str, candidates: list[str]) -> None:
        super().__init__(message)
        self.candidates = candidates


#: The word that names the most recent run wherever a run id is expected.
LATEST = "latest"


def safe_name(name: str, what: str = "name") -> str:
    """A file or folder name that cannot escape its parent (no separators, no leading dot)."""
    if not _SAFE.match(name) or ".." in name:
        raise StoreError(f"{what} {name!r} is not a safe file name (letters, digits, '.', '_', '-')")
    return name


def _sanitize(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".") or "unnamed"
    return cleaned[:200]


def _unique(stem: str, suffix: str, taken: Iterable[str]) -> str:
    """``stem + suffix``, or ``stem-2 + suffix``... when two names sanitize to the same file."""
    used = set(taken)
    fname, n = stem + suffix, 1
    while fname in used:
        n += 1
        fname = f"{stem}-{n}{suffix}"
    return fname


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere the only way to read it is to set it (and put it back)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode a new file gets from ``open()``: ``0o666`` less the umask."""
    return 0o666 & ~current_umask()


def dir_mode() -> int:
    """The mode a new folder gets from ``mkdir``: ``0o777`` less the umask."""
    return 0o777 & ~current_umask()


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename.

    The file ends with the usual mode for a new file (``0o666 & ~umask``), not the private
    ``0o600`` of the temporary file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        os.chmod(tmp, file_mode())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class Store:
    """A folder of runs with a SQLite index; safe for many processes writing at once."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.runs_dir = self.root / "runs"
        self.index_path = self.root / "index.sqlite"

    # -- index ----------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        new = not self.index_path.exists()
        conn = sqlite3.connect(self.index_path, timeout=60, isolation_level=None)
        if new:
            # SQLite creates 0o644 whatever the umask; the WAL and shm files copy this mode
            try:
                os.chmod(self.index_path, file_mode())
            except OSError:
                pass
        conn.execute("PRAGMA busy_timeout=60000")
        try:
            conn.execute("PRAGMA journal_mode=WAL")
        except sqlite3.OperationalError:
            pass
        conn.execute(
            """CREATE TABLE IF NOT EXISTS runs (
                 run_id TEXT PRIMARY KEY, name TEXT, status TEXT, started_at TEXT,
                 finished_at TEXT, model_id TEXT, tags TEXT, path TEXT)"""
        )
        return conn

    def _index(self, result: RunResult) -> None:
        row = (
            result.run_id, result.name, result.status, result.started_at.isoformat(),
            result.finished_at.isoformat() if result.finished_at else None,
            result.model.model_id if result.model else None, json.dumps(result.tags, sort_keys=True),
            str(Path("runs") / result.run_id),
        )
        for attempt in range(20):
            try:
                with closing(self._connect()) as conn:
                    conn.execute("INSERT OR REPLACE INTO runs VALUES (?,?,?,?,?,?,?,?)", row)
                return
            except sqlite3.OperationalError as exc:  # locked under heavy contention: back off
                if attempt == 19:
                    raise StoreError(f"{self.index_path}: could not update index: {exc}") from exc
                time.sleep(0.05 * (attempt + 1))

    # -- write ----------------------------------------------------------------------------

    def run_dir(self, run_id: str) -> Path:
        return self.runs_dir / safe_name(run_id, "run id")

    def save(self, result: RunResult, series: dict[str, list[dict[str, Any]]] | None = None,
             artifacts: dict[str, bytes] | None = None) -> Path:
        """Write a run atomically and index it. Returns the run folder."""
        final = self.run_dir(result.run_id)
        if final.exists():
            raise StoreError(f"run {result.run_id} already exists in {self.root}")
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{result.run_id}-", dir=self.runs_dir))
        try:
            os.chmod(tmp, dir_mode())  # mkdtemp makes it private (0o700)
            series_files: dict[str, str] = dict(result.series)
            for name, rows in (series or {}).items():
                fname = _unique(f"series/{_sanitize(name)}", ".jsonl", series_files.values())
                (tmp / "series").mkdir(exist_ok=True)
                with open(tmp / fname, "w", encoding="utf-8") as fh:
                    for row in rows:
                        fh.write(json.dumps(row, default=str))
                        fh.write("\n")
                series_files[name] = fname
            artifact_files: dict[str, str] = dict(result.artifacts)
            for name, data in (artifacts or {}).items():
                fname = _unique(f"artifacts/{_sanitize(name)}", "", artifact_files.values())
                (tmp / "artifacts").mkdir(exist_ok=True)
                (tmp / fname).write_bytes(data)
                artifact_files[name] = fname
            stored = result.model_copy(update={"series": series_files, "artifacts": artifact_files})
            with open(tmp / RESULT_FILE, "w", encoding="utf-8") as fh:
                fh.write(stored.model_dump_json(indent=2))
                fh.flush()
                os.fsync(fh.fileno())
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._index(stored)
        return final

    def write_export(self, run_id: str, exporter: Exporter) -> Path:
        """Write one run through ``exporter`` into its folder as ``export.<ext>``."""
        if exporter.destination:
            raise StoreError(f"exporter {exporter.name} sends runs to a destination, not into the run folder: "
                             f"use perfsdk export --format {exporter.name} --output DESTINATION")
        run = self.get(run_id)
        path = self.run_dir(run_id) / f"export.{exporter.extension or exporter.name}"
        import io

        buf: Any = io.BytesIO() if exporter.binary else io.StringIO()
        ok = exporter.export([run], buf)
        if not ok:
            raise StoreError(f"exporter {exporter.name} failed for run {run_id}")
        data = buf.getvalue()
        atomic_write(path, data if isinstance(data, bytes) else data.encode("utf-8"))
        return path

    # -- read -----------------------------------------------------------------------------

    def get(self, run_id: str) -> RunResult:
        """Read one run: :class:`RunNotFound` when absent, :class:`DamagedRun` when unreadable."""
        folder = self.run_dir(run_id)
        path = folder / RESULT_FILE
        if not path.is_file():
            if folder.is_dir() or (self.runs_dir / f".damaged-{run_id}").is_dir():
                raise DamagedRun(f"run {run_id} is damaged: no {RESULT_FILE} in its folder "
                                 f"(see perfsdk store check --store {self.root})")
            raise RunNotFound(f"run {run_id} not found in {self.root}")
        try:
            run = RunResult.model_validate_json(path.read_text(encoding="utf-8"))
        except Exception as exc:
            raise DamagedRun(f"run {run_id} is damaged: {path}: unreadable run: {exc} "
                             f"(perfsdk store repair --store {self.root} moves it aside)") from exc

        return revalidate(run, str(self.root))

    def resolve_run_id(self, ident: str) -> str:
        """The full run id for ``ident``: a run id, a unique prefix of one, or ``latest``.

        ``latest`` is the run started last. Raises :class:`RunNotFound`, or
        :class:`AmbiguousRunId` listing the candidates when a prefix matches several runs.
        """
        ids = self.run_ids()
        if ident == LATEST:
            if not ids:
                raise RunNotFound(f"no runs in {self.root}")
            return self._latest(ids)
        if ident in ids:
            return ident
        matches = [i for i in ids if ident and i.startswith(ident)]
        if len(matches) == 1:
            return matches[0]
        if matches:
            shown = ", ".join(matches[:10]) + (f" and {len(matches) - 10} more" if len(matches) > 10 else "")
            raise AmbiguousRunId(f"run id prefix {ident!r} matches {len(matches)} runs: {shown}", matches)
        if _SAFE.match(ident) and ".." not in ident and (
                self.run_dir(ident).is_dir() or (self.runs_dir / f".damaged-{ident}").is_dir()):
            return ident  # a damaged folder: get() says so
        raise RunNotFound(f"run {ident} not found in {self.root}")

    def _latest(self, ids: list[str]) -> str:
        """The run with the latest start time in the index (run ids sort by time otherwise)."""
        if self.index_path.exists():
            try:
                with closing(self._connect()) as conn:
                    for (rid,) in conn.execute("SELECT run_id FROM runs ORDER BY started_at DESC, run_id DESC"):
                        if rid in ids:
                            return str(rid)
            except sqlite3.Error:
                pass
        return ids[-1]

    def run_ids(self) -> list[str]:
        """Complete runs on disk (folders with a result file), oldest first."""
        if not self.runs_dir.is_dir():
            return []
        ids = [p.name for p in self.runs_dir.iterdir()
               if p.is_dir() and not p.name.startswith(".") and (p / RESULT_FILE).is_file()]
        return sorted(ids)

    def list_runs(self, run_ids: Iterable[str] | None = None, *, name: str | None = None,
                  status: str | None = None, tags: dict[str, str] | None = None,
                  skip_unreadable: bool = True) -> list[RunResult]:
        """Runs (oldest first), optionally only the given ids or those matching filters."""
        ids = list(run_ids) if run_ids is not None else self.run_ids()
        out = []
        for rid in ids:
            try:
                run = self.get(rid)
            except StoreError:
                if not skip_unreadable or run_ids is not None:
                    raise
                log.warning("skipping unreadable run", run_id=rid)
                continue
            if name is not None and run.name != name:
                continue
            if status is not None and run.status != status:
                continue
            if tags and any(run.tags.get(k) != v for k, v in tags.items()):
                continue
            out.append(run)
        return out

    def read_series(self, run_id: str, name: str) -> list[dict[str, Any]]:
        """A stored time series as a list of rows."""
        run = self.get(run_id)
        fname = run.series.get(name)
        if fname is None:
            raise StoreError(f"run {run_id} has no series {name!r} (has: {', '.join(sorted(run.series)) or 'none'})")
        rows = []
        with open(self.run_dir(run_id) / fname, encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    rows.append(json.loads(line))
        return rows

    def indexed_ids(self) -> list[str]:
        if not self.index_path.exists():
            return []
        with closing(self._connect()) as conn:
            return [r[0] for r in conn.execute("SELECT run_id FROM runs ORDER BY run_id")]

    # -- maintenance ----------------------------------------------------------------------

    def check(self) -> dict[str, list[str]]:
        """Differences between folders and index: ``unindexed``, ``missing`` (indexed, no
        folder), ``unreadable`` (damaged result files), ``temporary`` (half-written runs)."""
        on_disk = set(self.run_ids())
        indexed = set(self.indexed_ids())
        unreadable = []
        for rid in sorted(on_disk):
            try:
                self.get(rid)
            except StoreError:
                unreadable.append(rid)
        temporary = sorted(p.name for p in self.runs_dir.iterdir() if p.name.startswith(".tmp-")) if self.runs_dir.is_dir() else []
        return {
            "unindexed": sorted(on_disk - indexed),
            "missing": sorted(indexed - on_disk),
            "unreadable": unreadable,
            "temporary": temporary,
        }

    def repair(self) -> dict[str, list[str]]:
        """Index unindexed runs, drop index rows without folders, move damaged runs aside
        (``runs/.damaged-<id>``) and remove half-written temporary folders."""
        report = self.check()
        for rid in report["unreadable"]:
            os.rename(self.run_dir(rid), self.runs_dir / f".damaged-{rid}")
        for rid in report["unindexed"]:
            if rid not in report["unreadable"]:
                self._index(self.get(rid))
        with closing(self._connect()) as conn:
            for rid in report["missing"] + report["unreadable"]:
                conn.execute("DELETE FROM runs WHERE run_id = ?", (rid,))
        for name in report["temporary"]:
            shutil.rmtree(self.runs_dir / name, ignore_errors=True)
        return report


def revalidate(run: RunResult, store_root: str | None = None) -> RunResult:
    """Re-validate each collector's stored result against its installed ``Result`` model.

    A collector that is installed gets its typed result cached on the run (``validated`` true, or
    false with the error); a collector that is not installed keeps its stored dict, marked
    ``installed: false`` in ``collector_meta``.
    """
    from pydantic import ValidationError

    from perfsdk.errors import format_validation_error
    from perfsdk.plugins import installed_registry
    from perfsdk.schemas import CollectorMeta

    reg = installed_registry()
    meta = dict(run.collector_meta)
    typed: dict[str, Any] = {}
    for name, data in run.collectors.items():
        cls = reg.collectors.get(name)
        m = meta.get(name) or CollectorMeta(plugin=reg.origins.get("collector:" + name))
        if cls is None:
            m = m.model_copy(update={"installed": False, "validated": None, "validation_error": None})
        else:
            err = None
            try:
                typed[name] = cls.Result.model_validate(data)
            except ValidationError as exc:  # kept as stored; the problem is named
                err = format_validation_error(exc)[:500]
            m = m.model_copy(update={"installed": True, "validated": err is None, "validation_error": err})
        meta[name] = m
    out = run.model_copy(update={"collector_meta": meta}) if meta != run.collector_meta else run
    out._store_root = store_root
    for name, res in typed.items():
        out._typed[name] = (out.collectors[name], res)
    return out
