"""The demo model: a random-weight Llama whose greedy output is a known text (entry points in `build`)."""
