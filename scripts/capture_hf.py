#!/usr/bin/env python3
"""Capture a kvtier attention trace (format v1) from a Hugging Face causal LM with PyTorch.

Runs the model with transformers (eager attention, so that it returns its attention weights):
the prompt as a prefill, then one decode step at a time with the KV cache, and writes what
`kvtier trace capture` writes for the same request (docs/TRACE_FORMAT.md, "Capturing with
PyTorch"): step t runs /tokens[P + t] (the first the token sampled from the prefill's logits)
and its row is that call's attention, for every layer. The /meta record and every attribute
come from `kvtier trace meta`, so this script never derives a /meta field itself; the file is
written with h5py to OUT.tmp.PID and renamed into place at the end (removed on any error).

The writer half (TraceFileWriter, write_trace, kvtier_trace_meta) is scripts/kvtier_trace_file.py,
which needs only numpy and h5py (and is re-exported here); torch and transformers are imported by
the capture alone.

Exit codes as kvtier's: 0 ok, 1 runtime failure, 2 bad usage or options, 3 bad input data
(a model that cannot be read); errors from `kvtier trace meta` are passed on as it prints them.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from typing import Any, Sequence

SCRIPT = "capture_hf.py"

try:
    import numpy as np
except ImportError as missing:
    if __name__ != "__main__":
        raise
    print(f"{SCRIPT}: error: needs numpy and h5py ({missing}); e.g. `pip install numpy h5py`, "
          "or on Debian `apt-get install python3-numpy python3-h5py`", file=sys.stderr)  # fmt: skip
    sys.exit(2)

# The writer half lives beside this script.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    from kvtier_trace_file import (  # noqa: E402  (after the path is set)
        CHUNK_ELEMENTS,
        DEFLATE_LEVEL,
        TOPK_PAD_INDEX,
        CaptureError,
        TraceFileWriter,
        default_kvtier,
        kvtier_trace_meta,
        kvtier_version,
        row_offset,
        topk_of_row,
        write_trace,
    )
except ImportError as missing:
    if __name__ != "__main__":
        raise
    print(f"{SCRIPT}: error: needs numpy, h5py and kvtier_trace_file.py beside it ({missing})",
          file=sys.stderr)
    sys.exit(2)

__all__ = ["CHUNK_ELEMENTS", "DEFLATE_LEVEL", "TOPK_PAD_INDEX", "CaptureError", "TraceFileWriter",
           "default_kvtier", "kvtier_trace_meta", "kvtier_version", "row_offset", "topk_of_row",
           "write_trace", "capture", "main", "parser"]

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
