"""The models an engine has loaded and the GPU memory each holds, from a JSON page of its own (`Engine.loaded_models`:
Ollama's `/api/ps`), fetched by the engine page loop (`signals.engine_page`) as its metrics page is: in the
background, within one deadline, at the health probe's address, and a derived address only while the server's own
tree listens on the port. Bounded: at most MAX_BODY_BYTES of the page and MAX_MODELS models are read; a larger page
or more models count as a failed fetch (no figures), never as a series more."""

from __future__ import annotations

import json
import math

from stallwatch.discovery.server import Server
from stallwatch.engines.base import LoadedModels
from stallwatch.signals.page_address import page_url
from stallwatch.signals.probes import fetch
from stallwatch.text import display

MAX_BODY_BYTES = 1 << 20  # a model's entry is a few hundred bytes
MAX_MODELS = 64  # Ollama keeps as many as OLLAMA_MAX_LOADED_MODELS (3 per GPU by default)
MAX_NAME = 200  # characters of a model's name kept in its label


def parse_models(body: bytes, spec: LoadedModels) -> dict[str, float]:
    """Bytes of GPU memory by model name from the page; ValueError when it is not such a page, a model has no name
    or no finite size, or there are more than MAX_MODELS. Two entries of one name add up."""
    try:
        page = json.loads(body)
    except ValueError as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    models = page.get(spec.list_key) if isinstance(page, dict) else None
    if not isinstance(models, list):
        raise ValueError(f"no list at {spec.list_key!r}")
    if len(models) > MAX_MODELS:
        raise ValueError(f"more than {MAX_MODELS} models")
    out: dict[str, float] = {}
    for model in models:
        name = model.get(spec.name_key) if isinstance(model, dict) else None
        memory = model.get(spec.memory_key) if isinstance(model, dict) else None
        if not isinstance(name, str) or not name:
            raise ValueError(f"a model without a {spec.name_key!r}")
        if isinstance(memory, bool) or not isinstance(memory, int | float) or not math.isfinite(memory):
            raise ValueError(f"{name!r} without a number at {spec.memory_key!r}")
        label = display(name)[:MAX_NAME]
        out[label] = out.get(label, 0.0) + float(memory)
    return out


def read_models(server: Server, timeout: float) -> tuple[dict[str, float] | None, str]:
    """One fetch of the server's loaded-models page: bytes by model (None: not fetched or failed) and what went
    wrong ("" when nothing did)."""
    spec = server.engine.loaded_models
    found = page_url(server, spec.path) if spec is not None else None
    if spec is None or found is None:
        return None, ""
    url, derived = found
    if derived and not server.own_listeners():
        return None, ""  # not up yet (or gone), as for the metrics page
    result, body = fetch(url, timeout, MAX_BODY_BYTES)
    if not result.success:
        return None, f"GET {url}: {result.reason} (HTTP {result.status})"
    if body is None:
        return None, f"GET {url}: the page is over {MAX_BODY_BYTES} bytes"
    try:
        return parse_models(body, spec), ""
    except ValueError as exc:
        return None, f"GET {url}: {exc}"
