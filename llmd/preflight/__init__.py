"""Preflight: will this model fit with this profile? Arithmetic you can read, plus one measurement."""
