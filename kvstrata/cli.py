"""`kvstrata` command line: serve, fetch-model, bench."""
from __future__ import annotations

import argparse
import logging
import sys

from kvstrata.config import (
    CacheConfig,
    ModelConfig,
    SchedulerConfig,
    ServerConfig,
    add_arguments,
    from_namespace,
)


def _serve(ns: argparse.Namespace) -> int:
    from kvstrata.serving.server import run_server

    server_cfg = from_namespace(ServerConfig, ns)
    logging.basicConfig(
        level=server_cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    run_server(
        from_namespace(ModelConfig, ns),
        from_namespace(CacheConfig, ns),
        from_namespace(SchedulerConfig, ns),
        server_cfg,
    )
    return 0


def _fetch(ns: argparse.Namespace) -> int:
    from kvstrata.model.fetch import fetch_model

    path = fetch_model(ns.name, progress=True)
    print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvstrata", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="start the OpenAI-compatible server")
    for cls in (ModelConfig, CacheConfig, SchedulerConfig, ServerConfig):
        add_arguments(serve, cls)
    serve.set_defaults(func=_serve)

    fetch = sub.add_parser("fetch-model", help="download a registry model (no-op when present)")
    fetch.add_argument("name", nargs="?", default="smollm2")
    fetch.set_defaults(func=_fetch)

    from kvstrata.bench.cli import add_bench_parser

    add_bench_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    return int(ns.func(ns) or 0)


if __name__ == "__main__":
    sys.exit(main())
