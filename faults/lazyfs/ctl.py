"""`python -m faults.lazyfs.ctl SOCKET CMD [ARG]`: send one control command, print the JSON reply."""

from __future__ import annotations

import json
import sys

from faults.node.wire import ControlError, request


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        print("usage: python -m faults.lazyfs.ctl SOCKET status|flush|crash|torn SEED", file=sys.stderr)
        return 2
    try:
        reply = request(args[0], " ".join(args[1:]))
    except ControlError as e:
        print(f"lazyfs.ctl: {e}", file=sys.stderr)
        return 1
    print(json.dumps(reply, indent=2, sort_keys=True))
    return 0 if reply.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
