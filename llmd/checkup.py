"""`llmd check`'s second half: load the model as `serve` would, then measure and inspect it.

The memory plan is arithmetic; this is the measurement next to it (weights and KV cache
bytes per token as they really are) and the tuning checklist from the field notes, run on
the loaded model and one real prefill through the serving path (the checklist itself is the
model side's: llmd/engine/model/checklist.py). The model side is imported inside the function
that loads and inspects, so importing this module stays light: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llmd.config import Profile
from llmd.units import mib

if TYPE_CHECKING:
    from llmd.engine.model.checklist import Check
    from llmd.engine.model.loader import LoadReport


@dataclass(frozen=True, slots=True)
class Checkup:
    """What loading and one request measured, and the checklist's verdicts."""

    load: LoadReport
    kv_bytes_per_token: int
    checks: list[Check]

    @property
    def passed(self) -> bool:
        """Every checklist line passed."""
        return all(check.ok for check in self.checks)


def run_checkup(model_dir: str | Path, profile: Profile) -> Checkup:
    """Load, prefill one chat prompt, measure its KV cache, and run the checklist."""
    from llmd.engine.model.checklist import batch_step_check, lone_step_check, tuning_checklist
    from llmd.engine.model.runner import ModelRunner
    from llmd.engine.model.sdpa import sdpa_preference
    from llmd.engine.tokenizer import ChatTokenizer
    from llmd.engine.types import Request, SamplingParams

    runner = ModelRunner(model_dir, profile)
    prompt = ChatTokenizer(model_dir).encode_chat([{"role": "user", "content": "How fast can you go?"}])
    request = Request("llmd-check", prompt, SamplingParams(max_tokens=2, temperature=0.0))
    with sdpa_preference(profile):
        runner.first_token(request)
    layers = runner.kv_tensors(request.request_id)
    per_token = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
    kv_sample = layers[0][0] if layers else None
    checks = tuning_checklist(runner.model, profile, kv_sample)
    compiled = (lone_step_check(profile, runner.fast_paths), batch_step_check(profile, runner.fast_paths))
    checks += [check for check in compiled if check is not None]
    runner.release(request.request_id)
    return Checkup(runner.load_report, per_token // len(prompt), checks)


def render_checkup(checkup: Checkup, planned_weights: int, planned_kv_per_token: int) -> str:
    """The measurement beside the plan, then one line per check with its fix when it failed."""
    def off(measured: int, planned: int) -> str:
        return f"{(measured - planned) / planned * 100:+.1f} %" if planned else "-"

    load, kv = checkup.load, checkup.kv_bytes_per_token
    lines = [
        f"measured after loading on {load.device} ({load.seconds:.1f} s):",
        f"  weights        planned {mib(planned_weights, 2):>14}  measured {mib(load.weight_bytes, 2):>14}  "
        f"{off(load.weight_bytes, planned_weights)}",
        f"  kv per token   planned {planned_kv_per_token / 1024:>10.2f} KiB  measured "
        f"{kv / 1024:>10.2f} KiB  {off(kv, planned_kv_per_token)}",
        f"  on the device  {mib(load.device_bytes, 2)}; process memory grew by "
        f"{mib(load.rss_growth_bytes, 2)}",
        "",
        "tuning checklist:",
    ]
    for check in checkup.checks:
        lines.append(f"  [{'pass' if check.ok else 'FAIL'}] {check.name}: {check.detail}")
        if not check.ok:
            lines.append(f"         fix: {check.fix}")
    return "\n".join(lines)
