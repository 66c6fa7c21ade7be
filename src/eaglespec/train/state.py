"""A training run's state on disk: one JSON file and safetensors shards of at most `max_shard_bytes` each.

    training_state.json                        everything that is not a tensor (the caller's fields) plus the
                                               shard list (file, bytes, sha256) and where each tensor lives
    training_state-00001-of-0000N.safetensors  the tensors

Nothing is unpickled on reading: the JSON is parsed and the shards are read with safetensors. A tensor larger than
the room left in a shard is stored flattened in pieces (`name#0`, `name#1`, ...), so every file, header included,
stays within the limit whatever the tensor sizes. Before a shard is read its size and sha256 are checked against
the JSON: a missing, truncated or altered shard is a one-line CheckpointError naming it.

pack_optimizer / unpack_optimizer split a torch optimizer's state_dict into JSON (param-group hyperparameters, the
per-parameter state layout and its non-tensor values) and tensors (its moments and step counts).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

import torch

from eaglespec.errors import CheckpointError, EagleSpecError

STATE_JSON = "training_state.json"
SHARD_PREFIX = "training_state-"
FORMAT = "eaglespec-training-state"
VERSION = 1
DEFAULT_SHARD_BYTES = 15 * 1000**2
MIN_SHARD_BYTES = 1024
_HEADER_BASE = 64  # the 8-byte header length, braces and up to 7 bytes of padding, with room to spare
_ENTRY_BASE = 128  # one header entry beyond its quoted name: {"dtype":"BOOL","shape":[N],"data_offsets":[A,B]},


def _entry_bytes(key: str) -> int:
    return len(json.dumps(key)) + _ENTRY_BASE


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def plan_shards(tensors: dict[str, torch.Tensor], max_shard_bytes: int) -> list[list[tuple[str, str, int, int]]]:
    """Shards as lists of (tensor name, entry key, first element, element count) over the flattened tensors, in
    order; each shard's data plus header fits in `max_shard_bytes`."""
    if max_shard_bytes < MIN_SHARD_BYTES:
        raise EagleSpecError(f"the training-state shard size must be at least {MIN_SHARD_BYTES} bytes, "
                             f"got {max_shard_bytes}")
    shards: list[list[tuple[str, str, int, int]]] = [[]]
    used = _HEADER_BASE
    for name, t in tensors.items():
        elem, total, start, part = t.element_size(), t.numel(), 0, 0
        while True:
            key = f"{name}#{part}"
            room = max_shard_bytes - used - _entry_bytes(key)
            count = min(total - start, max(0, room) // elem)
            if (count == 0 and total - start > 0) or room < 0:  # no room for an element here: next shard
                if not shards[-1]:
                    raise EagleSpecError(f"the training-state shard size {max_shard_bytes} bytes cannot hold one "
                                         f"element of {name!r}")
                shards.append([])
                used = _HEADER_BASE
                continue
            shards[-1].append((name, key, start, count))
            used += _entry_bytes(key) + count * elem
            start += count
            part += 1
            if start >= total:
                break
    return [s for s in shards if s]


def _shard_name(i: int, n: int) -> str:
    return f"{SHARD_PREFIX}{i + 1:05d}-of-{n:05d}.safetensors"


def write_state(directory: Path, meta: dict[str, Any], tensors: dict[str, torch.Tensor],
                max_shard_bytes: int = DEFAULT_SHARD_BYTES) -> list[Path]:
    """Write `tensors` as shards and `meta` (JSON-safe values) with the shard index into `directory` (the JSON last,
    through a temporary name). Returns the files written."""
    from safetensors.torch import save

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    flat = {k: v.detach().to("cpu").contiguous().reshape(-1) for k, v in tensors.items()}
    plan = plan_shards(flat, max_shard_bytes)
    files, shards, where = [], [], {}
    for i, entries in enumerate(plan):
        fname = _shard_name(i, len(plan))
        blob = save({key: flat[name][start:start + count].clone() for name, key, start, count in entries})
        if len(blob) > max_shard_bytes:  # the plan's header allowance is conservative: cannot happen
            raise EagleSpecError(f"{directory / fname}: {len(blob)} bytes, above the shard size {max_shard_bytes}")
        (directory / fname).write_bytes(blob)
        files.append(directory / fname)
        shards.append({"file": fname, "bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()})
        for name, key, _, _ in entries:
            where.setdefault(name, []).append([i, key])
    index = {name: {"dtype": _dtype_name(t.dtype), "shape": list(t.shape), "parts": where[name]}
             for name, t in tensors.items()}
    doc = {"format": FORMAT, "version": VERSION, **meta, "shards": shards, "tensors": index}
    tmp = directory / (STATE_JSON + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
    os.replace(tmp, directory / STATE_JSON)
    return [*files, directory / STATE_JSON]


def read_meta(directory: Path) -> dict[str, Any]:
    """The JSON file of the state in `directory` (its shards unread)."""
    path = Path(directory) / STATE_JSON
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(path, "file not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(path, f"unreadable training state ({type(exc).__name__})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CheckpointError(path, f"not an eaglespec training state (field 'format' is not {FORMAT!r})")
    if doc.get("version") != VERSION:
        raise CheckpointError(path, f"training state version {doc.get('version')!r}; this eaglespec reads {VERSION}")
    return doc


def _read_shard(directory: Path, entry: Any, json_path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        fname, size, digest = entry["file"], int(entry["bytes"]), str(entry["sha256"])
    except (TypeError, KeyError, ValueError):
        raise CheckpointError(json_path, "malformed shard entry (needs file, bytes, sha256)") from None
    if not isinstance(fname, str) or Path(fname).name != fname or not fname.startswith(SHARD_PREFIX):
        raise CheckpointError(json_path, f"shard name {fname!r} is not a file name of this state")
    path = directory / fname
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(path, f"shard missing (listed in {STATE_JSON}; copy every {SHARD_PREFIX}*.safetensors "
                                    "file with it)") from None
    except OSError as exc:
        raise CheckpointError(path, f"unreadable shard ({exc.strerror})") from None
    if len(blob) != size:
        raise CheckpointError(path, f"shard truncated or altered: {len(blob)} bytes, {STATE_JSON} says {size}")
    if hashlib.sha256(blob).hexdigest() != digest:
        raise CheckpointError(path, f"shard corrupt: its sha256 does not match {STATE_JSON}")
    try:
        return load(blob)
    except (SafetensorError, ValueError) as exc:
        raise CheckpointError(path, f"not a readable safetensors file ({exc})") from None


def read_state(directory: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(the JSON document, the tensors by name) of the state written by write_state in `directory`."""
    directory = Path(directory)
    doc = read_meta(directory)
    json_path = directory / STATE_JSON
    shards, index = doc.get("shards"), doc.get("tensors")
    if not isinstance(shards, list) or not isinstance(index, dict):
        raise CheckpointError(json_path, "fields 'shards' and 'tensors' must be a list and an object")
    loaded = [_read_shard(directory, entry, json_path) for entry in shards]
    tensors = {}
    for name, spec in index.items():
        try:
            dtype = getattr(torch, spec["dtype"])
            shape = [int(d) for d in spec["shape"]]
            pieces = [loaded[i][key] for i, key in spec["parts"]]
        except (TypeError, KeyError, ValueError, IndexError, AttributeError):
            raise CheckpointError(json_path, f"tensor {name!r}: malformed entry or a piece missing from its "
                                             "shard") from None
        flat = torch.cat(pieces) if len(pieces) > 1 else pieces[0]
        if not isinstance(dtype, torch.dtype) or flat.dtype != dtype or flat.numel() != math.prod(shape):
            raise CheckpointError(json_path, f"tensor {name!r}: the shards hold {flat.numel()} {flat.dtype} values, "
                                             f"expected shape {shape} of {spec['dtype']}")
        tensors[name] = flat.reshape(shape)
    return doc, tensors


# -- optimizer state_dict <-> JSON + tensors -----------------------------------------------------
def _json_value(v: Any, what: str) -> Any:
    if isinstance(v, tuple):
        return [_json_value(x, what) for x in v]
    if v is None or isinstance(v, (bool, int, str)) or (isinstance(v, float) and math.isfinite(v)):
        return v
    if isinstance(v, list):
        return [_json_value(x, what) for x in v]
    raise EagleSpecError(f"optimizer {what}: a {type(v).__name__} value cannot be written to the training state")


def pack_optimizer(sd: dict[str, Any], prefix: str = "optimizer") -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """An optimizer state_dict -> (JSON: param groups and the state's layout and plain values, tensors by name)."""
    groups = [{k: _json_value(v, f"param group field {k!r}") for k, v in g.items()} for g in sd["param_groups"]]
    state, tensors = {}, {}
    for pid, entries in sd["state"].items():
        layout = {}
        for key, v in entries.items():
            if isinstance(v, torch.Tensor):
                name = f"{prefix}.state.{pid}.{key}"
                tensors[name] = v
                layout[key] = {"tensor": name}
            else:
                layout[key] = {"value": _json_value(v, f"state field {key!r}")}
        state[str(pid)] = layout
    return {"param_groups": groups, "state": state}, tensors


def unpack_optimizer(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The inverse of pack_optimizer: a state_dict for Optimizer.load_state_dict (list hyperparameters such as
    AdamW's betas come back as tuples)."""
    groups = [{k: (tuple(v) if isinstance(v, list) and k != "params" else v) for k, v in g.items()}
              for g in meta["param_groups"]]
    state = {int(pid): {key: tensors[e["tensor"]] if "tensor" in e else e["value"] for key, e in layout.items()}
             for pid, layout in meta["state"].items()}
    return {"state": state, "param_groups": groups}
