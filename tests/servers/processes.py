"""What every test server fixture does when its session ends."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def stop_server(process: subprocess.Popen[bytes], directory: Path) -> None:
    """SIGTERM the server, SIGKILL it after 15 s, then remove its directory."""
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    shutil.rmtree(directory, ignore_errors=True)
