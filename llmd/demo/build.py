"""Building the demo model: `build_demo_model` into a directory, `ensure_demo_model` into the cache.

The model is a random-weight Llama whose greedy output is a known, multilingual text: a
Hugging Face model directory (config, safetensors weights, a byte-level BPE tokenizer trained
here, a Llama-3 style chat template) that transformers loads offline. Its attention and MLP
weights are random; its embeddings and lm_head are arranged so that greedy decoding walks a
fixed cycle of distinct token ids whose decoded text is `DEMO_TEXT`, while sampling at
temperature 1.0 still varies. That makes engine output exactly testable. The cycle opens with
`DEMO_LEAD_TEXT`, over 200 tokens of English that are each whole ASCII, so streaming
benchmarks see one chunk per token as with real English output; the multilingual rest splits
many multibyte characters across tokens to exercise UTF-8-safe streaming.

Weights are written with numpy only: the demo package must not import torch or transformers.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from safetensors.numpy import save_file

from llmd.demo.cycle import demo_cycle
from llmd.demo.files import (
    MANIFEST_FILE,
    generation_config,
    is_complete_demo_model,
    manifest,
    model_config,
    write_json,
    write_tokenizer,
)
from llmd.demo.sizes import demo_size
from llmd.demo.tokenizer import train_tokenizer
from llmd.demo.weights import demo_weights


def build_demo_model(directory: Path, size: str = "tiny", seed: int = 0) -> Path:
    """Write the demo model of `size` into `directory` (created if missing); return `directory`.

    The same size and seed always give byte-identical files. The manifest is written last, so a
    directory that has it is complete.
    """
    shape = demo_size(size)
    tokenizer = train_tokenizer()
    cycle = demo_cycle(tokenizer)
    vocab_size = tokenizer.get_vocab_size()
    tensors = demo_weights(shape, vocab_size, cycle, seed)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MANIFEST_FILE).unlink(missing_ok=True)  # an old build's marker must not vouch for this one
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    write_json(directory / "config.json", model_config(shape, vocab_size))
    write_json(directory / "generation_config.json", generation_config())
    write_tokenizer(directory, tokenizer)
    write_json(directory / MANIFEST_FILE, manifest(size, seed, cycle))
    return directory


def default_demo_model_dir(size: str = "small") -> Path:
    """`$LLMD_HOME/demo-model-{size}`, or `~/.cache/llmd/demo-model-{size}` without LLMD_HOME."""
    home = os.environ.get("LLMD_HOME")
    root = Path(home) if home else Path.home() / ".cache" / "llmd"
    return root / f"demo-model-{size}"


def ensure_demo_model(size: str = "small") -> Path:
    """Return the default demo model directory of `size`, building it first if needed.

    The model is built in a temporary directory beside the target and renamed into place, so an
    interrupted build never leaves a directory that looks complete.
    """
    demo_size(size)
    target = default_demo_model_dir(size)
    if is_complete_demo_model(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        _install(build_demo_model(staging, size), target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _install(staging: Path, target: Path) -> None:
    """Rename a finished build to `target`; a complete one that another process put there wins."""
    if target.exists() and not is_complete_demo_model(target):
        _discard(target)
    try:
        os.replace(staging, target)
    except OSError:
        if not is_complete_demo_model(target):
            raise


def _discard(path: Path) -> None:
    """Remove an incomplete model directory, moving it aside first so no one reads it half gone."""
    graveyard = Path(tempfile.mkdtemp(prefix=f".{path.name}.stale.", dir=path.parent))
    try:
        os.replace(path, graveyard / path.name)
    finally:
        shutil.rmtree(graveyard, ignore_errors=True)
