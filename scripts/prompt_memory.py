"""Resident memory of a real `llmd serve` around a burst of oversized prompts.

Starts the daemon (default `cpu` profile, the small demo model), sends `--concurrency`
chat requests of `--mib` MiB each at once (under the 8 MiB body limit, far over the context),
and prints the daemon's RSS before, at the peak (sampled every 20 ms) and after each burst
(`--bursts`, RSS deltas always against the first "before").
Each request must be refused with 400 `context_length_exceeded`.

    python scripts/prompt_memory.py [--source DIR] [--model DIR]

`--source` runs the llmd found in another checkout (to measure old code the same way).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

MIB = 1024 * 1024


def free_port() -> int:
    """A loopback TCP port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(source: Path, model: Path, port: int, home: Path) -> subprocess.Popen[bytes]:
    """`llmd serve` from `source`, its output in `home`/serve.log."""
    env = os.environ | {"PYTHONPATH": str(source), "LLMD_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "llmd.cli", "serve", "--model", str(model), "--port", str(port)]
    with (home / "serve.log").open("wb") as log:
        return subprocess.Popen(command, cwd=source, env=env, stdout=log, stderr=subprocess.STDOUT)


def wait_ready(url: str, process: subprocess.Popen[bytes], timeout: float = 300.0) -> None:
    """Poll /ready until 200; raise if the daemon exits or the deadline passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"llmd serve exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError("llmd serve did not become ready")


async def burst(url: str, body: bytes, count: int) -> list[str]:
    """Send `count` copies of `body` at once; each result is `status code`."""
    async with httpx.AsyncClient(timeout=600) as client:
        async def one() -> str:
            response = await client.post(
                f"{url}/v1/chat/completions", content=body, headers={"Content-Type": "application/json"}
            )
            code = response.json().get("error", {}).get("code") if response.status_code != 200 else ""
            return f"{response.status_code} {code}"

        return list(await asyncio.gather(*(one() for _ in range(count))))


async def measure(url: str, pid: int, body: bytes, count: int) -> tuple[list[str], int]:
    """Run the burst while sampling RSS; the results and the peak RSS."""
    process = psutil.Process(pid)
    peak = process.memory_info().rss
    task = asyncio.create_task(burst(url, body, count))
    while not task.done():
        peak = max(peak, process.memory_info().rss)
        await asyncio.sleep(0.02)
    return await task, peak


def prompt_body(mib: float, model_id: str) -> bytes:
    """A chat request whose content is `mib` MiB of words."""
    content = "word " * int(mib * MIB / 5)
    return json.dumps({"model": model_id, "messages": [{"role": "user", "content": content}]}).encode()


def main() -> None:
    """Parse flags, run the measurement, print one line per phase."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--model", type=Path, help="model directory (default: build the small demo model)")
    parser.add_argument("--mib", type=float, default=6.8)
    parser.add_argument("--concurrency", type=int, default=12)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds to wait before the last sample")
    parser.add_argument("--bursts", type=int, default=1, help="bursts in a row, each reported")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        model = args.model or build_model(home / "small")
        port = free_port()
        process = start(args.source.resolve(), model, port, home)
        try:
            run(f"http://127.0.0.1:{port}", process, args)
        finally:
            process.terminate()
            process.wait(timeout=30)


def build_model(directory: Path) -> Path:
    """The small demo model, built offline."""
    subprocess.run([sys.executable, "-m", "llmd.cli", "demo-model", str(directory), "--size", "small"],
                   check=True, stdout=subprocess.DEVNULL)
    return directory


def run(url: str, process: subprocess.Popen[bytes], args: argparse.Namespace) -> None:
    """Measure one burst against the ready daemon and print the report."""
    wait_ready(url, process)
    model_id = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    body = prompt_body(args.mib, model_id)
    rss = psutil.Process(process.pid).memory_info().rss
    for number in range(1, args.bursts + 1):
        results, peak = asyncio.run(measure(url, process.pid, body, args.concurrency))
        time.sleep(args.settle)
        after = psutil.Process(process.pid).memory_info().rss
        outcomes = {result: results.count(result) for result in sorted(set(results))}
        print(f"burst {number}: {args.concurrency} x {len(body) / MIB:.1f} MiB bodies: {outcomes}")
        print(f"  RSS before {rss / MIB:.0f} MiB, peak {peak / MIB:.0f} MiB (+{(peak - rss) / MIB:.0f}), "
              f"after {args.settle:g} s {after / MIB:.0f} MiB (+{(after - rss) / MIB:.0f})", flush=True)

if __name__ == "__main__":
    main()
