"""``python -m broker_impl --config FILE.toml``: run one node until SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from broker_impl.config import Config, ConfigError, load


def setup_logging(cfg: Config) -> None:
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    root = logging.getLogger()
    root.setLevel(cfg.log_level.upper())
    err = logging.StreamHandler(sys.stderr)
    err.setFormatter(fmt)
    root.addHandler(err)
    path = cfg.resolved_log_file
    path.parent.mkdir(parents=True, exist_ok=True)
    fh = logging.FileHandler(path)
    fh.setFormatter(fmt)
    root.addHandler(fh)


async def _run(cfg: Config) -> str | None:
    """Serve until stopped; the reason when the node stopped itself (its store failed), else None."""
    from broker_impl.server import Server

    server = Server(cfg)
    await server.start()
    await server.serve_forever()
    return server.failure


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m broker_impl", description="AMQP 0-9-1 reference broker node")
    ap.add_argument("--config", required=True, help="TOML config file (see broker_impl/config.py)")
    args = ap.parse_args(argv)
    try:
        cfg = load(args.config)
    except ConfigError as exc:
        print(f"broker_impl: config error: {exc}", file=sys.stderr)
        return 2
    try:
        from broker_impl.store import StoreConfig, StoreConfigError

        StoreConfig.from_table(cfg.store)
    except StoreConfigError as exc:
        print(f"broker_impl: config error: {exc}", file=sys.stderr)
        return 2
    try:
        setup_logging(cfg)
    except OSError as exc:
        print(f"broker_impl: cannot open log file {cfg.resolved_log_file}: {exc.strerror}", file=sys.stderr)
        return 2
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    from broker_impl.errors import BrokerError

    try:
        failure = asyncio.run(_run(cfg))
        if failure is not None:
            print(
                f"broker_impl: stopped: {failure}; restart the node to recover from its disk", file=sys.stderr
            )
            return 70
    except BrokerError as exc:
        print(f"broker_impl: cannot start: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"broker_impl: cannot start: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
