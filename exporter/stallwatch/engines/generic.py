"""An engine stallwatch knows nothing about: its process matcher and log patterns come from config."""

from stallwatch.engines.base import Engine

ENGINE = Engine(name="generic", program=None, default_port=None)
