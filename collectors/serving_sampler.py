"""The serving engines on this host's GPUs, sampled: every interval each
engine's `/metrics` is scraped (collectors/serving_metrics.py) and its
numbers become samples of every GPU the engine runs on, beside the GPU's
NVML samples (same catalogue, same batches, same store).

Which engines, and on which GPUs, comes from job discovery (a GPU process
walked up to the API server that listens: collectors/jobs.py), asked again
every `rediscover_s`: engines start and stop less often than they are
sampled, and a discovery reads /proc for every GPU process.
"""
from __future__ import annotations

import time
from typing import Callable, Iterable

import structlog

from .records import GpuSample, Scrape
from .serving_metrics import EngineScraper, ExpositionError

log = structlog.get_logger("gpuscope.serving")

REDISCOVER_S = 30.0


class ServingSampler:
    def __init__(self, engines: Callable[[], Iterable[tuple[str, list[int]]]], rediscover_s: float = REDISCOVER_S,
                 timeout_s: float = 2.0, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        """engines(): (base URL, GPUs it runs on) of each serving engine found."""
        self._engines_of = engines
        self._rediscover_s = rediscover_s
        self._timeout = timeout_s
        self._clock, self._monotonic = clock, monotonic
        self._found_at = -float("inf")
        self.engines: dict[str, list[int]] = {}
        self._scrapers: dict[str, EngineScraper] = {}
        self._failing: dict[str, str] = {}

    def scrape(self) -> Scrape:
        scrape = Scrape()
        if self._monotonic() - self._found_at >= self._rediscover_s:
            self._rediscover(scrape)
        for url, gpus in self.engines.items():
            scraper = self._scrapers[url]
            try:
                values = scraper.scrape()
            except Exception as exc:  # one engine's fault is its own: the others are still read
                error = str(exc) if isinstance(exc, (OSError, ExpositionError)) else f"{url}: {type(exc).__name__}: {exc}"
                scrape.count_error(f"serving metrics: {error}"[:300])
                if self._failing.get(url) != error:        # logged when it starts or changes, not every tick
                    log.warning("serving engine's metrics not read", url=url, error=error[:300])
                self._failing[url] = error
                continue
            if self._failing.pop(url, None) is not None:
                log.info("serving engine's metrics read again", url=url)
            if values:
                t = scraper.last.t
                scrape.samples.extend(GpuSample(g, t, dict(values)) for g in gpus)
        return scrape

    def _rediscover(self, scrape: Scrape) -> None:
        self._found_at = self._monotonic()
        try:
            found: dict[str, set[int]] = {}
            for url, gpus in self._engines_of():
                found.setdefault(url.rstrip("/"), set()).update(gpus)
        except Exception as exc:  # keep the engines known so far; try again next time
            scrape.count_error(f"serving discovery: {type(exc).__name__}: {exc}"[:300])
            return
        for url in set(self._scrapers) - set(found):
            self._scrapers.pop(url).close()
        for url in list(found):
            if url not in self._scrapers:
                try:
                    self._scrapers[url] = EngineScraper(url, self._timeout, self._clock)
                except ValueError as exc:      # one unusable address costs only itself
                    scrape.count_error(f"serving metrics: {exc}"[:300])
                    del found[url]
        self.engines = {url: sorted(g) for url, g in sorted(found.items())}

    def close(self) -> None:
        for s in self._scrapers.values():
            s.close()
        self._scrapers.clear()
