"""Small torch modules for the tests of the Linear-layer rewrites (oneDNN packing, int8)."""

from __future__ import annotations

import torch


class TiedAndHalf(torch.nn.Module):
    """One rewritable Linear (`proj`), one in float16 (`half`), and an output head tied to the embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(32, 16)
        self.proj = torch.nn.Linear(16, 16)
        self.half = torch.nn.Linear(16, 16).half()
        self.head = torch.nn.Linear(16, 32, bias=False)
        self.head.weight = self.embed.weight
