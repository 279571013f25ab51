"""The bench binary as scripts/bench-count, scripts/bench-lines and scripts/bench-allocators measure it (a module they import).

Built with cargo's `bench` profile (release with fat LTO and one codegen unit, as scripts/bench builds
it), in CARGO_TARGET_DIR or target/; cargo puts that profile's output in release/.
"""

from __future__ import annotations

import json
import pathlib
import subprocess


def bench_binary(root: pathlib.Path) -> pathlib.Path:
    """Builds the bench binary of the workspace at `root` and returns its path."""
    subprocess.run(
        ["cargo", "build", "--quiet", "--profile", "bench", "-p", "idempotent-examples", "--bin", "bench"],
        cwd=root,
        check=True,
    )
    meta = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps"],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    )
    return pathlib.Path(json.loads(meta.stdout)["target_directory"]) / "release" / "bench"
