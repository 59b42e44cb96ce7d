"""The demo model's sizes: the shape of each (`tiny` for tests, `small` and `medium` for benchmarks)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DemoModelSize:
    """Shape of one demo model size (the vocabulary is the tokenizer's, shared by all sizes)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden_size // self.num_heads


SIZES: dict[str, DemoModelSize] = {
    "tiny": DemoModelSize(hidden_size=64, intermediate_size=256, num_layers=2, num_heads=4, num_kv_heads=2),
    "small": DemoModelSize(
        hidden_size=512, intermediate_size=1536, num_layers=8, num_heads=8, num_kv_heads=2
    ),
    "medium": DemoModelSize(
        hidden_size=768, intermediate_size=2688, num_layers=14, num_heads=12, num_kv_heads=4
    ),
}


def demo_size(name: str) -> DemoModelSize:
    """The shape called `name`, or a ValueError that lists the known ones."""
    if name not in SIZES:
        raise ValueError(f"unknown demo model size {name!r}; choose one of {', '.join(SIZES)}")
    return SIZES[name]
