"""NVLink per link, from NVML, at the slow cadence: which links are up, the
busiest link's load against its peak, and the links' errors.

A GPU's NVLink total (fields 138/139 over all links, the fast path) hides a
single link doing all the work, or a link that is down: collectives that
should spread over 18 links then queue on the ones left. Per link:
- state: nvmlDeviceGetNvLinkState (NotSupported on every link of a GPU
  without NVLink, as the bundled H200 recording's says: then never asked again);
- data: fields 138/139 (THROUGHPUT_DATA_TX/RX, KiB) with the link as scope,
  a rate between two slow readings;
- errors: nvmlDeviceGetNvLinkErrorCounter's replay, recovery, CRC-flit and
  CRC-data counters, summed over the links (a counter: rising means a
  flaky link).
The peak per link and direction comes from the link's version
(nvmlDeviceGetNvLinkVersion): 25 GB/s for NVLink 2-4 (V100, A100, H100,
H200), 50 GB/s for NVLink 5 (B200); another version gives no ratio.
"""
from __future__ import annotations

from typing import Callable

MAX_LINKS = 18
PEAK_BYTES_PER_S = {2: 25e9, 3: 25e9, 4: 25e9, 5: 50e9}      # per link and direction
ERROR_COUNTERS = (0, 1, 2, 3)      # NVML_NVLINK_ERROR_DL_REPLAY, _RECOVERY, _CRC_FLIT, _CRC_DATA
KIB = 1024.0


class NvLinks:
    """One GPU's links, read again at every slow scrape (a link that drops
    shows at the next one). `rows`: unpacks a field-values array."""

    def __init__(self, nvml, handle, rows: Callable):
        self.nvml, self.handle, self.rows = nvml, handle, rows
        self.call: Callable = lambda key, fn, *args: None
        self.links: list[int] | None = None          # None: not read yet
        self.supported = False                       # the driver answered for link 0
        self.peak: float | None = None
        self._last: tuple[float, dict[int, tuple[float, float]]] | None = None

    def discover(self) -> list[int]:
        links = []
        for link in range(MAX_LINKS):
            state = self.call(f"nvlink_state{link}", self.nvml.nvmlDeviceGetNvLinkState, self.handle, link)
            if state is None and link == 0:
                break                                # no NVLink on this GPU: asked once
            self.supported = True
            if state == 1:                           # NVML_FEATURE_ENABLED
                links.append(link)
        if links:
            version = self.call("nvlink_version", self.nvml.nvmlDeviceGetNvLinkVersion, self.handle, links[0])
            self.peak = PEAK_BYTES_PER_S.get(version)
        self.links = links
        return links

    def read(self, t: float, values: dict[str, float], call: Callable) -> None:
        """`call(key, fn, *args)`: the device's NVML choke point (None when
        not available, the key remembered as unsupported)."""
        self.call = call
        links = self.discover()
        if not self.supported:
            return                                   # no NVLink: nothing to say, not zero links
        values["nvlink_links_active"] = float(len(links))
        if not links:
            return
        req = [(f, link) for link in links for f in (138, 139)]
        out = self.call("nvlink_link_fields", self.nvml.nvmlDeviceGetFieldValues, self.handle, req)
        now: dict[int, tuple[float, float]] = {}
        if out is not None:
            rows = self.rows(out)
            for i, link in enumerate(links):
                (rt, tx), (rr, rx) = rows[2 * i], rows[2 * i + 1]
                if rt == 0 and rr == 0 and tx is not None and rx is not None:
                    now[link] = (tx * KIB, rx * KIB)
        last, self._last = self._last, (t, now)
        if last is not None and t > last[0] and self.peak:
            rates = [max(now[k][0] - last[1][k][0], now[k][1] - last[1][k][1]) / (t - last[0])
                     for k in now if k in last[1] and now[k][0] >= last[1][k][0] and now[k][1] >= last[1][k][1]]
            if rates:
                values["nvlink_link_max_util_ratio"] = min(max(rates) / self.peak, 1.5)
        errors = 0.0
        for link in links:
            for counter in ERROR_COUNTERS:
                v = self.call(f"nvlink_errors{counter}", self.nvml.nvmlDeviceGetNvLinkErrorCounter, self.handle,
                              link, counter)
                if v is None:
                    break
                errors += v
            else:
                continue
            return                                    # a counter the driver does not keep: no total at all
        values["nvlink_errors_total"] = errors
