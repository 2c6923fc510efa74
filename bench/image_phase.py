"""The image phase of a first run on a bare machine, measured beside the images in use.

  python bench/image_phase.py [--out bench/results/image_phase.json] [--all]

Builds the default run's images (the common base by ``debootstrap``, the Toxiproxy sidecar, the
reference broker) under a repository namespace of its own (``brokerchaos-bench-<pid>/...``) with an
empty package and wheel cache, so nothing is reused from earlier builds: every package comes from
the Debian mirror and every wheel from PyPI, as on a bare machine. With ``--all``, then every other
broker's image too (what their first run builds). Removes the images it built at the end. The
Toxiproxy-API server's binary is the checkout's (``cargo build`` is timed by scripts/install.sh's
step, not here). The machine's load is recorded before and after each image.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.facts import load_average  # noqa: E402 - importable once the repository is on the path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "image_phase.json")
    ap.add_argument("--all", action="store_true", help="also every other broker's image")
    args = ap.parse_args()
    from harness.cluster import docker_client
    from harness.host import Host
    from harness.images import ImageBuilder

    host = Host.load()
    client = docker_client()
    namespace = f"brokerchaos-bench-{os.getpid()}"
    steps: list[dict[str, Any]] = []
    made: list[str] = []
    with tempfile.TemporaryDirectory(prefix="brokerchaos-image-bench-") as cache:
        builder = ImageBuilder(client, namespace=namespace, cache=Path(cache))

        def step(name: str, fn: Any) -> str:
            before = load_average()
            t0 = time.monotonic()
            tag = str(fn())
            steps.append(
                {
                    "image": name,
                    "tag": tag,
                    "seconds": round(time.monotonic() - t0, 1),
                    "load_before": before,
                    "load_after": load_average(),
                }
            )
            made.append(tag)
            print(json.dumps(steps[-1]), flush=True)
            return tag

        try:
            step("common base (debootstrap, cold package cache)", builder.base)
            step("toxiproxy sidecar", builder.toxiproxy_image)
            step(
                "reference broker (cold wheel cache)",
                lambda: builder.node_image(host.broker("reference").image()),
            )
            default_total = round(sum(s["seconds"] for s in steps), 1)
            if args.all:
                for name in sorted(host.registry.brokers):
                    if name == "reference":
                        continue
                    recipe = host.broker(name).image()
                    if recipe.debian_packages:
                        step(
                            f"{name}: its packages, a layer on the base",
                            lambda r=recipe: builder.rootfs(r.debian_packages),
                        )
                    step(f"{name} broker", lambda r=recipe: builder.node_image(r))
        finally:
            import docker.errors

            # Newest first: an image goes before the base it was built on.
            for tag in reversed(made):
                for name in (tag, tag.rsplit(":", 1)[0] + ":latest"):
                    try:
                        client.images.remove(name)
                    except docker.errors.NotFound:
                        pass
    out = {
        "command": " ".join(["python", "bench/image_phase.py", *sys.argv[1:]]),
        "cores": os.cpu_count(),
        "default_run_images_seconds": default_total,
        "steps": steps,
    }
    args.out.write_text(json.dumps(out, indent=1))
    print(f"default run's images from nothing: {default_total} s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
