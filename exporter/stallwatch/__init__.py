"""stallwatch: a Prometheus exporter that catches silent stalls of LLM inference servers."""

__version__ = "0.1.0"
