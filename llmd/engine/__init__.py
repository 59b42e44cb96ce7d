"""The engine: the seam the API sees, scheduling and the one worker thread; torch lives only in `model/`."""
