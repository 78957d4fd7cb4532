#!/usr/bin/env python3
"""clang-tidy over the project's own sources, with a cache of clean results.

Called by scripts/lint.sh, which documents the options. clang-tidy costs 5-20 s a file; most
files do not change between two runs. A file is linted again unless a clean run of the same
clang-tidy, with the same .clang-tidy, arguments and compile flags, saw exactly the same
translation unit: the key is a SHA-256 of all of those and of the file preprocessed with its
comments kept (`-E -C`), so an edit to the file, to any header it includes, to a NOLINT comment
or to the configuration lints it again. Paths of the checkout and build folder are replaced by
placeholders before hashing, so that clones in other folders share the cache. Only clean
results are cached; findings are printed every time.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def sources() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.cpp"],
        cwd=ROOT, check=True, capture_output=True, text=True).stdout.split()
    return [path for path in listed if not path.startswith(("tests/", "fuzz/"))]


def preprocess_command(entry: dict) -> list[str]:
    """The entry's compile command turned into `-E -C` to standard output."""
    words = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    out: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
            continue
        if word in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if word in ("-c", "-MD", "-MMD"):
            continue
        out.append(word)
    return out + ["-E", "-C", "-o", "-"]


def key_of(entry: dict, salt: bytes, build: Path) -> str | None:
    """The cache key of one file, or None when it cannot be preprocessed (lint it then)."""
    done = subprocess.run(preprocess_command(entry), cwd=entry["directory"],
                          capture_output=True, check=False)
    if done.returncode != 0:
        return None
    digest = hashlib.sha256(salt)
    flags = " ".join(preprocess_command(entry))
    for text in (flags.encode(), done.stdout):
        text = text.replace(str(build).encode(), b"@BUILD@").replace(str(ROOT).encode(), b"@ROOT@")
        digest.update(len(text).to_bytes(8, "little"))
        digest.update(text)
    return digest.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build/default")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--cache", default=os.environ.get("KVTIER_LINT_CACHE", ""))
    parser.add_argument("tidy_args", nargs="*")
    args = parser.parse_args()
    build = (ROOT / args.build).resolve()
    entries = {Path(e["file"]).resolve(): e
               for e in json.loads((build / "compile_commands.json").read_text())}
    cache: Path | None = None
    if args.cache != "off":
        base = args.cache or os.path.join(
            os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "kvtier-lint")
        cache = Path(base)
        cache.mkdir(parents=True, exist_ok=True)
    version = subprocess.run(["clang-tidy", "--version"], capture_output=True, check=True).stdout
    salt = b"\0".join([version, (ROOT / ".clang-tidy").read_bytes(),
                       " ".join(args.tidy_args).encode()])

    def lint(path: str) -> tuple[str, int, str, bool]:
        entry = entries.get((ROOT / path).resolve())
        key = key_of(entry, salt, build) if entry is not None and cache is not None else None
        if key is not None and (cache / key).exists():
            return path, 0, "", True
        done = subprocess.run(
            ["clang-tidy", "-p", str(build), "--quiet", *args.tidy_args, path],
            cwd=ROOT, capture_output=True, text=True, check=False)
        # clang-tidy prints "N warnings generated." for suppressed system-header warnings.
        findings = "\n".join(line for line in (done.stdout + done.stderr).splitlines()
                             if not line.endswith(" generated.") and line.strip())
        if done.returncode == 0 and key is not None:
            (cache / key).touch()
        return path, done.returncode, findings, False

    files = sources()
    failed = 0
    reused = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for path, code, findings, hit in pool.map(lint, files):
            reused += hit
            if code != 0:
                failed += 1
                print(findings or f"{path}: clang-tidy exited with {code}", flush=True)
    print(f"lint: {len(files)} files, {reused} unchanged since a clean run (cached), "
          f"{failed} with findings", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
