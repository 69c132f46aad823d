"""Ollama's `ollama serve`, strings as in ollama/ollama at fb307609 (2026-08-21; `server/routes.go`, `server/sched.go`,
`llm/llama_server.go`, `envconfig/config.go`) and, for the runner before 2026-05-29, at f63eea3d (2026-05-24,
`llm/server.go`); host 127.0.0.1, port 11434, or the address in its `OLLAMA_HOST` (`envconfig/config.go:20-59`).

Ollama starts a runner per loaded model and ends it after `OLLAMA_KEEP_ALIVE` (5 minutes idle,
`envconfig/config.go:126-144`): upstream `llama-server --model <blob> --port <random> --host 127.0.0.1 --no-webui
--offline ...` since 9db4bdba (2026-05-29, `llm/llama_server.go:336-378`), `ollama runner [--ollama-engine] --model
<blob> --port N` before (`llm/server.go@f63eea3:357-363`). A runner is the role `runner` in the server's tree, never
a server of its own (discovery drops a match inside a watched server's tree), so a load and an unload add no server
and raise nothing.

The phase is the server's: `serving` from the API's listen line on, but for its model loads. A load (`starting
llama-server cmd=...` `:433`; `starting runner` before) is `loading_weights` until its ready line (`llama-server
started in N seconds` `:1362`; `llama runner started in` before) or the scheduler's `Load failed` (`server/sched.go:
641`, for a timeout, a runner that died and a client that gave up, `... to start: context canceled`) moves it back to
`serving`; the probe of `/` does not end it (`Rule.model_load`). So a load that stalls with its runner holding GPU
memory reads as one (InferenceServerLoadedButIdle: never serving for its idle window), while loads that finish and
unloads (no line) leave the server serving. The lines in between (`loading model via llama-server` `:1048`, `waiting
for llama-server to start responding` `:1295`) are progress, like every line that is not a heartbeat. A load that
fails is one model's failure while the server goes on serving the others: a `fatal` event (the
InferenceServerFatalLogEvents ticket) that is the runner's (`Rule.runner`), never the `failed` phase
(InferenceServerFailed) nor a failed launch when the server later exits.

`/api/ps` (`server/routes.go:2271` `PsHandler`, `api/types.go:817-844` `ProcessResponse`): `{"models": [{"name":
"llama3.2:latest", "size": ..., "size_vram": 2364475392, "expires_at": ..., ...}]}`, the models loaded now and the
bytes of GPU memory each holds, fetched with the engine pages (`signals/loaded_models.py`)."""

import re

from stallwatch.engines.base import Engine, LoadedModels, RunnerLoops, heartbeats, rule
from stallwatch.engines.llamacpp import POLLED as LLAMACPP_POLLED

ENGINE = Engine(
    name="ollama",
    program=re.compile(r"(?:\S*/)?ollama serve\b"),
    default_port=11434,
    port_flags=(),
    host_flags=(),
    address_env="OLLAMA_HOST",
    # `server/routes.go:1877-1878`: `GET /` and `HEAD /` answer `Ollama is running` with 200 whatever the runners do:
    # a liveness check of the API process only.
    health_path="/",
    # The runner: upstream llama-server, `ollama runner`, and `ollama_llama_server` (2024-2025).
    role_title=re.compile(r"(?:^|/)(?P<runner>llama-server|ollama runner|ollama_llama_server)(?:\s|$)"),
    loaded_models=LoadedModels(path="/api/ps", list_key="models", name_key="name", memory_key="size_vram"),
    # A runner's main loop: a generation that hangs in it (a stuck kernel, a frozen loop) leaves `/` at 200 and the
    # log quiet; the runner's `/slots` (on by default, `tools/server/server.cpp` `handle_slots` posts a
    # SERVER_TASK_TYPE_METRICS task and waits) then times out: stallwatch_engine_loop_up 0 for the server, which
    # InferenceServerEngineLoopStuck reads as it does for llama.cpp. Ollama's runners before 2026-05-29 (`ollama
    # runner`) serve no such page: their fetch fails with a status, which says nothing of the loop.
    runner_loops=RunnerLoops(role="runner", path="/slots"),
    # `ollama serve` logs nothing as it stops: SIGINT and SIGTERM close its HTTP server and end its runners
    # (`server/routes.go:2021-2030`, no line), so a server gone without a failure in its log stopped on request (no
    # InferenceServerDown; a configured one still raises it). One killed outright (the OOM killer) reads the same;
    # one that dies of its own says so first (Go's runtime, the rule below).
    exit_is_stop=True,
    # gin's access log (`gin.Default()`, `server/routes.go:1869`; gin-gonic/gin `logger.go` `defaultLogFormatter`:
    # `[GIN] 2026/11/20 - 09:14:02 | 200 |  62.5µs |  127.0.0.1 | GET      "/"`) writes a line per request: those of
    # the pages a monitor polls (stallwatch's own probe of `/`, `/api/version`, `/api/ps`, `/api/tags`, routes.go:1877-
    # 1907) are heartbeats; a finished generation (`POST "/api/chat"`) is progress.
    # Ollama writes its runners' stdout and stderr into its own log (`llm/llama_server.go:420-433`): their lines of a
    # fetch of `/slots` that timed out (`stop: cancel task`) are heartbeats too.
    heartbeats=heartbeats(r'\[GIN\] .*\| (?:GET|HEAD) +"/(?:api/(?:version|ps|tags))?"', *LLAMACPP_POLLED),
    rules=(
        # Go's runtime as Ollama dies: an unrecovered panic (`runtime/panic.go` `printpanics`: `panic: ` at a line's
        # start, then every goroutine's stack) or a fatal error (`throw`: `fatal error: `, e.g. `concurrent map
        # writes`). The server's own since 2026-05-29, when its runners became llama.cpp's C++ `llama-server`; before,
        # a Go runner (`ollama runner`) panicked into the same log, and a server stopped after that reads failed (a
        # ticket rather than silence).
        rule(r"^(?:panic: |fatal error: )", event="fatal"),
        # `Serve`'s first line (`server/routes.go:1951`): `msg="server config" env="map[...]"`.
        rule(r'msg="server config"', phase="launching", launch=True),
        # `server/routes.go:2008`: `msg="Listening on 127.0.0.1:11434 (version 0.30.1)"`.
        rule(r'msg="Listening on \S+ \(version ', phase="serving"),
        # A model's load (`llm/llama_server.go:433`, `llm/server.go@f63eea3:433`), to its ready line (`:1362`,
        # `llm/server.go@f63eea3:619`) or the scheduler's `msg="Load failed" model=... error=...`
        # (`server/sched.go:641`). Only a runner given a model (`--model` only for one, `llm/server.go@f63eea3:
        # 361-363`): before 2026-05-29 the GPU discovery at every start (`discover/runner.go@f63eea3:497`,
        # `StartRunner(true, "", ...)`) logs the same `starting runner` for `ollama runner --ollama-engine --port N`,
        # which loads nothing and prints no ready line. From 2024 to 2025-05 the line was `msg="starting llama
        # server" cmd="/usr/lib/ollama/runners/cuda_v12/ollama_llama_server --model ...` (`llm/server.go`).
        rule(r'msg="starting (?:llama-server|llama server|runner)" cmd=[^\n]*? --model ', phase="loading_weights",
             model_load=True),
        rule(r'msg="(?:llama-server|llama runner) started in |msg="Load failed"', phase="serving"),
        # A load that Ollama gave up on after `OLLAMA_LOAD_TIMEOUT` without load activity (5 minutes,
        # `envconfig/config.go:146-164`), logged by the scheduler as `msg="Load failed" ... error="timed out waiting
        # for llama-server to start - ..."` (`server/sched.go:641`, `llm/llama_server.go:1336`; `llama runner` and
        # `error loading llama server` before: `llm/server.go@f63eea3:1413`, `server/sched.go@f63eea3:567`). A client
        # that gives up mid-load ends it with `... to start: context canceled` (`llm/llama_server.go:1302`): no
        # failure.
        rule(r"timed out waiting for (?:llama-server|llama runner) to start - ", event="fatal", runner=True),
        # A runner that exits while loading (`llm/llama_server.go:1306-1325`, `llm/server.go@f63eea3:1396-1404`) and
        # one that exits with an error message captured from its output, loading or serving (`llm/llama_server.go:
        # 1023` `msg="llama-server terminated" error=... exit=...`, `llm/server.go@f63eea3:316`). A runner ended
        # after its keep-alive is killed with its last error cleared on ready (`:1360`, `:2575-2590`): no line.
        rule(r'(?:llama-server|llama runner) process has terminated|msg="(?:llama-server|llama runner) terminated"',
             event="fatal", runner=True),
    ),
)
