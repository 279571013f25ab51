"""The bench binary as scripts/bench-count, scripts/bench-lines and scripts/bench-allocators measure it (a module they import).

Built with cargo's `bench` profile (release with fat LTO and one codegen unit, as scripts/bench builds
it), in CARGO_TARGET_DIR or target/; cargo puts that profile's output in release/.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

# The bench's null DynamoDB runs its calls in 40 rounds; a multiple of that keeps a count of calls exact.
ROUNDS = 40


def bench_binary(root: pathlib.Path) -> pathlib.Path:
    """Builds the bench binary of the workspace at `root` and returns its path."""
    # A relative CARGO_TARGET_DIR means the caller's directory; cargo runs from `root` here.
    target = os.environ.get("CARGO_TARGET_DIR", "").strip()
    if target and not os.path.isabs(target):
        os.environ["CARGO_TARGET_DIR"] = os.path.abspath(target)
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


def one_variant(workload: str, variant: str, calls: int, warmup: int) -> list[str]:
    """The bench's arguments for `variant` of the null DynamoDB alone (its implementation's, no other)."""
    implementation = "baseline" if variant.startswith("baseline") else "ours"
    return [
        "--null-dynamodb",
        "--implementation",
        implementation,
        "--variant",
        variant,
        "--workload",
        workload,
        "--calls",
        str(calls),
        "--warmup",
        str(warmup),
    ]
