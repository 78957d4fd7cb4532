#!/usr/bin/env python3
"""scripts/capture_hf.py's writer against kvtier's own (no torch needed; runs in CI).

For several granularity sets, a trace of the stories260K fixture is captured with `kvtier trace
capture`; its rows are read back with h5py and written again through capture_hf.py's writer,
with /meta from `kvtier trace meta` for the same model and shape. The rewritten file must
validate, hold the same /meta bytes, attributes (values and HDF5 types), datasets (values,
types, chunk shapes, filters) and `kvtier trace info` statistics as the original, and be the
same bytes when written twice. Damaged rewrites must fail `kvtier trace validate`, and the
writer must refuse rows of the wrong shape without leaving a file behind.

usage: test_capture_hf_writer.py --kvtier BIN --script scripts/capture_hf.py --fixture DIR
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback

try:
    import h5py
    import numpy as np
except ImportError as missing:
    print(
        f"test_capture_hf_writer: this Python ({sys.executable}) lacks numpy or h5py "
        f"({missing}); on Debian install python3-numpy and python3-h5py "
        "(scripts/install-deps.sh does)",
        file=sys.stderr,
    )
    sys.exit(1)

EPOCH = "1700000000"  # SOURCE_DATE_EPOCH for every kvtier run: equal `created` attributes
PROMPT = "Once upon a time"
STEPS = 40

# (name, granularity arguments, window, key norms, dtype)
CASES = [
    ("mean", ["mean"], 0, False, "fp16"),
    ("all", ["mean,heads", "topk:8"], 4, True, "fp16"),
    ("fp32-topk-padded", ["mean,topk:64"], 0, False, "fp32"),
    ("topk-only", ["topk:16"], 2, False, "fp16"),
]


def load_script(path: str):
    spec = importlib.util.spec_from_file_location("capture_hf", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Runner:
    def __init__(self, kvtier: str, script: str, fixture: str, scratch: str):
        self.kvtier = kvtier
        self.script = script
        self.model = os.path.join(fixture, "stories260K.bin")
        self.scratch = scratch
        self.hf = load_script(script)

    def kvtier_run(self, *arguments: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [self.kvtier, *arguments], capture_output=True, text=True, check=False
        )

    def path(self, name: str) -> str:
        return os.path.join(self.scratch, name)


def attribute_signature(attributes) -> dict:
    """name -> (value, HDF5 type class, size, sign or string padding, character set)."""
    signature = {}
    for name in attributes:
        attribute = attributes.get_id(name)
        kind = attribute.get_type()
        details = (kind.get_class(), kind.get_size())
        if isinstance(kind, h5py.h5t.TypeStringID):
            details += (kind.get_strpad(), kind.get_cset(), kind.is_variable_str())
        elif isinstance(kind, h5py.h5t.TypeIntegerID):
            details += (kind.get_sign(), kind.get_order())
        value = attributes[name]
        value = value.item() if hasattr(value, "item") else value
        signature[name] = (value,) + details
    return signature


def datasets_of(file: h5py.File) -> dict:
    found = {}

    def visit(name, item):
        if isinstance(item, h5py.Dataset):
            found["/" + name] = item

    file.visititems(visit)
    return found


def dataset_description(dataset: h5py.Dataset) -> tuple:
    kind = dataset.id.get_type()
    return (
        dataset.shape,
        dataset.dtype.str,
        kind.get_class(),
        kind.get_size(),
        dataset.chunks,
        dataset.compression,
        dataset.shuffle,
        dataset.fletcher32,
    )


def same_values(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return a.tobytes() == b.tobytes()  # bit for bit (FP16 included)


def read_rows(original: str, meta: dict) -> dict:
    """Everything the trace holds, as the arrays write_trace takes."""
    shape = meta["shape"]
    layers = meta["paths"]["layers"]
    with h5py.File(original, "r") as f:
        data = {"tokens": f["/tokens"][...]}
        if shape["has_mean"]:
            data["mean"] = [f[entry["mean"]][...].astype(np.float32) for entry in layers]
        if shape["has_heads"]:
            data["heads"] = [f[entry["heads"]][...].astype(np.float32) for entry in layers]
        if shape["has_topk"]:
            data["topk"] = [
                (
                    f[entry["topk_indices"]][...],
                    f[entry["topk_weights"]][...].astype(np.float32),
                    f[entry["topk_residual"]][...],
                )
                for entry in layers
            ]
        if shape["has_prefill"]:
            data["prefill"] = [f[entry["prefill"]][...].astype(np.float32) for entry in layers]
        if shape["has_key_norms"]:
            data["key_norms"] = f[meta["paths"]["key_norms"]][...]
    return data


def check_case(run: Runner, case) -> None:
    name, granularities, window, key_norms, dtype = case
    original = run.path(f"{name}.kvtier.h5")
    rewritten = run.path(f"{name}.python.h5")
    capture = ["trace", "capture", "--model", run.model, "--prompt", PROMPT,
               "--max-new-tokens", str(STEPS), "--no-stop", "--dtype", dtype]  # fmt: skip
    for granularity in granularities:
        capture += ["--granularity", granularity]
    if window:
        capture += ["--window", str(window)]
    if key_norms:
        capture.append("--key-norms")
    made = run.kvtier_run(*capture, "--out", original)
    assert made.returncode == 0, f"kvtier trace capture failed: {made.stderr}"

    info = run.kvtier_run("trace", "info", original, "--format", "json", "--sample-steps", "0")
    assert info.returncode == 0, info.stderr
    original_info = json.loads(info.stdout)
    source = original_info["meta"]["source"]
    with h5py.File(original, "r") as f:
        prompt_tokens = int(f["/meta"].attrs["prompt_tokens"])
        steps = int(f["/meta"].attrs["steps"])
        original_meta_bytes = f["/meta"][...].tobytes()
    assert steps == STEPS, f"the capture has {steps} steps, expected {STEPS}"

    # The same model, shape and provenance through `kvtier trace meta`.
    meta = run.hf.kvtier_trace_meta(
        run.kvtier, run.model, prompt_tokens, steps, tool=source["tool"],
        description=source.get("description", ""), granularities=granularities,
        window=window, key_norms=key_norms, dtype=dtype,
    )  # fmt: skip
    import base64

    assert base64.b64decode(meta["meta_base64"]) == original_meta_bytes, (
        "kvtier trace meta gives another /meta than kvtier trace capture for the same request"
    )

    data = read_rows(original, meta)
    tokens = data.pop("tokens")
    run.hf.write_trace(rewritten, meta, tokens, **data)
    assert not [e for e in os.listdir(run.scratch) if ".tmp." in e], "temporary file left"

    valid = run.kvtier_run("trace", "validate", rewritten)
    assert valid.returncode == 0, f"kvtier trace validate refused the rewrite: {valid.stderr}"
    assert "valid" in valid.stdout, valid.stdout

    with h5py.File(original, "r") as a, h5py.File(rewritten, "r") as b:
        assert attribute_signature(a.attrs) == attribute_signature(b.attrs), (
            f"root attributes differ:\n{attribute_signature(a.attrs)}\n"
            f"{attribute_signature(b.attrs)}"
        )
        assert attribute_signature(a["/meta"].attrs) == attribute_signature(b["/meta"].attrs), (
            "/meta attributes differ"
        )
        ours, theirs = datasets_of(a), datasets_of(b)
        assert sorted(ours) == sorted(theirs), f"datasets differ: {sorted(ours)} {sorted(theirs)}"
        for path in ours:
            da, db = ours[path], theirs[path]
            assert dataset_description(da) == dataset_description(db), (
                f"{path}: {dataset_description(da)} vs {dataset_description(db)}"
            )
            assert same_values(da[...], db[...]), f"{path}: values differ"

    info = run.kvtier_run("trace", "info", rewritten, "--format", "json", "--sample-steps", "0")
    assert info.returncode == 0, info.stderr
    rewritten_info = json.loads(info.stdout)
    for key in ("meta", "prompt_tokens", "steps", "first_layer", "num_layers", "granularities",
                "attention_logical_bytes", "statistics"):  # fmt: skip
        assert original_info[key] == rewritten_info[key], f"trace info {key} differs"

    # Deterministic: the same arrays and meta give the same bytes.
    again = run.path(f"{name}.python-again.h5")
    run.hf.write_trace(again, meta, tokens, **data)
    with open(rewritten, "rb") as a, open(again, "rb") as b:
        assert a.read() == b.read(), "two writes of the same trace differ"
    print(f"  {name}: {steps} steps, {len(ours)} datasets equal, statistics equal")


def expect_invalid(run: Runner, path: str, *needles: str) -> None:
    result = run.kvtier_run("trace", "validate", path)
    assert result.returncode == 3, f"validate accepted {path} (exit {result.returncode})"
    for needle in needles:
        assert needle in result.stderr, f"'{needle}' not in: {result.stderr}"


def check_damage_is_refused(run: Runner) -> None:
    good = run.path("mean.python.h5")
    # A dataset one weight short of what /meta implies.
    short = run.path("short.h5")
    shutil.copyfile(good, short)
    with h5py.File(short, "r+") as f:
        values = f["/attention/mean/layer_000"][...]
        del f["/attention/mean/layer_000"]
        f.create_dataset("/attention/mean/layer_000", data=values[:-1])
    expect_invalid(run, short, "/attention/mean/layer_000", "dimensions")
    # A row that is not a probability distribution.
    heavy = run.path("heavy.h5")
    shutil.copyfile(good, heavy)
    with h5py.File(heavy, "r+") as f:
        f["/attention/mean/layer_001"][3] = np.float16(0.75)
    expect_invalid(run, heavy, "/attention/mean/layer_001")
    # Tokens of the wrong length.
    tokens = run.path("tokens.h5")
    shutil.copyfile(good, tokens)
    with h5py.File(tokens, "r+") as f:
        values = f["/tokens"][...]
        del f["/tokens"]
        f.create_dataset("/tokens", data=np.append(values, np.int32(1)), chunks=True)
    expect_invalid(run, tokens, "/tokens")
    print("  damaged rewrites are refused by kvtier trace validate")


def check_writer_refusals(run: Runner) -> None:
    meta = run.hf.kvtier_trace_meta(run.kvtier, run.model, 5, 3, tool="test")
    out = run.path("refused.h5")
    failed = False
    try:
        with run.hf.TraceFileWriter(out, meta) as writer:
            writer.append_mean_row(0, np.full(5, 0.2, dtype=np.float32))  # step 0 needs 6
    except ValueError as error:
        failed = "expected shape (6,)" in str(error)
    assert failed, "the writer took a row of the wrong length"
    # Rows missing at finish().
    try:
        with run.hf.TraceFileWriter(out, meta) as writer:
            writer.write_tokens(np.arange(8))
            writer.finish()
        failed = False
    except ValueError as error:
        failed = "mean rows" in str(error)
    assert failed, "finish() accepted a trace without its rows"
    leftovers = [e for e in os.listdir(run.scratch) if e.startswith("refused.h5")]
    assert not leftovers, f"files left behind: {leftovers}"
    # kvtier trace meta's errors arrive with its line and exit code.
    for arguments, code, needle in (
        ({"window": 9}, 2, "prefill window"),
        ({"granularities": ["heads"]}, 2, "mean or top-k"),
    ):
        try:
            run.hf.kvtier_trace_meta(run.kvtier, run.model, 5, 3, tool="test", **arguments)
            raise AssertionError(f"kvtier trace meta accepted {arguments}")
        except run.hf.CaptureError as error:
            assert error.exit_code == code and needle in error.line, (error.exit_code, error.line)
    try:
        run.hf.kvtier_trace_meta(run.kvtier, run.path("no-model.bin"), 5, 3, tool="test")
        raise AssertionError("kvtier trace meta accepted a missing model")
    except run.hf.CaptureError as error:
        assert error.exit_code == 3 and error.line.startswith("kvtier: error: "), error.line
    print("  the writer refuses wrong rows and leaves nothing behind; meta errors pass through")


def check_command_line(run: Runner) -> None:
    python = sys.executable
    shown = subprocess.run([python, run.script, "--help"], capture_output=True, text=True)
    assert shown.returncode == 0 and "--granularity" in shown.stdout, shown.stderr
    usage = subprocess.run([python, run.script, "--model", "x"], capture_output=True, text=True)
    assert usage.returncode == 2 and "--out" in usage.stderr, usage.stderr
    have_torch = all(importlib.util.find_spec(name) for name in ("torch", "transformers"))
    if not have_torch:
        out = run.path("no-torch.h5")
        result = subprocess.run(
            [python, run.script, "--model", run.scratch, "--prompt", "x", "--out", out],
            capture_output=True, text=True,
        )  # fmt: skip
        assert result.returncode == 2, (result.returncode, result.stderr)
        assert "PyTorch" in result.stderr and result.stderr.count("\n") == 1, result.stderr
        assert not os.path.exists(out)
    print("  --help, usage errors" + ("" if have_torch else " and the missing-torch error"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kvtier", required=True)
    parser.add_argument("--script", required=True)
    parser.add_argument("--fixture", required=True, help="the stories260K fixture directory")
    args = parser.parse_args()
    if not os.path.isfile(os.path.join(args.fixture, "stories260K.bin")):
        print(f"test_capture_hf_writer: fixture missing: {args.fixture}", file=sys.stderr)
        return 1
    os.environ["SOURCE_DATE_EPOCH"] = EPOCH
    failures = 0
    with tempfile.TemporaryDirectory(prefix="kvtier-capture-hf-") as scratch:
        run = Runner(args.kvtier, args.script, args.fixture, scratch)
        checks = [(f"round trip {case[0]}", lambda case=case: check_case(run, case))
                  for case in CASES]  # fmt: skip
        checks += [
            ("damage", lambda: check_damage_is_refused(run)),
            ("writer refusals", lambda: check_writer_refusals(run)),
            ("command line", lambda: check_command_line(run)),
        ]
        for name, check in checks:
            try:
                check()
            except Exception:  # noqa: BLE001 - every failure is reported, then counted
                failures += 1
                print(f"FAILED: {name}", file=sys.stderr)
                traceback.print_exc()
    print("test_capture_hf_writer:", "FAILED" if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
