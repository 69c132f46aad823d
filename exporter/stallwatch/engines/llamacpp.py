"""llama.cpp `llama-server`, strings as in ggml-org/llama.cpp `tools/server/server.cpp` and `server-http.cpp`
(aa6192d3): host 127.0.0.1, port 8080."""

import re

from stallwatch.engines.base import Engine, MetricsSpec, rule

ENGINE = Engine(
    name="llamacpp",
    cmdline=re.compile(r"(?:^|/)llama-server(?:\s|$)"),
    default_port=8080,
    model_flags=("--model", "-m", "--hf-repo", "-hf"),
    # ggml-org/llama.cpp `tools/server/server.cpp` metrics handler, only with `--metrics`: it posts a task to the main
    # loop and waits for it, so a hanging `/metrics` is itself the sign of a stuck decode loop.
    metrics=MetricsSpec(running="llamacpp:requests_processing", waiting="llamacpp:requests_deferred",
                        tokens="llamacpp:tokens_predicted_total", needs_flag=("--metrics",)),
    rules=(
        rule(r"^build: \d+", phase="launching", launch=True),
        rule(r"main: loading model|load_model: loading model|llama_model_loader: ", phase="loading_weights"),
        rule(r"llama_kv_cache|llama_context: ", phase="allocating_memory"),
        rule(r"main: model loaded|warming up the model", phase="warming_up"),
        rule(r"main: server is listening on|starting the main loop|all slots are idle", phase="serving"),
        rule(r"main: exiting due to|couldn't bind HTTP server socket", phase="failed", event="fatal"),
        # A stop: the signal handler's `cleaning up before exit...` (`tools/server/server.cpp`, spelled
        # `operator()` or `operator ()` by the compiler), and a second SIGINT's `Received second interrupt`.
        rule(r"cleaning up before exit|Received second interrupt, terminating immediately", stop=True),
    ),
)
