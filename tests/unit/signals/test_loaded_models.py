"""An engine's page of its loaded models (Ollama's `/api/ps`, `api/types.go:817-844` at fb307609) read as bytes of
GPU memory per model, within bounds: a page that is not one, or lists more models than a server can hold, is no
figures."""

from __future__ import annotations

import json

import pytest

from stallwatch.engines import ENGINES
from stallwatch.signals.loaded_models import MAX_MODELS, parse_models

SPEC = ENGINES["ollama"].loaded_models
# The shape of `PsHandler`'s answer (`server/routes.go:2271-2300`).
PS = {"models": [
    {"name": "llama3.2:latest", "model": "llama3.2:latest", "size": 3155590144, "digest": "a80c4f17acd5",
     "details": {"parent_model": "", "format": "gguf", "family": "llama", "parameter_size": "3.2B",
                 "quantization_level": "Q4_K_M"}, "expires_at": "2026-11-20T09:19:02.123456789Z",
     "size_vram": 3155590144, "context_length": 4096},
    {"name": "qwen3:32b", "model": "qwen3:32b", "size": 25119906816, "digest": "030ee887880f",
     "expires_at": "2026-11-20T09:20:11Z", "size_vram": 20971520000, "context_length": 8192},
]}


def test_each_loaded_model_is_its_gpu_memory() -> None:
    assert SPEC is not None and SPEC.path == "/api/ps"
    assert parse_models(json.dumps(PS).encode(), SPEC) == {"llama3.2:latest": 3155590144.0,
                                                          "qwen3:32b": 20971520000.0}


def test_no_model_loaded_is_no_series() -> None:
    assert SPEC is not None
    assert parse_models(b'{"models":[]}', SPEC) == {}


@pytest.mark.parametrize(("body", "why"), [
    (b"Ollama is running", "not JSON"),
    (b'{"error":"unauthorized"}', "no list"),
    (b'[{"name": "m"}]', "no list"),
    (b'{"models":[{"size_vram": 5}]}', "without a 'name'"),
    (b'{"models":[{"name": "m", "size_vram": "5"}]}', "without a number"),
    (b'{"models":[{"name": "m", "size_vram": true}]}', "without a number"),
    (b'{"models":[{"name": "m", "size_vram": 1e999}]}', "without a number"),
    (json.dumps({"models": [{"name": f"m{i}", "size_vram": 1} for i in range(MAX_MODELS + 1)]}).encode(),
     "more than"),
])
def test_a_page_that_is_not_one_is_no_figures(body: bytes, why: str) -> None:
    assert SPEC is not None
    with pytest.raises(ValueError, match=why):
        parse_models(body, SPEC)


def test_a_name_is_made_safe_and_bounded() -> None:
    assert SPEC is not None
    body = json.dumps({"models": [{"name": "\ud800x" + "y" * 300, "size_vram": 1}]}).encode()
    [name] = parse_models(body, SPEC)
    assert name.startswith("\\ud800x") and len(name) == 200
