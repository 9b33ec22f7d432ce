"""kvstrata/metrics/__init__.py lists every series a rank and the gateway expose: the list is checked
against what the collectors really yield, so a new metric cannot go unlisted, nor a listed one vanish."""
from __future__ import annotations

import itertools
import re

import torch
from prometheus_client import CollectorRegistry

import kvstrata.metrics
from kvstrata.kv.hashing import namespace_root
from kvstrata.kv.pool import PagePool
from kvstrata.kv.radix import RadixPrefixCache
from kvstrata.kv.tier_stats import TierStats
from kvstrata.metrics import PREFIX
from kvstrata.metrics.classes import ClassCollector
from kvstrata.metrics.gateway import RouterMetrics
from kvstrata.metrics.rank import Metrics
from kvstrata.metrics.tiers import TierCollector


def expand(name: str) -> list[str]:
    """`a_{b,c}_d` -> a_b_d, a_c_d (a brace group after `_` is part of the name)."""
    parts = re.split(r"\{([a-z_,]+)\}", name)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def listed() -> set[str]:
    names: set[str] = set()
    for line in (kvstrata.metrics.__doc__ or "").splitlines():
        if not line.startswith("    "):
            continue
        column = re.split(r"\s{2,}", line.strip())[0]
        column = re.sub(r"(?<!_)\{[^}]*\}", "", column)  # label sets: `total{tier}`, not `_{a,b}`
        for token in re.findall(r"[a-z][a-z0-9_]*(?:\{[a-z_,]+\}[a-z0-9_]*)*", column):
            names.update(expand(token))
    return names


def exposed(registry: CollectorRegistry) -> set[str]:
    names = set()
    for family in registry.collect():
        assert family.name.startswith(PREFIX), family.name
        suffix = "_total" if family.type == "counter" else ""
        names.add(family.name[len(PREFIX):] + suffix)
    return names


def test_every_series_is_listed_and_every_listed_series_exists() -> None:
    rank = Metrics().registry
    rank.register(TierCollector(TierStats()))
    pool = PagePool(4, 4, 1, 1, 4, torch.float32)
    rank.register(ClassCollector(RadixPrefixCache(pool, 4, namespace_root("m", "float32", 4, "nhd")), None))
    found = exposed(rank) | exposed(RouterMetrics().registry)
    assert found == listed(), (sorted(found - listed()), sorted(listed() - found))


def test_the_parser_reads_name_groups_and_drops_label_sets() -> None:
    assert expand("kvstore_{reads,writes}_total") == ["kvstore_reads_total", "kvstore_writes_total"]
    assert {"prefix_cache_hits_total", "kv_class_hits_total", "router_retries_total"} <= listed()
    assert "tier" not in listed() and "backend" not in listed()
