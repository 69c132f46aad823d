"""An engine's listen address: its flags, then its environment (`Engine.address_env`), then its defaults."""

from __future__ import annotations

import pytest

from stallwatch.engines import ENGINES


@pytest.mark.parametrize(("value", "address"), [
    ("", ("127.0.0.1", 11434)),
    ("0.0.0.0", ("0.0.0.0", 11434)),
    ("0.0.0.0:8000", ("0.0.0.0", 8000)),
    (":7000", ("127.0.0.1", 7000)),
    ("http://0.0.0.0", ("0.0.0.0", 80)),  # Ollama's `envconfig/config.go:33-34`: a scheme's own default port
    ("https://ollama.example", ("ollama.example", 443)),
    ("http://127.0.0.1:9000/ollama", ("127.0.0.1", 9000)),
    ("[::1]:8001", ("::1", 8001)),
    ("::1", ("::1", 11434)),
    ("[::1]", ("::1", 11434)),
    ("0.0.0.0:99999", ("0.0.0.0", 11434)),
    ("localhost:port", ("localhost", 11434)),
])
def test_ollamas_address_is_its_ollama_host(value: str, address: tuple[str, int]) -> None:
    assert ENGINES["ollama"].listen_address(("/usr/bin/ollama", "serve"), {"OLLAMA_HOST": value}) == address


def test_an_engine_without_address_env_reads_no_environment() -> None:
    llamacpp = ENGINES["llamacpp"]
    assert llamacpp.address_env is None
    assert llamacpp.listen_address(("llama-server", "--port", "8081"), {"OLLAMA_HOST": "0.0.0.0:8000"}) == (
        "127.0.0.1", 8081)
