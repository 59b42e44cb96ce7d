"""The memory there is, and the profile `--profile auto` picks: preflight's one measurement.

`measure_budget` asks the machine (available RAM, or free memory on the CUDA device);
`gpu_memory_budget` takes a card's size from --gpu-memory instead, to plan from any machine.
`detect_hardware` and `choose_profile` are `--profile auto`.

Importing this module never imports torch; only the CUDA check and the measurement do, lazily.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NamedTuple

import msgspec
import psutil

from llmd.config import Profile, parse_size
from llmd.errors import ConfigError, DeviceUnavailable
from llmd.units import GiB, bytes_text

log = logging.getLogger("llmd.preflight")

# `--profile auto` picks by the card's total memory.
AUTO_24GB_MIN = 22 * GiB  # a "24 GB" card reports ~23.6 GiB; leave room for driver differences
AUTO_12GB_MIN = 10 * GiB
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


class MemoryBudget(msgspec.Struct, frozen=True):
    """The memory the plan may use and where that figure comes from.

    `counts_cuda_context` is set for a card's total given with --gpu-memory: the CUDA context
    still has to come out of it. Free memory measured in this process already excludes it.
    """

    bytes: int
    source: str
    counts_cuda_context: bool = False


class HardwareFacts(NamedTuple):
    """What `--profile auto` looks at."""

    cuda_total_bytes: int | None  # the current CUDA device's memory, None without CUDA
    cuda_name: str | None
    cpu_bf16: bool  # the CPU multiplies bfloat16 natively (AVX512-BF16 or AMX)


def measure_budget(profile: Profile) -> MemoryBudget:
    """Memory free for the model now: available RAM, or free memory on the CUDA device."""
    if profile.device == "cpu":
        return MemoryBudget(psutil.virtual_memory().available, "available RAM now")
    free, total = _cuda_free_memory(profile)
    return MemoryBudget(free, f"measured free now, of {bytes_text(total)} on the card")


def gpu_memory_budget(size: str) -> MemoryBudget:
    """Plan against a card of `size` (`12GiB`, `24GB`) from any machine, CUDA or not."""
    try:
        total = parse_size(size)
    except ValueError as exc:
        raise ConfigError(f"--gpu-memory: {exc}", param="gpu_memory") from exc
    return MemoryBudget(total, f"--gpu-memory {size}", counts_cuda_context=True)


def cuda_available() -> bool:
    """Whether torch is installed and sees a CUDA device (imports torch only here)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def cuda_device_count() -> int:
    """GPUs CUDA sees here (within CUDA_VISIBLE_DEVICES), what `tensor: auto` stands for at
    `llmd serve`; refuses when there is none, so systemd retries once the driver is up."""
    count = 0
    if cuda_available():
        import torch

        count = int(torch.cuda.device_count())
    if count < 1:
        raise DeviceUnavailable("the profile's `parallel.tensor: auto` counts the GPUs, and CUDA sees none "
                                "here (does nvidia-smi work? is CUDA_VISIBLE_DEVICES empty?)")
    return count


def detect_hardware() -> HardwareFacts:
    """CUDA device memory (if torch sees one) and the CPU's bfloat16 support, from /proc/cpuinfo."""
    total = name = None
    if cuda_available():
        import torch

        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        total, name = int(props.total_memory), str(props.name)
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").split()
    except OSError:
        flags = []
    return HardwareFacts(total, name, any(flag in flags for flag in CPU_BF16_FLAGS))


def choose_profile(facts: HardwareFacts) -> tuple[str, str]:
    """The shipped profile for this hardware, and why, in words for the log."""
    if facts.cuda_total_bytes is not None:
        card = f"{facts.cuda_name or 'CUDA device'} with {bytes_text(facts.cuda_total_bytes)}"
        if facts.cuda_total_bytes >= AUTO_24GB_MIN:
            return "24gb-bf16-compile", (f"{card} (≥ {bytes_text(AUTO_24GB_MIN)}): 16-bit weights, "
                                         "compiled decode")
        if facts.cuda_total_bytes >= AUTO_12GB_MIN:
            above, below = bytes_text(AUTO_12GB_MIN), bytes_text(AUTO_24GB_MIN)
            return "12gb-4bit", f"{card} (≥ {above}, < {below}): 4-bit weights"
        return "12gb-4bit", (f"{card}, below {bytes_text(AUTO_12GB_MIN)}: the smallest GPU profile; the "
                             "memory plan will say whether it fits and what to lower")
    if facts.cpu_bf16:
        return "cpu-bf16", "no CUDA device; the CPU has native bfloat16 (AVX512-BF16/AMX)"
    return "cpu", "no CUDA device, and the CPU has no native bfloat16: float32"


def _cuda_free_memory(profile: Profile) -> tuple[int, int]:
    """(free, total) bytes on the current CUDA device; refuses when there is no usable CUDA."""
    if not cuda_available():
        raise DeviceUnavailable(
            f"profile `{profile.name}` runs on CUDA, but CUDA is not available here (no GPU visible, "
            "or the driver is not ready: does nvidia-smi work?). Plan from any machine with "
            "`llmd check --gpu-memory 24GiB`, or run on the CPU with `--profile cpu`")
    import torch

    free, total = torch.cuda.mem_get_info()
    return int(free), int(total)


def rank_budget(profile: Profile) -> tuple[int, int]:
    """What `llmd serve` plans an `engine: vllm` profile against here: (bytes per GPU, GPUs per node).

    CUDA: the least free memory of the cards CUDA sees, read through NVML (`cuda_free_bytes`: no
    CUDA context opened here, since vLLM's workers hold the cards from their own processes; the
    plan's overhead and headroom come out of it), and how many cards. CPU (vLLM's CPU backend): the
    RAM available now, shared by this node's ranks.
    """
    if profile.device == "cpu":
        ranks = -(-profile.parallel.gpus // profile.parallel.nodes)
        return psutil.virtual_memory().available // ranks, ranks
    if not cuda_available():
        raise DeviceUnavailable(f"profile `{profile.name}` runs vLLM on CUDA, but CUDA is not available here "
                                "(does nvidia-smi work?)")
    import torch

    count = torch.cuda.device_count()
    return min(cuda_free_bytes(index) for index in range(count)), count


def cuda_free_bytes(index: int) -> int:
    """Memory free now on CUDA card `index` (its total less what NVML says is used: by a desktop,
    another server, a worker left behind), without opening a CUDA context in this process. Without
    NVML (`nvidia-ml-py`, which vLLM's CUDA wheel installs) the card's total, with a warning."""
    import torch

    total = int(torch.cuda.get_device_properties(index).total_memory)
    try:
        used = int(torch.cuda.device_memory_used(index))
    except Exception as exc:  # no pynvml, or NVML refuses: plan on the total, as before
        log.warning("cannot read GPU %d's used memory through NVML (%s: %s); planning on its total %s",
                    index, type(exc).__name__, exc, bytes_text(total))
        return total
    return max(total - used, 0)
