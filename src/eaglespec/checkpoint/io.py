"""Tensor files of a checkpoint directory: safetensors (single or sharded) and legacy .bin.

Reads refuse truncated or malformed files with a one-line CheckpointError naming the file;
writes are atomic (temporary directory, then rename) so nothing the user had is overwritten
half-way.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from eaglespec.errors import CheckpointError

SAFE_SINGLE = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"
BIN_SINGLE = "pytorch_model.bin"
BIN_INDEX = "pytorch_model.bin.index.json"


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except FileNotFoundError:
        raise CheckpointError(path, "file not found") from None
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(path, f"not a readable safetensors file (truncated or corrupt: {exc})") from None


def _load_bin(path: Path) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(path, "file not found") from None
    except Exception as exc:  # torch raises many types for bad pickles
        raise CheckpointError(path, f"not a loadable weights-only torch file ({type(exc).__name__})") from None
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(path, "expected a flat mapping of tensor names to tensors")
    return dict(state)


def _load_index(index_path: Path, loader) -> dict[str, torch.Tensor]:
    from eaglespec.checkpoint.config import read_json

    index = read_json(index_path)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(index_path, "field 'weight_map' must be a non-empty object")
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard or Path(shard).name != shard or shard in (".", ".."):
            raise CheckpointError(index_path, f"field 'weight_map' maps tensor {name!r} to {shard!r}: expected a "
                                              "file name in the checkpoint directory")
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        shard_path = index_path.parent / shard
        if not shard_path.is_file():
            raise CheckpointError(shard_path, f"shard listed in {index_path.name} is missing")
        state.update(loader(shard_path))
    missing = sorted(set(weight_map) - set(state))
    if missing:
        raise CheckpointError(index_path, f"tensor {missing[0]!r} listed in 'weight_map' is in no shard")
    return state


def weights_file(directory: Path) -> Path:
    """The file load_state_dict reads first (index or single file): what errors about tensors name."""
    directory = Path(directory)
    for name in (SAFE_INDEX, SAFE_SINGLE, BIN_INDEX, BIN_SINGLE):
        if (directory / name).is_file():
            return directory / name
    raise CheckpointError(directory, f"no weights found (expected {SAFE_SINGLE}, {SAFE_INDEX} or {BIN_SINGLE})")


def load_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory (safetensors preferred; .bin only weights-only)."""
    path = weights_file(directory)
    if path.name == SAFE_INDEX:
        return _load_index(path, _load_safetensors)
    if path.name == SAFE_SINGLE:
        return _load_safetensors(path)
    if path.name == BIN_INDEX:
        return _load_index(path, _load_bin)
    return _load_bin(path)


def replace_dir(new: Path, directory: Path) -> None:
    """Put the finished directory `new` at `directory` by renames (the old one is removed only after)."""
    if directory.exists():
        backup = directory.with_name(f".{directory.name}.old")
        shutil.rmtree(backup, ignore_errors=True)
        os.replace(directory, backup)
        os.replace(new, directory)
        shutil.rmtree(backup, ignore_errors=True)
    else:
        os.replace(new, directory)


def save_state_dict(
    state: Mapping[str, torch.Tensor],
    directory: Path,
    config: Mapping[str, Any],
    *,
    max_shard_bytes: int = 15 * 1000 * 1000,
    extra_files: Mapping[str, str] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write config.json + safetensors (sharded above `max_shard_bytes`) atomically into `directory`."""
    from safetensors.torch import save_file

    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise CheckpointError(directory, "exists and is not a directory; refusing to replace it")
    if directory.exists() and any(directory.iterdir()) and not overwrite:
        raise CheckpointError(directory, "exists and is not empty (pass overwrite=True / --overwrite to replace it)")
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        shards: list[dict[str, torch.Tensor]] = [{}]
        sizes = [0]
        for name in sorted(state):
            t = state[name].detach().to("cpu").contiguous()
            nbytes = t.numel() * t.element_size()
            if sizes[-1] and sizes[-1] + nbytes > max_shard_bytes:
                shards.append({})
                sizes.append(0)
            shards[-1][name] = t
            sizes[-1] += nbytes
        if len(shards) == 1:
            save_file(shards[0], str(tmp / SAFE_SINGLE), metadata={"format": "pt"})
        else:
            weight_map = {}
            for i, shard in enumerate(shards):
                fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                save_file(shard, str(tmp / fname), metadata={"format": "pt"})
                weight_map.update(dict.fromkeys(shard, fname))
            (tmp / SAFE_INDEX).write_text(json.dumps(
                {"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}, indent=2))
        (tmp / "config.json").write_text(json.dumps(dict(config), indent=2) + "\n")
        for fname, text in (extra_files or {}).items():
            (tmp / fname).write_text(text)
        replace_dir(tmp, directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory
