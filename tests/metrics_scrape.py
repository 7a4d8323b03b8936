"""Reading ``GET /metrics`` in tests: the body parsed by prometheus_client's own parser, and one
sample looked up by its name and labels (a missing one fails naming what was looked for)."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> tuple[set[str], Samples]:
    """(the family names, every sample by name and labels) of an exposition."""
    families: set[str] = set()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        families.add(family.name)
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return families, samples


async def scrape(client: httpx.AsyncClient) -> Samples:
    response = await client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse(response.text)[1]


def value(samples: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in samples, f"no sample {name}{labels}; have {sorted(k[0] for k in samples)}"
    return samples[key]
