"""llmd: a local daemon serving one Hugging Face causal LM over the OpenAI API (map: README, Layout)."""
