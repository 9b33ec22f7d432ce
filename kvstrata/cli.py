"""`kvstrata` command line: serve, route, fetch-model, dtype-plan, bench, analyze."""
from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import fields

from kvstrata.config import CacheConfig, ModelConfig, SchedulerConfig
from kvstrata.config_flags import ConfigError, add_arguments, from_namespace
from kvstrata.config_server import RouterConfig, ServerConfig
from kvstrata.model.cpu_caps import CpuIsaError, isa_cap


def _check_server_flags(server_cfg: ServerConfig) -> None:
    """What a server checks at start (key file, response-cache flags): ConfigError on a bad one."""
    from kvstrata.serving.auth import ApiKeys
    from kvstrata.serving.response_cache.service import ResponseCacheService

    ApiKeys.from_config(server_cfg)
    ResponseCacheService(server_cfg)


def _serve(ns: argparse.Namespace) -> int:
    from kvstrata.serving.server import run_server

    server_cfg = from_namespace(ServerConfig, ns)
    logging.basicConfig(
        level=server_cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from kvstrata.router.launcher import run_data_parallel
    from kvstrata.serving.ports import port_is_free

    if server_cfg.port and not port_is_free(server_cfg.host, server_cfg.port):
        raise ConfigError(f"--port {server_cfg.port} on {server_cfg.host} is in use; stop what listens there or pick another")
    if server_cfg.dp_size > 1:  # N rank processes behind the gateway (kvstrata/router/launcher.py)
        _check_server_flags(server_cfg)  # ConfigError here, not a crash loop in every rank
        return run_data_parallel(  # 0 when every rank stopped cleanly
            from_namespace(ModelConfig, ns), from_namespace(CacheConfig, ns), from_namespace(SchedulerConfig, ns),
            server_cfg, from_namespace(RouterConfig, ns),
        )
    return run_server(  # 0 after a graceful SIGTERM, 1 when the engine died (a supervisor restarts it)
        from_namespace(ModelConfig, ns),
        from_namespace(CacheConfig, ns),
        from_namespace(SchedulerConfig, ns),
        server_cfg,
    )


def _route(ns: argparse.Namespace) -> int:
    from kvstrata.router.app import run_gateway

    server_cfg = from_namespace(ServerConfig, ns)
    logging.basicConfig(
        level=server_cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    run_gateway(ns.worker, server_cfg, from_namespace(RouterConfig, ns))
    return 0


def _fetch(ns: argparse.Namespace) -> int:
    from kvstrata.model.fetch import fetch_model

    path = fetch_model(ns.name, progress=True)
    print(path)
    return 0


def _dtype_plan(ns: argparse.Namespace) -> int:
    from kvstrata.model.dtype_plan import peer_dtype, plan_dtype, read_cpu_info

    if ns.peer_dtype:
        print(peer_dtype())
        return 0
    cpu_info = read_cpu_info()
    plan = plan_dtype("auto", cpu=cpu_info)
    print(plan.log_line(cpu_info, plan.q4_auto))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvstrata", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="start the OpenAI-compatible server")
    for cls in (ModelConfig, CacheConfig, SchedulerConfig, ServerConfig, RouterConfig):
        add_arguments(serve, cls)
    serve.set_defaults(func=_serve)

    route = sub.add_parser("route", help="the cache-aware gateway in front of ranks started anywhere")
    route.add_argument("--worker", action="append", required=True, metavar="URL",
                       help="a rank's base URL (http://host:port); repeat, in rank order")
    gateway_fields = ("host", "port", "log_level", "api_key", "api_key_file", "metrics_public",
                      "max_request_body_bytes", "max_json_depth", "request_body_timeout")
    add_arguments(route, ServerConfig, exclude=tuple(f.name for f in fields(ServerConfig) if f.name not in gateway_fields))
    add_arguments(route, RouterConfig)
    route.set_defaults(func=_route)

    fetch = sub.add_parser("fetch-model", help="download a registry model (no-op when present)")
    fetch.add_argument("name", nargs="?", default="smollm2")
    fetch.set_defaults(func=_fetch)

    plan = sub.add_parser("dtype-plan", help="what --dtype auto picks on this machine's CPU, and why")
    plan.add_argument("--peer-dtype", action="store_true", help="print only the --dtype to give a peer server (vLLM)")
    plan.set_defaults(func=_dtype_plan)

    from kvstrata.analyze.cli import add_analyze_parser
    from kvstrata.bench.cli import add_bench_parser

    add_bench_parser(sub)
    add_analyze_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        isa_cap()  # KVSTRATA_CPU_ISA, read by every CPU decision below: a bad value stops here, clearly
        return int(ns.func(ns) or 0)
    except (ConfigError, CpuIsaError) as exc:  # a flag out of range: say which, exit 2 like argparse
        parser.error(str(exc))
        return 2


if __name__ == "__main__":
    sys.exit(main())
