"""Prompts and labels from a Hugging Face ``datasets`` dataset (``workload.dataset``).

``path`` is tried in this order:

1. a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``
   (read with ``datasets.load_from_disk``);
2. a local data file, ``.csv``, ``.json``, ``.jsonl`` or ``.parquet`` (``datasets.load_dataset``
   with the matching builder);
3. otherwise a dataset name on the Hub (``datasets.load_dataset(path, name, split=split)``),
   which needs network access the first time.

``num_prompts`` rows are sampled with ``seed`` by the same rule as prompt files (a subset in
dataset order; the rows repeated when there are fewer), and only those rows are read. The
prompt is the ``prompt_column`` value, or ``prompt_template`` filled with the row's columns.
A ``ClassLabel`` label column is turned into its class names. ``datasets`` is an optional
dependency (``pip install 'perfsdk[datasets]'``).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from perfsdk.config import ConfigError, DatasetConfig
from perfsdk.models.prompts import Example, label_value, pick_indices

_FIELD = "workload.dataset"
_FILE_BUILDERS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def datasets_status() -> tuple[bool, str]:
    """Whether the ``datasets`` package can be imported (without importing it)."""
    if importlib.util.find_spec("datasets") is None:
        return False, "not installed"
    return True, "installed"


def _import_datasets() -> Any:
    ok, why = datasets_status()
    if not ok:
        raise ConfigError(f"{_FIELD}: needs the datasets package ({why}): pip install 'perfsdk[datasets]'")
    import datasets

    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    return datasets


def _offline() -> bool:
    return any(os.environ.get(k, "").strip().lower() in ("1", "true", "yes", "on")
               for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def _pick_split(datasets: Any, obj: Any, cfg: DatasetConfig) -> Any:
    """A ``Dataset`` from what was loaded (a ``DatasetDict`` needs a split unless it has one)."""
    if not isinstance(obj, datasets.DatasetDict):
        return obj
    splits = list(obj.keys())
    if cfg.split is None:
        if len(splits) == 1:
            return obj[splits[0]]
        raise ConfigError(f"{_FIELD}.split: {cfg.path} has several splits ({', '.join(splits)}); choose one")
    if cfg.split not in obj:
        raise ConfigError(f"{_FIELD}.split: {cfg.path} has no split {cfg.split!r} (splits: {', '.join(splits)})")
    return obj[cfg.split]


def open_dataset(cfg: DatasetConfig) -> Any:
    """The ``datasets.Dataset`` that ``cfg`` names (one split)."""
    datasets = _import_datasets()
    path = Path(cfg.path).expanduser()
    try:
        if path.is_dir():
            if not any((path / f).is_file() for f in ("dataset_info.json", "state.json", "dataset_dict.json")):
                raise ConfigError(f"{_FIELD}.path: folder {cfg.path} was not written by save_to_disk "
                                  "(no dataset_info.json, state.json or dataset_dict.json)")
            obj = datasets.load_from_disk(os.fspath(path))
        elif path.is_file():
            builder = _FILE_BUILDERS.get(path.suffix.lower())
            if builder is None:
                raise ConfigError(f"{_FIELD}.path: {cfg.path}: unsupported data file type {path.suffix!r} "
                                  f"(use {', '.join(_FILE_BUILDERS)} or a save_to_disk folder)")
            obj = datasets.load_dataset(builder, data_files=os.fspath(path), split=cfg.split or "train")
        elif cfg.path.startswith((".", "/", "~")) or path.suffix.lower() in _FILE_BUILDERS:
            raise ConfigError(f"{_FIELD}.path: {cfg.path} not found")
        else:
            obj = datasets.load_dataset(cfg.path, cfg.name, split=cfg.split)
    except ConfigError:
        raise
    except (OSError, ValueError, FileNotFoundError, ConnectionError) as err:
        hint = " (HF_HUB_OFFLINE is set and it is not in the local cache)" if _offline() else ""
        raise ConfigError(f"{_FIELD}.path: could not load {cfg.path!r}{hint}: {err}") from None
    except Exception as err:  # datasets raises its own types (DatasetNotFoundError, ...)
        raise ConfigError(f"{_FIELD}.path: could not load {cfg.path!r}: {type(err).__name__}: {err}") from None
    return _pick_split(datasets, obj, cfg)


def _class_names(ds: Any, column: str) -> list[str] | None:
    feature = getattr(ds, "features", {}).get(column)
    names = getattr(feature, "names", None)
    return [str(n) for n in names] if names else None


def load_dataset_examples(cfg: DatasetConfig, num_prompts: int, seed: int) -> tuple[list[Example], list[str] | None]:
    """``num_prompts`` examples sampled with ``seed`` from the dataset ``cfg`` names, and the
    class names of a ``ClassLabel`` label column (``None`` for other columns).

    The label column must exist when it was named (the default ``label`` may be absent: the
    prompts are then unlabelled). Every problem names ``workload.dataset``, the dataset, the
    row and the column.
    """
    ds = open_dataset(cfg)
    columns = list(ds.column_names)
    shown = ", ".join(columns)
    if cfg.prompt_template is None and cfg.prompt_column not in columns:
        raise ConfigError(f"{_FIELD}.prompt_column: column {cfg.prompt_column!r} not in {cfg.path} (columns: {shown})")
    label_col = cfg.label_column
    if label_col is not None and label_col not in columns:
        if "label_column" in cfg.model_fields_set:
            raise ConfigError(f"{_FIELD}.label_column: column {label_col!r} not in {cfg.path} (columns: {shown})")
        label_col = None
    total = len(ds)
    if total == 0:
        raise ConfigError(f"{_FIELD}: {cfg.path} has no rows")
    indices = pick_indices(total, num_prompts, seed)
    unique = sorted(set(indices))
    rows = ds.select(unique)
    names = _class_names(ds, label_col) if label_col else None
    by_index: dict[int, Example] = {}
    for i, row in zip(unique, rows):
        where = f"{cfg.path} row {i}"
        if cfg.prompt_template is not None:
            try:
                prompt = cfg.prompt_template.format_map(row)
            except KeyError as err:
                raise ConfigError(f"{_FIELD}.prompt_template: {where}: no column {err.args[0]!r} (columns: {shown})") from None
            except (ValueError, IndexError) as err:
                raise ConfigError(f"{_FIELD}.prompt_template: {err}") from None
        else:
            prompt = row[cfg.prompt_column]
        if not isinstance(prompt, str) or not prompt.strip():
            raise ConfigError(f"{_FIELD}.prompt_column: {where}: {cfg.prompt_column!r} must be a non-empty string")
        label = None
        if label_col is not None:
            raw = row[label_col]
            if raw is None:
                raise ConfigError(f"{_FIELD}.label_column: {where}: {label_col!r} is empty")
            if names is not None and isinstance(raw, int) and not isinstance(raw, bool):
                if not 0 <= raw < len(names):  # ClassLabel uses -1 for "no label"
                    raise ConfigError(f"{_FIELD}.label_column: {where}: {label_col!r} is {raw}, not a class "
                                      f"index of the dataset ({len(names)} classes)")
                raw = names[raw]
            label = label_value(raw, f"{_FIELD}.label_column: {where}: {label_col!r}")
        by_index[i] = Example(prompt, label, where)
    return [by_index[i] for i in indices], names
