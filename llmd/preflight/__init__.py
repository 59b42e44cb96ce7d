"""Preflight: will this model fit with this profile? Arithmetic you can read, plus one measurement.

shape.py reads the model's shape from `config.json` and the safetensors headers (never a
tensor); plan.py is the arithmetic, the verdict and the fixes; hardware.py measures the memory
there is and picks the profile for `auto`; render.py writes the plan as text. No module here
imports torch at import time.
"""
