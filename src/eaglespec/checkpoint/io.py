"""Tensor files of a checkpoint directory: safetensors (single or sharded) and legacy .bin.

Reads refuse truncated or malformed files with a one-line CheckpointError naming the file;
writes are atomic (temporary directory, then rename) so nothing the user had is overwritten
half-way. A write is one `model.safetensors` up to `max_shard_bytes` (5 GB, Hugging Face's
default), else shards with a `model.safetensors.index.json`: SafeAILab's loader reads only the
single file.
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

from eaglespec.errors import CheckpointError, EagleSpecError

SAFE_SINGLE = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"
BIN_SINGLE = "pytorch_model.bin"
BIN_INDEX = "pytorch_model.bin.index.json"
DEFAULT_MAX_SHARD_BYTES = 5 * 1000**3
_SIZE_UNITS = {"": 1, "B": 1, "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4,
               "KIB": 1024, "MIB": 1024**2, "GIB": 1024**3, "TIB": 1024**4}
_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def parse_size(text: str | int) -> int:
    """'5GB', '500MB', '2GiB' or a plain byte count -> bytes (Hugging Face's max_shard_size spelling)."""
    s = str(text).strip().upper().replace(" ", "")
    digits = s.rstrip("KMGTIB")
    unit = s[len(digits):]
    try:
        value = float(digits) if not isinstance(text, bool) else -1.0
    except ValueError:
        value = -1.0
    if unit not in _SIZE_UNITS or not value > 0 or value == float("inf"):
        raise EagleSpecError(f"--max-shard-size must be a positive size such as 5GB, 500MB or 2GiB, got {text!r}")
    return int(value * _SIZE_UNITS[unit])


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


def weight_map(directory: Path) -> dict[str, Path]:
    """Tensor name -> the file holding it, from the index or the single file's header (no tensor is read)."""
    from safetensors import safe_open

    from eaglespec.checkpoint.config import read_json

    path = weights_file(directory)
    if path.name in (SAFE_INDEX, BIN_INDEX):
        index = read_json(path).get("weight_map")
        if not isinstance(index, dict) or not index:
            raise CheckpointError(path, "field 'weight_map' must be a non-empty object")
        return {name: path.parent / Path(str(shard)).name for name, shard in index.items()}
    if path.name == SAFE_SINGLE:
        try:
            with safe_open(str(path), "pt") as f:
                return dict.fromkeys(f.keys(), path)
        except Exception as exc:  # safetensors raises its own error types for bad headers
            raise CheckpointError(path, f"not a readable safetensors file ({exc})") from None
    return dict.fromkeys(_load_bin(path), path)


def read_tensor(directory: Path, name: str) -> torch.Tensor:
    """One tensor of a checkpoint directory, reading only the file that holds it."""
    from safetensors import safe_open

    files = weight_map(directory)
    if name not in files:
        raise CheckpointError(weights_file(directory), f"tensor {name!r} is not in the weights")
    path = files[name]
    if not path.is_file():
        raise CheckpointError(path, f"shard holding tensor {name!r} is missing")
    if path.suffix == ".safetensors":
        try:
            with safe_open(str(path), "pt") as f:
                return f.get_tensor(name)
        except Exception as exc:
            raise CheckpointError(path, f"not a readable safetensors file ({exc})") from None
    return _load_bin(path)[name]


def floating_dtype(directory: Path) -> torch.dtype | None:
    """The dtype of the checkpoint's floating tensors, read from the safetensors headers (.bin: loaded); mixed
    dtypes give the widest of them (float32 over bfloat16 / float16), so writing in it loses nothing. None: no
    floating tensors."""
    from safetensors import safe_open

    found: set[torch.dtype] = set()
    for path in sorted(set(weight_map(directory).values())):
        if path.suffix == ".safetensors":
            with safe_open(str(path), "pt") as f:
                found |= {_SAFETENSORS_DTYPES[d] for d in (f.get_slice(k).get_dtype() for k in f.keys())  # noqa: SIM118
                          if d in _SAFETENSORS_DTYPES}
        else:
            found |= {t.dtype for t in _load_bin(path).values() if t.is_floating_point()}
    if len(found) <= 1:
        return next(iter(found), None)
    return max(found | {torch.float32}, key=lambda d: torch.finfo(d).bits)


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


def _default_permissions(directory: Path) -> None:
    """The modes a plain mkdir / open would give under the user's umask (mkdtemp and safetensors write owner-only
    files; a served checkpoint is read by other users, e.g. a container's)."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(directory, 0o777 & ~mask)
    for path in directory.iterdir():
        os.chmod(path, 0o666 & ~mask)


def save_state_dict(
    state: Mapping[str, torch.Tensor],
    directory: Path,
    config: Mapping[str, Any],
    *,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    extra_files: Mapping[str, str] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write config.json + safetensors atomically into `directory`: one model.safetensors when the tensors fit in
    `max_shard_bytes`, else model-0000i-of-0000n.safetensors shards and their index."""
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
        _default_permissions(tmp)
        replace_dir(tmp, directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory
