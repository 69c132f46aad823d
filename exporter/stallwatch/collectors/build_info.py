"""Build collector: which stallwatch version answers."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from stallwatch import __version__
from stallwatch.collectors.base import Registration
from stallwatch.collectors.catalog import family
from stallwatch.config import CollectorSettings


class BuildInfoCollector:
    def collect(self) -> Iterator[Metric]:
        build = family("build_info")
        build.add_metric([__version__], 1.0)
        yield build


COLLECTOR = Registration("build_info", CollectorSettings, lambda runtime, _: BuildInfoCollector(),
                         "stallwatch's own version")
