"""Writing kvtier attention traces (format v1, docs/TRACE_FORMAT.md) from Python with h5py.

The writer half of scripts/capture_hf.py, importable without torch or transformers: the /meta
record and every attribute come from `kvtier trace meta` (kvtier_trace_meta), so this module never
derives a /meta field itself; TraceFileWriter writes the datasets as kvtier's own writer lays
them out (chunk shapes, shuffle + deflate), to OUT.tmp.PID, renamed into place by finish() and
removed on any error.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from typing import Any, Iterable, Mapping, Sequence

import h5py
import numpy as np

SCRIPT = "capture_hf.py"

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
