#!/usr/bin/env python3
"""scripts/capture_hf.py against `kvtier trace capture` on the same models (needs torch).

Small randomly initialised Llama and Qwen2 models (seeded) are saved as Hugging Face
safetensors directories; each is captured greedily by kvtier's CPU engine and by capture_hf.py
(transformers, eager attention) from the same prompt token ids, and the two traces must hold
the same tokens and the same attention: mean rows within FP16 rounding for FP16 traces, and
every granularity (mean, per-head, top-k, prefill window, key norms) within float32 engine
differences for FP32 traces. Both files must pass `kvtier trace validate`.

Exit 77 (CTest's skip) when torch or transformers do not import. KVTIER_TORCH_DEVICE picks the
torch device (default cpu; e.g. cuda on a GPU machine).

usage: test_capture_hf_torch.py --kvtier BIN --script scripts/capture_hf.py --fixture DIR
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import traceback

SKIP = 77

try:
    import torch
    import transformers
except ImportError as missing:
    print(f"test_capture_hf_torch: skipped: {missing} (needs torch and transformers)")
    sys.exit(SKIP)

import h5py
import numpy as np

PROMPT = "Once upon a time there was a little"
STEPS = 24
VOCAB = 512  # the fixture's tok512.bin tokenizer: kvtier encodes the prompt with it


def make_model(kind: str, directory: str) -> None:
    """A seeded random model, larger-than-default weights so that attention is not uniform and
    greedy choices are not near-ties."""
    common = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
        initializer_range=0.15,
    )  # fmt: skip
    torch.manual_seed(1234 if kind == "llama" else 4321)
    if kind == "llama":
        config = transformers.LlamaConfig(**common)
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.Qwen2Config(**common, use_sliding_window=False)
        model = transformers.Qwen2ForCausalLM(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(".bias"):  # Qwen2's q/k/v biases start at zero
                parameter.normal_(0.0, 0.3)
            elif "norm" in name:
                parameter.uniform_(0.8, 1.2)
    model = model.to(torch.float32)
    model.save_pretrained(directory, safe_serialization=True)


def run(command: list[str]) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(command)}\nexit {result.returncode}: {result.stderr}")
    return result


def read(path: str) -> dict:
    with h5py.File(path, "r") as f:
        data = {"tokens": f["/tokens"][...]}

        def visit(name, item):
            if isinstance(item, h5py.Dataset) and name != "meta":
                data["/" + name] = item[...]

        f.visititems(visit)
        data["prompt_tokens"] = int(f["/meta"].attrs["prompt_tokens"])
    return data


def compare(kind: str, dtype: str, ours: dict, theirs: dict) -> None:
    assert np.array_equal(ours["tokens"], theirs["tokens"]), (
        f"{kind}: tokens differ:\nkvtier  {ours['tokens']}\ntorch   {theirs['tokens']}"
    )
    assert sorted(ours) == sorted(theirs), f"{kind}: datasets differ"
    for path in sorted(ours):
        if not path.startswith("/"):
            continue
        a, b = ours[path], theirs[path]
        assert a.shape == b.shape and a.dtype == b.dtype, f"{kind} {path}: shape or type"
        if path.endswith("/indices") or path == "/tokens" or path.endswith("row_offsets"):
            continue  # top-k indices are checked through their weights (ties may reorder)
        x, y = a.astype(np.float64), b.astype(np.float64)
        if dtype == "fp16" and a.dtype == np.float16:
            # The same float32 value on both sides, give or take engine rounding, then rounded
            # to FP16: at most one FP16 step apart (relative 2^-10, 2^-24 for subnormals).
            tolerance = np.abs(x) * 2.0**-10 + 2.0**-24 + 1e-6
        elif path.startswith("/keys"):
            tolerance = np.abs(x) * 1e-4 + 1e-5
        else:
            tolerance = np.abs(x) * 1e-4 + 2e-6
        worst = np.max(np.abs(x - y) - tolerance)
        assert worst <= 0, f"{kind} {dtype} {path}: max excess over tolerance {worst:.3g}"
    for path in ours:
        if path.endswith("/indices"):
            # Where a weight is clearly apart from its neighbours, the position must agree.
            weights = ours[path[: -len("indices")] + "weights"].astype(np.float64)
            gaps = np.minimum(
                np.abs(np.diff(weights, axis=1, prepend=np.inf)),
                np.abs(np.diff(weights, axis=1, append=-np.inf)),
            )
            clear = gaps > 1e-3
            assert np.array_equal(ours[path][clear], theirs[path][clear]), f"{kind} {path}"


def check_model(kind: str, args, scratch: str, device: str) -> None:
    model_dir = os.path.join(scratch, kind)
    make_model(kind, model_dir)
    tokenizer = os.path.join(args.fixture, "tok512.bin")
    for dtype, granularities, extra in (
        ("fp16", ["mean"], []),
        ("fp32", ["mean,heads", "topk:6"], ["--window", "3", "--key-norms"]),
    ):
        reference = os.path.join(scratch, f"{kind}-{dtype}-kvtier.h5")
        captured = os.path.join(scratch, f"{kind}-{dtype}-torch.h5")
        options = ["--max-new-tokens", str(STEPS), "--no-stop", "--dtype", dtype, *extra]
        for granularity in granularities:
            options += ["--granularity", granularity]
        run([args.kvtier, "trace", "capture", "--model", model_dir, "--tokenizer", tokenizer,
             "--prompt", PROMPT, *options, "--out", reference])  # fmt: skip
        ours = read(reference)
        prompt_ids = ",".join(str(t) for t in ours["tokens"][: ours["prompt_tokens"]])
        run([sys.executable, args.script, "--model", model_dir, "--prompt-ids", prompt_ids,
             "--device", device, "--kvtier", args.kvtier, *options, "--out", captured])  # fmt: skip
        for trace in (reference, captured):
            run([args.kvtier, "trace", "validate", trace])
        compare(kind, dtype, ours, read(captured))
        print(f"  {kind} {dtype}: tokens equal, attention within tolerance")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kvtier", required=True)
    parser.add_argument("--script", required=True)
    parser.add_argument("--fixture", required=True, help="the stories260K fixture directory")
    args = parser.parse_args()
    device = os.environ.get("KVTIER_TORCH_DEVICE", "cpu")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, device {device}")
    failures = 0
    with tempfile.TemporaryDirectory(prefix="kvtier-capture-hf-torch-") as scratch:
        for kind in ("llama", "qwen2"):
            try:
                check_model(kind, args, scratch, device)
            except Exception:  # noqa: BLE001 - each model's failure is reported and counted
                failures += 1
                print(f"FAILED: {kind}", file=sys.stderr)
                traceback.print_exc()
    print("test_capture_hf_torch:", "FAILED" if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
