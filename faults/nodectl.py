"""`python -m faults.nodectl CMD [--restart-after S] [--torn SEED] [--at T]`: drive the node init from `docker exec`.

`disk add JSON`, `disk clear [ID]` and `disk list` manage the lazy filesystem's disk fault rules.

Prints the init's reply as one JSON line (the harness reads the last line) and exits non-zero
when the command was refused.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from faults.node.wire import ControlError, request

COMMANDS = ("status", "start", "stop", "crash", "power-loss", "disk-cut", "pause", "resume", "disk", "sync")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m faults.nodectl")
    p.add_argument("cmd", choices=COMMANDS)
    p.add_argument(
        "--socket", default=os.environ.get("BROKERCHAOS_NODE_SOCKET", "/run/brokerchaos/node.sock")
    )
    p.add_argument("--restart-after", type=float, help="crash/power-loss: start again after S seconds")
    p.add_argument(
        "--torn", help="power-loss, disk-cut: keep a seeded random prefix of each file's unsynced bytes"
    )
    p.add_argument("--timeout", type=float, help="stop: SIGTERM grace before SIGKILL")
    p.add_argument("--at", type=float, help="power-loss, crash: at this wall-clock time (UNIX seconds)")
    p.add_argument("rule", nargs="*", help="disk: add JSON | clear [ID] | list (lazyfs disk fault rules)")
    a = p.parse_args(argv)
    req: dict[str, object] = {"cmd": a.cmd}
    for key in ("restart_after", "torn", "timeout", "at"):
        if getattr(a, key) is not None:
            req[key] = getattr(a, key)
    if a.cmd == "disk":
        req["line"] = " ".join(a.rule)
    elif a.rule:
        p.error(f"{a.cmd} takes no arguments")
    wait = 60.0 + (a.timeout or 30.0)
    try:
        reply = request(a.socket, json.dumps(req), timeout=wait)
    except ControlError as e:
        print(json.dumps({"ok": False, "error": str(e)}))
        return 1
    print(json.dumps(reply, sort_keys=True))
    return 0 if reply.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
