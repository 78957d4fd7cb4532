#!/usr/bin/env python3
"""Capture a kvtier attention trace (format v1) from a Hugging Face causal LM with PyTorch.

Runs the model with transformers (eager attention, so that it returns its attention weights):
the prompt as a prefill, then one decode step at a time with the KV cache, and writes what
`kvtier trace capture` writes for the same request (docs/TRACE_FORMAT.md, "Capturing with
PyTorch"): step t runs /tokens[P + t] (the first the token sampled from the prefill's logits)
and its row is that call's attention, for every layer. The /meta record and every attribute
come from `kvtier trace meta`, so this script never derives a /meta field itself; the file is
written with h5py to OUT.tmp.PID and renamed into place at the end (removed on any error).

The writer half (TraceFileWriter, write_trace, kvtier_trace_meta) needs only numpy and h5py;
torch and transformers are imported by the capture alone.

Exit codes as kvtier's: 0 ok, 1 runtime failure, 2 bad usage or options, 3 bad input data
(a model that cannot be read); errors from `kvtier trace meta` are passed on as it prints them.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shlex
import subprocess
import sys
import time
from typing import Any, Iterable, Mapping, Sequence

SCRIPT = "capture_hf.py"

try:
    import h5py
    import numpy as np
except ImportError as missing:
    if __name__ != "__main__":
        raise
    print(f"{SCRIPT}: error: needs numpy and h5py ({missing}); e.g. `pip install numpy h5py`, "
          "or on Debian `apt-get install python3-numpy python3-h5py`", file=sys.stderr)  # fmt: skip
    sys.exit(2)

# kvtier's writer defaults (traces/writer.hpp, WriterOptions).
CHUNK_ELEMENTS = 1 << 16
DEFLATE_LEVEL = 1
TOPK_PAD_INDEX = -1


class CaptureError(Exception):
    """A failure reported as one line, with kvtier's exit codes (2 usage, 3 data, 1 other)."""

    def __init__(self, message: str, exit_code: int = 2, *, line: str | None = None):
        super().__init__(message)
        self.exit_code = exit_code
        # The exact line to print (a kvtier error passed on); default "capture_hf.py: error: …".
        self.line = line if line is not None else f"{SCRIPT}: error: {message}"


# --- /meta from kvtier -----------------------------------------------------------------------


def default_kvtier() -> str:
    """$KVTIER, else kvtier on PATH, else the default build's binary beside this script."""
    if os.environ.get("KVTIER"):
        return os.environ["KVTIER"]
    here = os.path.dirname(os.path.abspath(__file__))
    built = os.path.join(here, "..", "build", "default", "bin", "kvtier")
    from shutil import which

    found = which("kvtier")
    if found:
        return found
    return os.path.normpath(built)


def _run_kvtier(kvtier: str, arguments: Sequence[str]) -> str:
    try:
        done = subprocess.run(
            [kvtier, *arguments], capture_output=True, text=True, check=False
        )
    except OSError as error:
        raise CaptureError(
            f"cannot run kvtier ({kvtier}): {error.strerror}; give its path with --kvtier",
            2,
        ) from error
    if done.returncode != 0:
        line = done.stderr.strip() or f"kvtier exited with {done.returncode}"
        raise CaptureError(line, done.returncode, line=line)
    return done.stdout


def kvtier_version(kvtier: str) -> str:
    return _run_kvtier(kvtier, ["--version"]).strip()


def kvtier_trace_meta(
    kvtier: str,
    model: str,
    prompt_tokens: int,
    steps: int,
    *,
    tool: str,
    granularities: Iterable[str] = ("mean",),
    window: int = 0,
    key_norms: bool = False,
    dtype: str = "fp16",
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int = 1,
    description: str = "",
    model_name: str | None = None,
) -> dict:
    """The JSON object `kvtier trace meta` prints: /meta (base64), attributes, shape, paths."""
    arguments = [
        "trace", "meta", "--model", model,
        "--prompt-tokens", str(prompt_tokens), "--steps", str(steps),
        "--window", str(window), "--dtype", dtype,
        "--temperature", repr(float(temperature)), "--top-p", repr(float(top_p)),
        "--top-k", str(top_k), "--seed", str(seed),
        "--tool", tool, "--description", description,
    ]  # fmt: skip
    for granularity in granularities:
        arguments += ["--granularity", granularity]
    if key_norms:
        arguments.append("--key-norms")
    if model_name is not None:
        arguments += ["--model-name", model_name]
    return json.loads(_run_kvtier(kvtier, arguments))


# --- Writing the file ------------------------------------------------------------------------


def row_offset(prompt_tokens: int, step: int) -> int:
    """Where step `step`'s row starts in a packed dataset (docs/TRACE_FORMAT.md)."""
    return step * prompt_tokens + step * (step + 1) // 2


def _index(axis: int, first: int, end: int) -> tuple:
    return (slice(None),) * axis + (slice(first, end),)


class _ChunkStream:
    """Appends along one axis of a chunked dataset and writes whole chunks only, so HDF5 never
    reads a chunk back to update it; holds one chunk in memory."""

    def __init__(self, dataset: h5py.Dataset, axis: int):
        self.dataset = dataset
        self.axis = axis
        self.total = dataset.shape[axis]
        self.chunk = dataset.chunks[axis]
        shape = list(dataset.shape)
        shape[axis] = self.chunk
        self.buffer = np.zeros(shape, dtype=dataset.dtype)
        self.filled = 0  # in the buffer
        self.written = 0  # in the file

    @property
    def appended(self) -> int:
        return self.written + self.filled

    def append(self, values: np.ndarray) -> None:
        if values.ndim != self.buffer.ndim:  # numpy would broadcast a row into a block
            raise ValueError(f"{values.ndim}-D values for a {self.buffer.ndim}-D dataset")
        count = values.shape[self.axis]
        taken = 0
        while taken < count:
            take = min(self.chunk - self.filled, count - taken)
            self.buffer[_index(self.axis, self.filled, self.filled + take)] = values[
                _index(self.axis, taken, taken + take)
            ]
            self.filled += take
            taken += take
            if self.filled == self.chunk:
                self._flush()

    def _flush(self) -> None:
        if self.filled:
            self.dataset[_index(self.axis, self.written, self.written + self.filled)] = (
                self.buffer[_index(self.axis, 0, self.filled)]
            )
            self.written += self.filled
            self.filled = 0

    def finish(self) -> None:
        self._flush()


def _write_attribute(target: Any, attribute: Mapping[str, Any]) -> None:
    """One attribute with the HDF5 type kvtier's writer gives it (`kvtier trace meta`)."""
    name, kind, value = attribute["name"], attribute["type"], attribute["value"]
    if kind == "string":
        data = value.encode("utf-8")
        # Fixed-length, null-padded, at least one byte: h5py's mapping of numpy's S type.
        target.attrs.create(name, np.array(data, dtype=f"S{max(1, len(data))}"))
    elif kind == "uint32":
        target.attrs.create(name, np.array(value, dtype="<u4"))
    elif kind == "uint64":
        target.attrs.create(name, np.array(value, dtype="<u8"))
    else:
        raise ValueError(f"attribute {name}: unknown type {kind!r} from kvtier trace meta")


class TraceFileWriter:
    """Streams a trace file in kvtier's layout from rows given one step at a time.

    `meta` is the object `kvtier trace meta` prints. Every dataset is created on opening (its
    size follows from /meta); rows are appended per layer in step order, as with kvtier's
    TraceWriter (traces/writer.hpp), and only one chunk per dataset is held in memory. The
    file is written as PATH.tmp.PID; finish() checks that everything declared was written and
    renames it into place, and abort() (or leaving a `with` block without finish()) removes it.
    Weights are given as float32 (or anything numpy turns into float32) and stored in the
    trace's type, rounded to nearest even.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        meta: Mapping[str, Any],
        *,
        chunk_elements: int = CHUNK_ELEMENTS,
        deflate: int = DEFLATE_LEVEL,
    ):
        if not 0 <= deflate <= 9 or chunk_elements < 1:
            raise ValueError("deflate must be 0..9 and chunk_elements at least 1")
        self.path = os.fspath(path)
        self.temporary = f"{self.path}.tmp.{os.getpid()}"
        self.meta = meta
        shape = meta["shape"]
        self.prompt_tokens = int(shape["prompt_tokens"])
        self.steps = int(shape["steps"])
        self.first_layer = int(shape["first_layer"])
        self.num_layers = int(shape["num_layers"])
        self.heads = int(shape["heads"])
        self.kv_heads = int(shape["kv_heads"])
        self.top_k = int(shape["top_k"])
        self.window = int(shape["prefill_window"])
        self.has_mean = bool(shape["has_mean"])
        self.has_heads = bool(shape["has_heads"])
        self.has_topk = bool(shape["has_topk"])
        self.has_prefill = bool(shape["has_prefill"])
        self.has_key_norms = bool(shape["has_key_norms"])
        self.weight_dtype = np.dtype("<f2" if shape["weight_type"] == "float16" else "<f4")
        self.tokens = self.prompt_tokens + self.steps
        self.packed = row_offset(self.prompt_tokens, self.steps)
        self._chunk = chunk_elements
        self._deflate = deflate
        self._file: h5py.File | None = None
        self._finished = False
        self._layers: dict[int, dict[str, Any]] = {}
        self._tokens_written = False
        directory = os.path.dirname(self.path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        try:
            self._create()
        except BaseException:
            self.abort()
            raise

    # The context manager removes the temporary file unless finish() was called.
    def __enter__(self) -> "TraceFileWriter":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if not self._finished:
            self.abort()

    def row_length(self, step: int) -> int:
        return self.prompt_tokens + step + 1

    # --- creation (the order and settings of kvtier's writer) ---

    def _create(self) -> None:
        fcpl = h5py.h5p.create(h5py.h5p.FILE_CREATE)
        fcpl.set_obj_track_times(False)  # no times in object headers: same content, same bytes
        fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
        fapl.set_libver_bounds(h5py.h5f.LIBVER_V110, h5py.h5f.LIBVER_V110)
        file_id = h5py.h5f.create(
            os.fsencode(self.temporary), h5py.h5f.ACC_TRUNC, fcpl=fcpl, fapl=fapl
        )
        self._file = h5py.File(file_id)
        for attribute in self.meta["root_attributes"]:
            _write_attribute(self._file, attribute)
        paths = self.meta["paths"]
        record = np.frombuffer(base64.b64decode(self.meta["meta_base64"]), dtype="<u1")
        meta_dataset = self._file.create_dataset(paths["meta"], data=record, track_times=False)
        for attribute in self.meta["meta_attributes"]:
            _write_attribute(meta_dataset, attribute)
        chunk = self._chunk
        self._tokens = self._dataset(paths["tokens"], (self.tokens,), "<i4", (chunk,))
        if self.has_mean or self.has_heads:
            offsets = self._dataset(paths["row_offsets"], (self.steps + 1,), "<u8", (chunk,))
            t = np.arange(self.steps + 1, dtype=np.uint64)
            p = np.uint64(self.prompt_tokens)
            offsets[...] = t * p + t * (t + np.uint64(1)) // np.uint64(2)
        if self.has_key_norms:
            self._key_norms = self._dataset(
                paths["key_norms"],
                (self.num_layers, self.kv_heads, self.tokens),
                "<f4",
                (1, self.kv_heads, max(1, chunk // self.kv_heads)),
            )
        for entry in paths["layers"]:
            self._layers[int(entry["layer"])] = self._create_layer(entry)

    def _create_layer(self, entry: Mapping[str, Any]) -> dict[str, Any]:
        chunk, packed, steps = self._chunk, self.packed, self.steps
        out: dict[str, Any] = {"mean_rows": 0, "head_rows": 0, "topk_rows": 0}
        out["prefill_written"] = out["key_norms_written"] = False
        if self.has_mean:
            dataset = self._dataset(entry["mean"], (packed,), self.weight_dtype, (chunk,))
            out["mean"] = _ChunkStream(dataset, 0)
        if self.has_heads:
            columns = max(1, chunk // self.heads)
            dataset = self._dataset(
                entry["heads"], (self.heads, packed), self.weight_dtype, (self.heads, columns)
            )
            out["heads"] = _ChunkStream(dataset, 1)
        if self.has_topk:
            k = self.top_k
            rows = max(1, chunk // k)
            indices = self._dataset(entry["topk_indices"], (steps, k), "<i4", (rows, k))
            weights = self._dataset(entry["topk_weights"], (steps, k), self.weight_dtype, (rows, k))
            residual = self._dataset(entry["topk_residual"], (steps,), "<f4", (chunk,))
            out["topk"] = tuple(_ChunkStream(d, 0) for d in (indices, weights, residual))
        if self.has_prefill:
            out["prefill"] = self._dataset(
                entry["prefill"],
                (self.heads, self.window, self.prompt_tokens),
                self.weight_dtype,
                (1, self.window, max(1, chunk // self.window)),
            )
        return out

    def _groups(self, path: str) -> None:
        """Creates the groups on the way to `path`, without times (kvtier's writer does)."""
        parts = path.strip("/").split("/")[:-1]
        current = ""
        for part in parts:
            current += "/" + part
            if current not in self._file:
                gcpl = h5py.h5p.create(h5py.h5p.GROUP_CREATE)
                gcpl.set_obj_track_times(False)
                h5py.h5g.create(self._file.id, current.encode(), gcpl=gcpl)

    def _dataset(self, path: str, shape: tuple, dtype: Any, chunk: tuple) -> h5py.Dataset:
        # Chunk sides are capped at the dataset's (and at least 1), as kvtier's writer does.
        chunks = tuple(max(1, min(c, d)) for c, d in zip(chunk, shape))
        self._groups(path)
        options: dict[str, Any] = {"chunks": chunks, "track_times": False}
        if self._deflate > 0:
            options.update(shuffle=True, compression="gzip", compression_opts=self._deflate)
        return self._file.create_dataset(path, shape=shape, dtype=dtype, **options)

    # --- data ---

    def _layer(self, layer: int, declared: bool, what: str) -> dict[str, Any]:
        if not declared:
            raise ValueError(f"the trace's /meta does not declare {what}")
        if layer not in self._layers:
            raise ValueError(f"layer {layer} is not in the trace")
        return self._layers[layer]

    def _weights(self, values: Any, shape: tuple, where: str) -> np.ndarray:
        array = np.asarray(values, dtype=np.float32)
        if array.shape != shape:
            raise ValueError(f"{where}: expected shape {shape}, got {array.shape}")
        return array.astype(self.weight_dtype)

    def write_tokens(self, tokens: Any) -> None:
        array = np.asarray(tokens)
        if array.shape != (self.tokens,):
            raise ValueError(f"expected {self.tokens} tokens, got shape {array.shape}")
        if not np.issubdtype(array.dtype, np.integer):
            raise ValueError("tokens must be integers")
        if array.size and (array.min() < -(2**31) or array.max() >= 2**31):
            raise ValueError("tokens must fit int32")
        self._tokens[...] = array.astype("<i4")
        self._tokens_written = True

    def append_mean_row(self, layer: int, row: Any) -> None:
        out = self._layer(layer, self.has_mean, "mean rows")
        step = out["mean_rows"]
        if step >= self.steps:
            raise ValueError(f"layer {layer}: more mean rows than the {self.steps} steps")
        out["mean"].append(self._weights(row, (self.row_length(step),), f"mean row {step}"))
        out["mean_rows"] += 1

    def append_head_rows(self, layer: int, rows: Any) -> None:
        """Every head's row of the next step: [heads, row_length]."""
        out = self._layer(layer, self.has_heads, "per-head rows")
        step = out["head_rows"]
        if step >= self.steps:
            raise ValueError(f"layer {layer}: more head rows than the {self.steps} steps")
        shape = (self.heads, self.row_length(step))
        out["heads"].append(self._weights(rows, shape, f"head rows {step}"))
        out["head_rows"] += 1

    def append_topk_row(self, layer: int, indices: Any, weights: Any, residual: float) -> None:
        """Exactly top_k entries (padded with -1 and 0) and the mass outside them."""
        out = self._layer(layer, self.has_topk, "top-k rows")
        if out["topk_rows"] >= self.steps:
            raise ValueError(f"layer {layer}: more top-k rows than the {self.steps} steps")
        index_array = np.asarray(indices)
        if index_array.shape != (self.top_k,) or not np.issubdtype(index_array.dtype, np.integer):
            raise ValueError(f"a top-k row needs exactly {self.top_k} integer indices")
        stored = self._weights(weights, (self.top_k,), "top-k weights")
        streams = out["topk"]
        streams[0].append(index_array.astype("<i4")[None])  # one row of [steps, K]
        streams[1].append(stored[None])
        streams[2].append(np.array([residual], dtype="<f4"))
        out["topk_rows"] += 1

    def write_prefill_window(self, layer: int, weights: Any) -> None:
        """[heads, window, prompt_tokens]; query i (position P - W + i) holds zeros after it."""
        out = self._layer(layer, self.has_prefill, "the prefill window")
        shape = (self.heads, self.window, self.prompt_tokens)
        out["prefill"][...] = self._weights(weights, shape, "prefill window")
        out["prefill_written"] = True

    def write_key_norms(self, layer: int, norms: Any) -> None:
        """[kv_heads, tokens] float32."""
        out = self._layer(layer, self.has_key_norms, "key norms")
        array = np.asarray(norms, dtype=np.float32)
        if array.shape != (self.kv_heads, self.tokens):
            raise ValueError(
                f"key norms: expected shape {(self.kv_heads, self.tokens)}, got {array.shape}"
            )
        self._key_norms[layer - self.first_layer] = array
        out["key_norms_written"] = True

    def finish(self) -> None:
        """Checks that everything declared was written, closes the file, renames it."""
        try:
            if not self._tokens_written:
                raise ValueError("tokens were never written")
            for layer, out in self._layers.items():
                counts = [("mean_rows", self.has_mean), ("head_rows", self.has_heads),
                          ("topk_rows", self.has_topk)]  # fmt: skip
                for key, declared in counts:
                    if declared and out[key] != self.steps:
                        raise ValueError(
                            f"layer {layer} has {out[key]} of the {self.steps} declared "
                            f"{key.replace('_', ' ')}"
                        )
                if self.has_prefill and not out["prefill_written"]:
                    raise ValueError(f"the prefill window of layer {layer} was never written")
                if self.has_key_norms and not out["key_norms_written"]:
                    raise ValueError(f"the key norms of layer {layer} were never written")
                for name in ("mean", "heads"):
                    if name in out:
                        out[name].finish()
                for stream in out.get("topk", ()):
                    stream.finish()
            self._file.close()
            self._file = None
            os.replace(self.temporary, self.path)
            self._finished = True
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Closes and removes the temporary file (nothing is left behind)."""
        if self._file is not None:
            try:
                self._file.close()
            except Exception:  # noqa: BLE001 - the file is removed anyway
                pass
            self._file = None
        try:
            os.remove(self.temporary)
        except FileNotFoundError:
            pass


def write_trace(
    path: str | os.PathLike,
    meta: Mapping[str, Any],
    tokens: Any,
    *,
    mean: Sequence[Any] | None = None,
    heads: Sequence[Any] | None = None,
    topk: Sequence[tuple[Any, Any, Any]] | None = None,
    prefill: Sequence[Any] | None = None,
    key_norms: Any = None,
    chunk_elements: int = CHUNK_ELEMENTS,
    deflate: int = DEFLATE_LEVEL,
) -> None:
    """Writes a whole trace from numpy arrays, one entry per trace layer (in layer order):

    mean[l]: packed rows [offset(N)]; heads[l]: [H, offset(N)]; topk[l]: (indices [N, K],
    weights [N, K], residual [N]); prefill[l]: [H, W, P]; key_norms: [L, KV, P + N].
    What /meta declares must be given; what it does not must be None.
    """
    with TraceFileWriter(path, meta, chunk_elements=chunk_elements, deflate=deflate) as writer:
        layers = [int(entry["layer"]) for entry in meta["paths"]["layers"]]
        given = {"mean": mean, "heads": heads, "topk": topk, "prefill": prefill,
                 "key_norms": key_norms}  # fmt: skip
        declared = {"mean": writer.has_mean, "heads": writer.has_heads, "topk": writer.has_topk,
                    "prefill": writer.has_prefill, "key_norms": writer.has_key_norms}  # fmt: skip
        for name, value in given.items():
            if value is None and declared[name]:
                raise ValueError(f"/meta declares {name}, but none were given")
            if value is not None and not declared[name]:
                raise ValueError(f"/meta does not declare {name}, but they were given")
            if value is not None and len(value) != len(layers):
                raise ValueError(f"{name}: {len(value)} layers given, the trace has {len(layers)}")
        writer.write_tokens(tokens)
        for i, layer in enumerate(layers):
            for step in range(writer.steps):
                first = row_offset(writer.prompt_tokens, step)
                end = first + writer.row_length(step)
                if mean is not None:
                    writer.append_mean_row(layer, np.asarray(mean[i])[first:end])
                if heads is not None:
                    writer.append_head_rows(layer, np.asarray(heads[i])[:, first:end])
                if topk is not None:
                    indices, weights, residual = topk[i]
                    writer.append_topk_row(
                        layer, np.asarray(indices)[step], np.asarray(weights)[step],
                        float(np.asarray(residual)[step]),
                    )  # fmt: skip
            if prefill is not None:
                writer.write_prefill_window(layer, prefill[i])
            if key_norms is not None:
                writer.write_key_norms(layer, np.asarray(key_norms)[i])
        writer.finish()


def topk_of_row(row: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, float]:
    """The K largest weights in decreasing order (ties: lower position first), padded with -1
    and 0 when the row is shorter, and the mass of the other positions (as kvtier's tracer)."""
    row = np.asarray(row, dtype=np.float32)
    order = np.argsort(-row, kind="stable")  # stable: equal weights keep position order
    kept = order[:k]
    indices = np.full(k, TOPK_PAD_INDEX, dtype=np.int32)
    weights = np.zeros(k, dtype=np.float32)
    indices[: kept.size] = kept
    weights[: kept.size] = row[kept]
    residual = float(np.sum(row[order[k:]], dtype=np.float64))
    return indices, weights, residual


# --- Capture with transformers ---------------------------------------------------------------


def _prompt_ids_from_text(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.replace(",", " ").split()]
    except ValueError as error:
        raise CaptureError(f"--prompt-ids takes whole numbers, got {text!r}") from error
    if not ids or min(ids) < 0:
        raise CaptureError("--prompt-ids needs at least one non-negative token id")
    return ids


def _read_prompt_file(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            text = handle.read().decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise CaptureError(f"cannot read the prompt file {path}: {error}", 3) from error
    # One final line break is the file's, not the prompt's (as kvtier's --prompt-file).
    if text.endswith("\n"):
        text = text[:-1]
        if text.endswith("\r"):
            text = text[:-1]
    return text


def _command_without_output(argv: Sequence[str]) -> str:
    kept: list[str] = []
    skip = False
    for argument in argv:
        if skip:
            skip = False
        elif argument == "--out":
            skip = True
        elif not argument.startswith("--out="):
            kept.append(argument)
    return shlex.join([f"scripts/{SCRIPT}", *kept])


class _Sampler:
    """Greedy (argmax, first of equal logits, as kvtier) or temperature / top-k / top-p
    sampling with a seeded torch generator (not kvtier's random stream: sampled tokens
    differ from kvtier's for the same seed)."""

    def __init__(self, torch: Any, temperature: float, top_p: float, top_k: int, seed: int,
                 device: Any):  # fmt: skip
        self.torch = torch
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.generator = None
        if temperature > 0:
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(seed)

    def sample(self, logits: Any) -> int:
        torch = self.torch
        logits = logits.float()
        if self.temperature == 0:
            return int(torch.argmax(logits))
        probabilities = torch.softmax(logits / self.temperature, dim=-1)
        if 0 < self.top_k < probabilities.numel():
            kth = torch.topk(probabilities, self.top_k).values[-1]
            probabilities = probabilities.masked_fill(probabilities < kth, 0.0)
        if self.top_p < 1.0:
            ordered, order = torch.sort(probabilities, descending=True)
            before = torch.cumsum(ordered, dim=0) - ordered  # mass of the more likely ones
            ordered = ordered.masked_fill(before >= self.top_p * ordered.sum(), 0.0)
            probabilities = torch.zeros_like(probabilities).scatter(0, order, ordered)
        probabilities = probabilities / probabilities.sum()
        return int(torch.multinomial(probabilities, 1, generator=self.generator))


class _Progress:
    """Progress on stderr, rewritten in place, when stderr is a terminal."""

    def __init__(self) -> None:
        self.enabled = sys.stderr.isatty()
        self.shown = False
        self.last = 0.0

    def update(self, phase: str, done: int, total: int, seconds: float) -> None:
        now = time.monotonic()
        if not self.enabled or (done < total and self.shown and now - self.last < 0.25):
            return
        self.last = now
        self.shown = True
        rate = done / seconds if seconds > 0 else 0.0
        sys.stderr.write(f"\r{SCRIPT}: {phase} {done}/{total} tokens, {rate:.0f} tokens/s\033[K")
        sys.stderr.flush()

    def end(self) -> None:
        if self.shown:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self.shown = False


def _cached_keys(cache: Any, layer: int) -> Any:
    """Layer `layer`'s cached keys [batch, kv_heads, positions, head_dim], after RoPE."""
    if hasattr(cache, "layers") and not isinstance(cache, (tuple, list)):
        entry = cache.layers[layer]
        if hasattr(entry, "keys"):
            return entry.keys
    if hasattr(cache, "key_cache"):
        return cache.key_cache[layer]
    return cache[layer][0]


def _model_files(model: str) -> tuple[str, str | None]:
    """(local directory holding config.json, model name for /meta or None for the default)."""
    if os.path.isdir(model):
        if not os.path.isfile(os.path.join(model, "config.json")):
            raise CaptureError(f"{model} has no config.json (not a Hugging Face model)", 3)
        return model, None
    try:
        from transformers.utils import cached_file

        config_path = cached_file(model, "config.json")
    except Exception as error:  # noqa: BLE001 - hub and file errors of every kind
        raise CaptureError(f"cannot find model {model}: {error}", 3) from error
    if config_path is None:
        raise CaptureError(f"cannot find config.json of model {model}", 3)
    return os.path.dirname(config_path), model.rstrip("/").split("/")[-1]


def _import_torch() -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError as error:
        raise CaptureError(
            f"the capture needs PyTorch and transformers ({error}); install them, e.g. "
            "`pip install torch transformers`",
            2,
        ) from error
    return torch, transformers


def capture(args: argparse.Namespace, argv: Sequence[str]) -> str:
    """Runs the capture `args` describe; returns the line to print."""
    torch, transformers = _import_torch()
    model_dir, default_name = _model_files(args.model)
    model_name = args.model_name if args.model_name is not None else default_name

    tokenizer = None
    if args.prompt_ids is not None:
        prompt = _prompt_ids_from_text(args.prompt_ids)
        prompt_source = "--prompt-ids"
    else:
        text = args.prompt if args.prompt is not None else _read_prompt_file(args.prompt_file)
        prompt_source = "--prompt" if args.prompt is not None else f"the file {args.prompt_file}"
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(args.tokenizer or args.model)
        except Exception as error:  # noqa: BLE001
            raise CaptureError(f"cannot load the tokenizer: {error}", 3) from error
        prompt = list(tokenizer(text, add_special_tokens=True)["input_ids"])
        if not prompt:
            raise CaptureError("the prompt is empty and the tokenizer adds no BOS to start from")

    version = kvtier_version(args.kvtier)
    tool = (
        f"{SCRIPT} (torch {torch.__version__}, transformers {transformers.__version__}; "
        f"meta by {version})"
    )
    description = (
        f"{_command_without_output(argv)}; prompt: {len(prompt)} tokens from {prompt_source}"
    )

    def meta_for(steps: int) -> dict:
        return kvtier_trace_meta(
            args.kvtier, model_dir, len(prompt), steps, tool=tool,
            granularities=args.granularity or ["mean"], window=args.window,
            key_norms=args.key_norms, dtype=args.dtype, temperature=args.temperature,
            top_p=args.top_p, top_k=args.top_k, seed=args.seed, description=description,
            model_name=model_name,
        )  # fmt: skip

    # Every option and the architecture are checked by kvtier before the model is loaded.
    planned = meta_for(args.max_new_tokens)
    vocab_size = int(planned["shape"]["vocab_size"])
    if max(prompt) >= vocab_size:
        raise CaptureError(f"prompt token {max(prompt)} is outside the model's vocabulary of "
                           f"{vocab_size}")  # fmt: skip
    positions = int(planned["meta"]["model"]["max_position_embeddings"])
    if len(prompt) + args.max_new_tokens > positions:
        raise CaptureError(
            f"{args.max_new_tokens} new tokens after a {len(prompt)}-token prompt pass the "
            f"model's {positions} positions (max_position_embeddings); at most "
            f"{max(0, positions - len(prompt))} fit"
        )

    device = torch.device(args.device)
    torch_dtype = getattr(torch, args.torch_dtype)
    dtype_keyword = "torch_dtype"
    major_minor = tuple(int(part) for part in transformers.__version__.split(".")[:2])
    if major_minor >= (4, 56):
        dtype_keyword = "dtype"  # transformers 4.56 renamed torch_dtype
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            args.model, attn_implementation="eager", **{dtype_keyword: torch_dtype}
        )
    except Exception as error:  # noqa: BLE001
        raise CaptureError(f"cannot load the model {args.model}: {error}", 3) from error
    model.to(device)
    model.eval()

    stop_tokens: set[int] = set()
    if not args.no_stop:
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        for source in (eos, getattr(tokenizer, "eos_token_id", None)):
            if isinstance(source, int):
                stop_tokens.add(source)
            elif source is not None:
                stop_tokens.update(int(token) for token in source)

    sampler = _Sampler(torch, args.temperature, args.top_p, args.top_k, args.seed, device)
    progress = _Progress()
    renormalise = torch_dtype != torch.float32
    forced: list[int] | None = None
    stopped = False
    try:
        with torch.inference_mode():
            if stop_tokens:
                # The step count must be known before the file is created: generate first,
                # then trace the same tokens (kvtier trace capture does the same).
                forced, stopped = _generate(torch, model, prompt, stop_tokens, sampler,
                                            args.max_new_tokens, progress, device)  # fmt: skip
                progress.end()
            steps = len(forced) if forced is not None else args.max_new_tokens
            meta = meta_for(steps)
            with TraceFileWriter(args.out, meta, chunk_elements=args.chunk_elements,
                                 deflate=args.deflate) as writer:  # fmt: skip
                tokens = _trace(torch, model, writer, prompt, forced, sampler, renormalise,
                                progress, device)  # fmt: skip
                writer.write_tokens(np.asarray(tokens, dtype=np.int64))
                writer.finish()
    finally:
        progress.end()
    return (
        f"wrote {args.out} ({len(prompt)} prompt tokens, {steps} decode steps"
        f"{', ended by a stop token' if stopped else ''})"
    )


def _generate(torch: Any, model: Any, prompt: list[int], stop_tokens: set[int],
              sampler: _Sampler, max_new_tokens: int, progress: _Progress,
              device: Any) -> tuple[list[int], bool]:  # fmt: skip
    """The tokens a run generates, without attentions: up to max_new_tokens, the first stop
    token included (then True)."""
    generated: list[int] = []
    start = time.monotonic()
    out = model(input_ids=torch.tensor([prompt], device=device), use_cache=True,
                **_last_logits_only(model))  # fmt: skip
    while True:
        token = sampler.sample(out.logits[0, -1])
        generated.append(token)
        progress.update("generating", len(generated), max_new_tokens, time.monotonic() - start)
        if token in stop_tokens:
            return generated, True
        if len(generated) == max_new_tokens:
            return generated, False
        out = model(input_ids=torch.tensor([[token]], device=device),
                    past_key_values=out.past_key_values, use_cache=True)  # fmt: skip


def _last_logits_only(model: Any) -> dict:
    """The forward argument that computes logits for the last position only (a prompt's
    logits for every position can take gigabytes), where this transformers has one."""
    import inspect

    parameters = inspect.signature(model.forward).parameters
    for name in ("logits_to_keep", "num_logits_to_keep"):
        if name in parameters:
            return {name: 1}
    return {}


def _check_attentions(attentions: Any, layers: int) -> None:
    if attentions is None or len(attentions) != layers or any(a is None for a in attentions):
        raise CaptureError(
            "the model returned no attention weights for every layer; it must support "
            "attn_implementation='eager' with output_attentions",
            3,
        )


def _trace(torch: Any, model: Any, writer: TraceFileWriter, prompt: list[int],
           forced: list[int] | None, sampler: _Sampler, renormalise: bool, progress: _Progress,
           device: Any) -> list[int]:  # fmt: skip
    """The traced run: prefill, then writer.steps decode steps; returns every token run."""
    P, W, H = writer.prompt_tokens, writer.window, writer.heads
    layers = [writer.first_layer + i for i in range(writer.num_layers)]
    ids = torch.tensor([prompt], device=device)
    last_only = _last_logits_only(model)
    cache = None
    if W > 0 and W < P:
        # Only the last W queries' attention is kept: the prompt before them runs without it,
        # so that no [heads, P, P] map is ever held.
        out = model(input_ids=ids[:, : P - W], use_cache=True, **last_only)
        cache = out.past_key_values
    first = P - W if W > 0 else 0
    out = model(input_ids=ids[:, first:], past_key_values=cache, use_cache=True,
                output_attentions=W > 0, **last_only)  # fmt: skip
    if W > 0:
        _check_attentions(out.attentions, len(layers))
        causal = np.tril(np.ones((W, P), dtype=bool), k=P - W)  # query i sees 0 .. P - W + i
        for i, layer in enumerate(layers):
            window = out.attentions[i][0, :, -W:, :].float()
            if window.shape != (H, W, P):
                raise CaptureError(f"prefill attention of layer {layer} has shape "
                                   f"{tuple(window.shape)}, expected {(H, W, P)}", 3)  # fmt: skip
            window = window.cpu().numpy()
            window = np.where(causal[None], window, np.float32(0))
            if renormalise:
                window = window / window.sum(axis=-1, keepdims=True)
            writer.write_prefill_window(layer, window)
    tokens = list(prompt)
    start = time.monotonic()
    logits = out.logits[0, -1]
    cache = out.past_key_values
    for step in range(writer.steps):
        token = forced[step] if forced is not None else sampler.sample(logits)
        tokens.append(token)
        out = model(input_ids=torch.tensor([[token]], device=device), past_key_values=cache,
                    use_cache=True, output_attentions=True)  # fmt: skip
        cache = out.past_key_values
        logits = out.logits[0, -1]
        _check_attentions(out.attentions, len(layers))
        n = writer.row_length(step)
        rows = torch.stack([a[0, :, -1, :] for a in out.attentions]).float()  # [L, H, n]
        if tuple(rows.shape) != (len(layers), H, n):
            raise CaptureError(f"decode attention has shape {tuple(rows.shape)}, expected "
                               f"{(len(layers), H, n)} (a cache that drops keys?)", 3)  # fmt: skip
        if renormalise:
            rows = rows / rows.sum(dim=-1, keepdim=True)
        # The head mean in float32, as kvtier's tracer: the heads added, then scaled once.
        mean = (rows.sum(dim=1) * (1.0 / H)).cpu().numpy()
        head_rows = rows.cpu().numpy() if writer.has_heads else None
        for i, layer in enumerate(layers):
            if writer.has_mean:
                writer.append_mean_row(layer, mean[i])
            if writer.has_topk:
                writer.append_topk_row(layer, *topk_of_row(mean[i], writer.top_k))
            if head_rows is not None:
                writer.append_head_rows(layer, head_rows[i])
        progress.update("tracing", step + 1, writer.steps, time.monotonic() - start)
    if writer.has_key_norms:
        for i, layer in enumerate(layers):
            keys = _cached_keys(cache, i)[0].float()  # [KV, positions, head_dim]
            if keys.shape[1] != writer.tokens:
                raise CaptureError(f"layer {layer}'s cache holds {keys.shape[1]} keys, the trace "
                                   f"{writer.tokens}: key norms need the full cache", 3)  # fmt: skip
            writer.write_key_norms(layer, torch.linalg.vector_norm(keys, dim=-1).cpu().numpy())
    return tokens


# --- Command line ----------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=SCRIPT,
        description=(
            "Capture a kvtier attention trace (HDF5 format v1, docs/TRACE_FORMAT.md) from a "
            "Hugging Face causal LM with PyTorch and transformers: the prompt's prefill, then "
            "one decode step at a time with the KV cache; step t runs the token at position "
            "prompt + t and its row is that step's attention, for every layer. /meta comes from "
            "`kvtier trace meta` (the model's config.json must describe an architecture kvtier "
            "knows: Llama, Mistral, Qwen2, Qwen3). The file validates with `kvtier trace "
            "validate`."
        ),
        epilog=(
            "Exit codes: 0 ok, 1 runtime failure, 2 bad usage or options, 3 bad input data. "
            "Generation stops after an EOS token (the model's generation config and the "
            "tokenizer's) unless --no-stop; the tokens are then generated first and traced in "
            "a second pass, as kvtier trace capture does."
        ),
    )
    p.add_argument("--model", required=True,
                   help="Hugging Face model directory or hub id (config.json + weights)")
    p.add_argument("--model-name", help="the model's name in /meta (default: the directory's "
                   "name, or the last part of a hub id)")  # fmt: skip
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="prompt text (tokenized with the model's tokenizer)")
    prompt.add_argument("--prompt-file", help="file holding the prompt (one final newline "
                        "dropped)")  # fmt: skip
    prompt.add_argument("--prompt-ids", help="the prompt as token ids, comma- or "
                        "space-separated (no tokenizer is loaded)")  # fmt: skip
    p.add_argument("--tokenizer", help="tokenizer directory or hub id (default: --model's)")
    p.add_argument("--max-new-tokens", type=int, default=256,
                   help="decode steps to trace, fewer when a stop token comes first "
                   "(default 256)")  # fmt: skip
    p.add_argument("--granularity", action="append",
                   help="mean, heads or topk:K; repeatable or comma-separated (default: mean; "
                   "heads needs mean or topk:K beside it)")  # fmt: skip
    p.add_argument("--window", type=int, default=0,
                   help="also record the attention of the last W prompt queries (prefill window)")
    p.add_argument("--key-norms", action="store_true",
                   help="also record the L2 norm of every cached key (after RoPE)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature (default 0: greedy)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass, (0, 1]")
    p.add_argument("--top-k", type=int, default=0,
                   help="sample among the K most likely tokens (default 0: all)")
    p.add_argument("--seed", type=int, default=1, help="sampling seed (torch's generator)")
    p.add_argument("--no-stop", action="store_true",
                   help="run all --max-new-tokens steps, past EOS (one pass instead of two)")
    p.add_argument("--dtype", choices=("fp16", "fp32"), default="fp16",
                   help="attention storage in the file (default fp16)")
    p.add_argument("--torch-dtype", choices=("float32", "bfloat16", "float16"),
                   default="float32",
                   help="the model's compute type (default float32; with the others each "
                   "attention row is renormalised in float32 to sum to 1)")  # fmt: skip
    p.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:1 ...")
    p.add_argument("--deflate", type=int, default=DEFLATE_LEVEL,
                   help="gzip level of the datasets, 1..9 (0: uncompressed; default 1)")
    p.add_argument("--chunk-elements", type=int, default=CHUNK_ELEMENTS,
                   help="elements per chunk of the attention datasets (default 65536)")
    p.add_argument("--kvtier", default=default_kvtier(),
                   help="the kvtier binary, for `kvtier trace meta` (default: $KVTIER, kvtier "
                   "on PATH, or build/default/bin/kvtier)")  # fmt: skip
    p.add_argument("--out", required=True, help="output trace file")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)  # usage errors: argparse's message, exit 2
    try:
        if args.max_new_tokens < 1:
            raise CaptureError("--max-new-tokens must be at least 1")
        if not 0 <= args.deflate <= 9:
            raise CaptureError("--deflate must be 0..9")
        if args.chunk_elements < 1:
            raise CaptureError("--chunk-elements must be at least 1")
        if args.window < 0 or args.top_k < 0 or args.seed < 0:
            raise CaptureError("--window, --top-k and --seed must not be negative")
        print(capture(args, argv))
    except CaptureError as error:
        print(error.line, file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print(f"{SCRIPT}: interrupted", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
