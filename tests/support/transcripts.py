"""Engine log transcripts built from the engines' real strings (sources cited in exporter/stallwatch/engines/).

Each function returns the bytes an engine writes to its stdout/stderr for one scenario, with the real
prefixes (SGLang `[date TPn]`, vLLM `(EngineCore pid=N) INFO MM-DD ...`), interleaved TP ranks and tqdm
progress bars that rewrite one line with `\\r`.
"""

from __future__ import annotations

from collections.abc import Iterable

from support.paths import ROOT

SG_DAY = "2026-11-20"
REAL_LOGS = ROOT / "tests" / "fixtures" / "logs"  # excerpts of published logs, sources in SOURCES.md there


def real(name: str) -> str:
    """A published log excerpt from tests/fixtures/logs (its source in SOURCES.md)."""
    return (REAL_LOGS / name).read_bytes().decode()  # not read_text(): it would turn tqdm's `\r` into `\n`


def _sg(clock: str, message: str, rank: int | None = None) -> str:
    prefix = f" TP{rank}" if rank is not None else ""
    return f"[{SG_DAY} {clock}{prefix}] {message}\n"


def _sg_all(clock: str, message: str, tp: int) -> str:
    return "".join(_sg(clock, message, rank) for rank in range(tp))


def _tqdm(desc: str, total: int, unit_rate: str = "5.01s/it", newline_each: bool = False) -> str:
    """A tqdm bar in SGLang/vLLM's `{desc}: {pct}% Completed | n/N [...]` format."""
    parts = []
    for n in range(total + 1):
        pct = round(100 * n / total)
        bar = f"{desc}: {pct:3d}% Completed | {n}/{total} [00:{n:02d}<00:00, {unit_rate}]"
        parts.append(bar + "\n" if newline_each else "\r" + bar)
    return "".join(parts) + ("" if newline_each else "\n")


def sglang_until_shards(tp: int = 8, shards: int = 64, draft: bool = True) -> str:
    """SGLang 0.5.x TP=8 with EAGLE3: launch to the last weight shard (the seed stall ends here)."""
    args = ("server_args=ServerArgs(model_path='moonshotai/Kimi-K2-Instruct', tokenizer_path='moonshotai/"
            f"Kimi-K2-Instruct', tp_size={tp}, port=30000, host='127.0.0.1', mem_fraction_static=0.85, "
            "speculative_algorithm='EAGLE3', speculative_draft_model_path='lmsys/Kimi-K2-EAGLE3', "
            "speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4)")
    return (
        _sg("09:14:02", args)
        + _sg_all("09:14:09", "Init parallel begin.", tp)
        + _sg_all("09:14:12", "Init parallel ends. elapsed=2.91 s", tp)
        + _sg("09:14:12", "Memory baseline taken. mem usage=0.62 GB", 0)
        + _sg("09:14:13", f"NCCL/RCCL/HCCL warmup completed in 0.412s (tp_size={tp}, pp_size=1, ep_size=1)", 0)
        + _sg_all("09:14:13", "Load weight begin. avail mem=78.54 GB", tp)
        + _tqdm("Loading safetensors checkpoint shards", shards)
    )


def sglang_after_shards(tp: int = 8) -> str:
    """What a healthy SGLang prints after the shards: KV cache, graph capture, draft model, ready."""
    out = _sg_all("09:19:41", "Load weight end. elapsed=328.02 s, type=DeepseekV3ForCausalLM, "
                  "quant=fp8, avail mem=2.61 GB, mem usage=75.93 GB.", tp)
    out += _sg_all("09:19:44", "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 131072, "
                   "KV size: 0.92 GB", tp)
    out += _sg("09:19:44", "Memory pool end. avail mem=1.62 GB", 0)
    out += _sg("09:19:45", "Capture target decode CUDA graph begin. backend=flashinfer, num_tokens_per_req=4, "
               "avail mem=1.58 GB", 0)
    out += "\r".join(f"Capturing batches (bs={bs} avail_mem=1.41 GB): {p:3d}%|█| {i}/4 [00:0{i}<00:00]"
                     for i, (bs, p) in enumerate([(8, 0), (4, 25), (2, 50), (1, 100)])) + "\n"
    out += _sg("09:20:31", "Capture target decode CUDA graph end. bs=[1, 2, 4, 8], elapsed=46.10 s, "
               "mem usage=0.21 GB, avail mem=1.37 GB.", 0)
    out += _sg_all("09:20:32", "Load weight begin. avail mem=1.37 GB", tp)
    out += _sg_all("09:20:35", "Load weight end. elapsed=3.11 s, type=LlamaForCausalLMEagle3, "
                   "avail mem=0.98 GB, mem usage=0.39 GB.", tp)
    out += _sg("09:20:35", "Capture draft decode CUDA graph begin. backend=flashinfer, num_tokens_per_req=1, "
               "bs=[1, 2, 4, 8], avail mem=0.98 GB", 0)
    out += _sg("09:20:52", "Capture draft decode CUDA graph end. elapsed=17.02 s, mem usage=0.08 GB, "
               "avail mem=0.90 GB.", 0)
    out += _sg("09:20:53", "max_total_num_tokens=131072, chunked_prefill_size=8192, max_prefill_tokens=16384, "
               "max_running_requests=48, context_len=131072, available_gpu_mem=0.90 GB", 0)
    out += _sg("09:20:54", "INFO:     Started server process [889167]")
    out += _sg("09:20:54", "INFO:     Waiting for application startup.")
    out += _sg("09:20:54", "INFO:     Application startup complete.")
    out += _sg("09:20:54", "INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)")
    out += _sg("09:20:55", "INFO:     127.0.0.1:40112 - \"GET /model_info HTTP/1.1\" 200 OK")
    out += _sg("09:20:56", "Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00, "
               "#running-req: 0, #queue-req: 0, #pending-token: 0", 0)
    out += _sg("09:20:57", "INFO:     127.0.0.1:40112 - \"POST /generate HTTP/1.1\" 200 OK")
    out += _sg("09:20:57", "The server is fired up and ready to roll!")
    return out


def sglang_until_capture(tp: int = 8) -> str:
    """Launch to the first decode graph capture's begin line: where a capture that hangs in a collective ends."""
    after = sglang_after_shards(tp)
    end = after.index("\n", after.index("Capture target decode CUDA graph begin")) + 1
    return sglang_until_shards(tp) + after[:end]


def sglang_decode(count: int, start_second: int = 0) -> Iterable[str]:
    """Steady-state `Decode batch` lines, as a busy server prints them every 40 steps."""
    for i in range(count):
        s = start_second + i
        yield _sg(f"10:{(s // 60) % 60:02d}:{s % 60:02d}",
                  f"Decode batch, #running-req: {i % 48 + 1}, #token: {1024 + i % 4096}, token usage: 0.03, "
                  "accept len: 2.71, cuda graph: True, gen throughput (token/s): 1873.44, #queue-req: 0", 0)


def sglang_healthy(tp: int = 8) -> str:
    return sglang_until_shards(tp) + sglang_after_shards(tp)


def sglang_head_waiting(tp: int = 8) -> str:
    """Node 0 of a deployment whose other node never joins (sglang #2658, #3467, #7478): its launch, then every
    rank waits in torch's store at the rendezvous and nothing more is logged (for 30 minutes)."""
    out = sglang_until_shards(tp)
    return out[:out.index("Init parallel ends.")].rsplit("\n", 1)[0] + "\n"


def sglang_worker_node(ranks: range) -> str:
    """A node with rank >= 1 holding the global TP ranks `ranks`: the strings of the real node-1 log
    (`tests/fixtures/logs/sglang-worker-node.log`) for each local rank, then the dummy health server; nothing after,
    even under load (only TP rank 0 logs batches)."""
    def each(clock: str, message: str) -> str:
        return "".join(_sg(clock, message, rank) for rank in ranks)
    return (_sg("15:54:03", f"server_args=ServerArgs(model_path='moonshotai/Kimi-K2-Instruct', host='0.0.0.0', "
                            f"port=30000, tp_size={2 * len(ranks)}, dist_init_addr='198.18.0.2:20000', nnodes=2, "
                            "node_rank=1)")
            + each("15:54:13", "Init torch distributed begin.")
            + f"[Gloo] Rank {ranks[0]} is connected to {2 * len(ranks) - 1} peer ranks. Expected number of connected "
              f"peer ranks is : {2 * len(ranks) - 1}\n"
            + each("15:54:28", "CustomAllreduce is disabled because this process group spans across nodes.")
            + each("15:54:28", "Init torch distributed ends. elapsed=13.84 s, mem usage=1.23 GB")
            + each("15:54:29", "Load weight begin. avail mem=93.17 GB")
            + each("15:54:31", "Load weight end. elapsed=2.04 s, type=DeepseekV3ForCausalLM, avail mem=16.65 GB, "
                               "mem usage=76.52 GB.")
            + each("15:54:33", "KV Cache is allocated. #tokens: 1642588, K size: 3.33 GB, V size: 3.33 GB")
            + each("15:54:33", "Capture cuda graph begin. This can take up to several minutes. avail mem=3.70 GB")
            + each("15:55:34", "Capture piecewise CUDA graph end. Time elapsed: 39.87 s. mem usage=0.92 GB. "
                               "avail mem=2.46 GB.")
            + _sg("15:55:35", "Dummy health check server started in background thread at 0.0.0.0:30000"))


def vllm_headless_dp(rank: int, head: str) -> str:
    """vLLM 0.33 `--headless --data-parallel-start-rank N`: no API server; its engine core and worker load, size the
    KV cache, capture graphs and wait for the head's DP coordinator (`entrypoints/cli/serve.py:240`,
    `v1/engine/core.py`); nothing is logged while it serves (the stats line is the front-end's)."""
    core = f"EngineCore_DP{rank}"
    out = f"INFO 11-20 09:00:01 [serve.py:240] Launching 1 data parallel engine(s) in headless mode, with head node " \
          f"address {head}.\n"
    out += _vl(core, 7101, "09:00:09", "core.py:140",
               "Initializing a V1 LLM engine (v0.33.0) with config: model='meta-llama/Llama-3.1-70B-Instruct'")
    out += _vl(core, 7101, "09:00:16", "gpu_model_runner.py:4979",
               "Starting to load model meta-llama/Llama-3.1-70B-Instruct...")
    out += _tqdm("Loading safetensors checkpoint shards", 30, "1.77it/s", newline_each=True)
    out += _vl(core, 7101, "09:01:02", "default_loader.py:507", "Loading weights took 45.12 seconds")
    out += _vl(core, 7101, "09:01:03", "gpu_model_runner.py:5089",
               "Model loading took 65.7 GiB memory and 46.331203 seconds")
    out += _vl(core, 7101, "09:01:40", "gpu_worker.py:773", "Available KV cache memory: 6.21 GiB")
    out += _vl(core, 7101, "09:01:40", "kv_cache_utils.py:1148",
               "GPU KV cache size: 40,688 tokens, Maximum concurrency for 131,072 tokens per request: 0.31x")
    out += _vl(core, 7101, "09:02:12", "gpu_model_runner.py:6517", "Graph capturing finished in 31 secs, took 0.74 GiB")
    out += _vl(core, 7101, "09:02:13", "core.py:413",
               "init engine (profile, create kv cache, warmup model) took 57.33 s (compilation: 11.02 s)")
    out += _vl(core, 7101, "09:02:13", "core.py:1285", "Waiting for READY message from DP Coordinator...")
    return out


def sglang_graph_crash(tp: int = 8) -> str:
    """CUDA graph capture fails with OOM; the scheduler dies and the launcher gives up."""
    out = sglang_until_shards(tp)
    out += _sg_all("09:19:41", "Load weight end. elapsed=328.02 s, type=DeepseekV3ForCausalLM, "
                   "avail mem=2.61 GB, mem usage=75.93 GB.", tp)
    out += _sg("09:19:45", "Capture cuda graph begin. This can take up to several minutes. avail mem=2.98 GB", 0)
    out += _sg("09:19:52", "Scheduler hit an exception: Traceback (most recent call last):", 3)
    out += "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a " \
           "total capacity of 79.10 GiB of which 1.12 GiB is free.\n"
    out += _sg("09:19:52", "Received sigquit from a child process. It usually means the child failed.")
    return out


def sglang_nccl_timeout(tp: int = 8) -> str:
    """Serving, then a collective hangs and the NCCL watchdog takes the rank down."""
    out = sglang_healthy(tp) + "".join(sglang_decode(5))
    out += ("[rank4]:[E1120 10:31:22.426415540 ProcessGroupNCCL.cpp:629] [Rank 4] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=151721, OpType=ALLREDUCE, NumelIn=131072000, "
            "NumelOut=131072000, Timeout(ms)=600000) ran for 600081 milliseconds before timing out.\n")
    out += ("[rank4]:[E1120 10:31:22.427001231 ProcessGroupNCCL.cpp:2168] [PG ID 2 PG GUID 3 Rank 4] Exception "
            "(either an error or timeout) detected by watchdog at work: 151721, last enqueued NCCL work: 151721, "
            "last completed NCCL work: 151720.\n")
    out += "terminate called after throwing an instance of 'c10::DistBackendError'\n"
    return out


def _vl(proc: str, pid: int, clock: str, where: str, message: str, level: str = "INFO") -> str:
    return f"({proc} pid={pid}) {level} 11-20 {clock} [{where}] {message}\n"


def vllm_healthy(tp: int = 2) -> str:
    """vLLM 0.33, TP=2 (`mp` executor): API server, EngineCore and workers with their prefixes."""
    out = _vl("APIServer", 525681, "09:00:01", "startup.py:18",
              "vLLM server version 0.33.0, serving model meta-llama/Llama-3.1-70B-Instruct")
    out += _vl("APIServer", 525681, "09:00:01", "startup.py:96",
               "non-default args: {'model': 'meta-llama/Llama-3.1-70B-Instruct', 'tensor_parallel_size': 2}")
    out += _vl("EngineCore", 525790, "09:00:09", "core.py:140",
               "Initializing a V1 LLM engine (v0.33.0) with config: model='meta-llama/Llama-3.1-70B-Instruct'")
    for rank in range(tp):
        out += _vl(f"Worker_TP{rank}", 525800 + rank, "09:00:15", "pynccl.py:148", "vLLM is using nccl==2.27.3")
    for rank in range(tp):
        out += _vl(f"Worker_TP{rank}", 525800 + rank, "09:00:16", "gpu_model_runner.py:4979",
                   "Starting to load model meta-llama/Llama-3.1-70B-Instruct...")
    out += _tqdm("Loading safetensors checkpoint shards", 30, "1.77it/s", newline_each=True)
    for rank in range(tp):
        out += _vl(f"Worker_TP{rank}", 525800 + rank, "09:01:02", "default_loader.py:507",
                   "Loading weights took 45.12 seconds")
        out += _vl(f"Worker_TP{rank}", 525800 + rank, "09:01:03", "gpu_model_runner.py:5089",
                   "Model loading took 65.7 GiB memory and 46.331203 seconds")
    out += _vl("Worker_TP0", 525800, "09:01:21", "backends.py:1188", "Dynamo bytecode transform time: 11.02 s")
    out += _vl("Worker_TP0", 525800, "09:01:40", "gpu_worker.py:773", "Available KV cache memory: 6.21 GiB")
    out += _vl("EngineCore", 525790, "09:01:40", "kv_cache_utils.py:1148",
               "GPU KV cache size: 40,688 tokens, Maximum concurrency for 131,072 tokens per request: 0.31x")
    out += "".join(f"Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): {round(100 * n / 67):3d}%|█| "
                   f"{n}/67 [00:{n % 60:02d}<00:00, 3.05it/s]\n" for n in range(0, 68, 11))
    out += _vl("Worker_TP0", 525800, "09:02:12", "gpu_model_runner.py:6517",
               "Graph capturing finished in 31 secs, took 0.74 GiB")
    out += _vl("EngineCore", 525790, "09:02:13", "core.py:413",
               "init engine (profile, create kv cache, warmup model) took 57.33 s (compilation: 11.02 s)")
    out += _vl("APIServer", 525681, "09:02:14", "entry.py:135", "Supported tasks: ['generate']")
    out += _vl("APIServer", 525681, "09:02:14", "entry.py:139", "Starting vLLM server on http://0.0.0.0:8000")
    out += _vl("APIServer", 525681, "09:02:14", "launcher.py:188", "Available routes are:")
    out += _vl("APIServer", 525681, "09:02:14", "launcher.py:196", "Route: /health, Methods: GET")
    out += "(APIServer pid=525681) INFO:     Started server process [525681]\n"
    out += "(APIServer pid=525681) INFO:     Waiting for application startup.\n"
    out += "(APIServer pid=525681) INFO:     Application startup complete.\n"
    return out


def vllm_sigterm_stop() -> str:
    """SIGTERM to the API server: the launcher's shutdown, then uvicorn's (the corpus's
    `vllm-0.18.1-tp4-stop-mid-generation.log`)."""
    return (_vl("APIServer", 525681, "10:40:00", "launcher.py:137", "Shutting down FastAPI HTTP server.")
            + "(APIServer pid=525681) INFO:     Shutting down\n"
              "(APIServer pid=525681) INFO:     Waiting for application shutdown.\n"
              "(APIServer pid=525681) INFO:     Application shutdown complete.\n")


def vllm_shm_stall(tp: int = 2, repeats: int = 3) -> str:
    """Serving, then EngineCore's workers hang: the ring buffer warning every 60 s, requests stuck."""
    out = vllm_healthy(tp)
    out += _vllm_stats("09:05:02", 255, 0, 0.0)
    for minute in range(repeats):
        out += _vl("EngineCore", 525790, f"09:0{6 + minute}:02", "shm_broadcast.py:761",
                   "No available shared memory broadcast block found in 60 seconds. This typically happens when "
                   "some processes are hanging or doing some time-consuming work (e.g. compilation, weight/kv "
                   "cache quantization).")
    return out


def vllm_0_11_ansi() -> str:
    """vLLM 0.10-0.15 lines with `(EngineCore_DP0 ...)` and colour codes around the prefix."""
    return (
        "\x1b[1;36m(EngineCore_DP0 pid=279)\x1b[0;0m INFO 11-20 09:00:09 [core.py:96] Initializing a V1 LLM "
        "engine (v0.11.0) with config: model='Qwen/Qwen3-8B'\n"
        "\x1b[1;36m(EngineCore_DP0 pid=279)\x1b[0;0m INFO 11-20 09:00:12 [gpu_model_runner.py:2602] Starting "
        "to load model Qwen/Qwen3-8B...\n"
        "\x1b[1;36m(EngineCore_DP0 pid=279)\x1b[0;0m INFO 11-20 09:00:19 [default_loader.py:267] Loading "
        "weights took 6.10 seconds\n"
    )


def vllm_v0() -> str:
    """V0 (<= 0.7) format: no brackets around the file, `(VllmWorkerProcess pid=N)` workers."""
    return (
        "INFO 01-31 10:27:32 llm_engine.py:234] Initializing an LLM engine (v0.6.6) with config: model='x'\n"
        "(VllmWorkerProcess pid=1152873) INFO 01-31 10:27:40 model_runner.py:1094] Starting to load model x...\n"
        "INFO 01-31 10:28:12 model_runner.py:1099] Loading model weights took 7.1217 GB\n"
        "INFO 01-31 10:28:15 worker.py:241] Memory profiling takes 2.41 seconds\n"
        "INFO 01-31 10:28:20 model_runner.py:1415] Capturing cudagraphs for decoding. This may lead to "
        "unexpected consequences if the model is not static.\n"
    )


def _tgi(clock: str, target: str, message: str, level: str = "INFO") -> str:
    return f"2026-11-20T{clock}.170897Z  {level} {target}: {message}\n"


def _tgi_until_shards() -> str:
    out = _tgi("09:00:01", "text_generation_launcher", "Args { model_id: \"bigscience/bloom-560m\", "
               "num_shard: Some(2), port: 3000 }")
    out += _tgi("09:00:01", "download: text_generation_launcher",
                "Starting check and download process for bigscience/bloom-560m")
    out += _tgi("09:00:04", "download: text_generation_launcher",
                "Successfully downloaded weights for bigscience/bloom-560m")
    for rank in range(2):
        out += _tgi("09:00:04", "shard-manager: text_generation_launcher", f"Starting shard rank={rank}")
    return out


def _tgi_waiting(seconds: int, ready: set[int] | None = None) -> str:
    """The launcher's wait loop (`launcher/src/main.rs:1244`): every 10 s for each shard not ready yet."""
    out = ""
    for elapsed in range(10, seconds + 1, 10):
        at = 4 + elapsed  # seconds after 09:00:00
        clock = f"{9 + at // 3600:02d}:{at // 60 % 60:02d}:{at % 60:02d}"
        for rank in range(2):
            if rank not in (ready or set()):
                out += _tgi(clock, "shard-manager: text_generation_launcher",
                            f"Waiting for shard to be ready... rank={rank}")
    return out


def _tgi_after_shards() -> str:
    out = _tgi("09:00:19", "text_generation_launcher", "Server started at unix:///tmp/text-generation-server-0")
    out += _tgi("09:00:19", "shard-manager: text_generation_launcher", "Shard ready in 15.2s rank=0")
    out += _tgi("09:00:19", "text_generation_launcher", "Starting Webserver")
    out += _tgi("09:00:20", "text_generation_router_v3", "backends/v3/src/lib.rs:125: Warming up model")
    out += _tgi("09:00:22", "text_generation_launcher", "Cuda Graphs are enabled for sizes [32, 16, 8, 4, 2, 1]")
    out += _tgi("09:00:31", "text_generation_router_v3",
                "backends/v3/src/lib.rs:137: Setting max batch total tokens to 277776")
    out += _tgi("09:00:31", "text_generation_router::server", "router/src/server.rs:2302: Connected")
    return out


def tgi_healthy() -> str:
    return _tgi_until_shards() + _tgi_waiting(10) + _tgi_after_shards()


def tgi_shard_stuck(seconds: int = 1200) -> str:
    """A shard that never gets ready: only the launcher's `Waiting for shard to be ready...`, every 10 s."""
    return _tgi_until_shards() + _tgi_waiting(seconds)


def _vllm_stats(clock: str, running: int, waiting: int, throughput: float, engine: int = 0) -> str:
    return _vl("APIServer", 525681, clock, "loggers.py:276",
               f"Engine {engine:03d}: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: "
               f"{throughput:.1f} tokens/s, Running: {running} reqs, Waiting: {waiting} reqs, GPU KV cache usage: "
               "0.0%, Prefix cache hit rate: 0.0%")


def vllm_post_ready_hang(lines: int = 6) -> str:
    """vLLM #23378: serving, then requests hang: 255 running, no token generated, a stats line every 10 s."""
    return vllm_healthy() + "".join(_vllm_stats(f"09:05:{10 * i:02d}", 255, 0, 0.0) for i in range(lines))


def tgi_shard_crash() -> str:
    out = tgi_healthy()
    out += _tgi("09:40:02", "text_generation_launcher", "Shard 1 crashed", level="ERROR")
    out += _tgi("09:40:02", "text_generation_launcher", "Shard complete standard error output:\n\nTraceback "
                "(most recent call last):", level="ERROR")
    return out


def llamacpp_healthy() -> str:
    return (
        "build: 4785 (aa6192d3) with cc (Debian 12.2.0-14) 12.2.0 for x86_64-linux-gnu\n"
        "system info: n_threads = 16, n_threads_batch = 16, total_threads = 32\n"
        "main: HTTP server is listening, hostname: 127.0.0.1, port: 8080, http threads: 31\n"
        "main: loading model\n"
        "srv    load_model: loading model '/models/qwen2.5-7b-instruct-q4_k_m.gguf'\n"
        "llama_model_loader: loaded meta data with 29 key-value pairs and 339 tensors\n"
        "llama_context: n_ctx = 4096\n"
        "llama_kv_cache_unified:      CUDA0 KV buffer size =   224.00 MiB\n"
        "common_init_from_params: warming up the model with an empty run - please wait ...\n"
        "main: model loaded\n"
        "main: server is listening on http://127.0.0.1:8080 - starting the main loop\n"
        "srv  update_slots: all slots are idle\n"
    )


def llamacpp_load_error() -> str:
    return (
        "build: 4785 (aa6192d3) with cc (Debian 12.2.0-14) 12.2.0 for x86_64-linux-gnu\n"
        "main: loading model\n"
        "srv    load_model: loading model '/models/missing.gguf'\n"
        "main: exiting due to model loading error\n"
    )


# Ollama (ollama/ollama at fb307609, `exporter/stallwatch/engines/ollama.py`): Go slog text lines with their source.
OLLAMA_BLOB = "/root/.ollama/models/blobs/sha256-6a0746a1ec1aef3e7ec53868f220ff6e389f6f8ef87a01d77c96807de94ca2aa"


def _ol(source: str, message: str, rest: str = "", level: str = "INFO") -> str:
    return f'time=2026-11-20T09:14:02.123Z level={level} source={source} msg="{message}"{rest}\n'


def ollama_serving() -> str:
    """`ollama serve` up to its listen line (`server/routes.go:1951-2008`)."""
    return (_ol("routes.go:1951", "server config", ' env="map[OLLAMA_HOST:http://127.0.0.1:11434 '
                'OLLAMA_KEEP_ALIVE:5m0s OLLAMA_LOAD_TIMEOUT:5m0s OLLAMA_MAX_LOADED_MODELS:0 OLLAMA_NUM_PARALLEL:1]"')
            + _ol("routes.go:2008", "Listening on 127.0.0.1:11434 (version 0.33.0)")
            # The shape of `app/server/server_test.go:289`'s recorded line, on a GPU.
            + _ol("types.go:130", "inference compute", ' id=0 library=cuda variant=v12 compute=9.0 driver=12.8 '
                  'name="NVIDIA H100 80GB HBM3" total="79.2 GiB" available="78.7 GiB"'))


def ollama_load(blob: str = OLLAMA_BLOB, port: str = "{port}") -> str:
    """A model load up to the runner's first answer (`llm/llama_server.go:433,1048,1295,1350`); the runner's own
    llama.cpp lines follow in the same log."""
    return (_ol("llama_server.go:433", "starting llama-server", f' cmd="/usr/local/lib/ollama/llama-server --model '
                f'{blob} --port {port} --host 127.0.0.1 --no-webui --offline -c 4096 -np 1 --log-verbosity 4 '
                '--no-log-prefix --no-log-timestamps"')
            + _ol("llama_server.go:1048", "loading model via llama-server", f" model={blob}")
            + _ol("llama_server.go:1295", "waiting for llama-server to start responding")
            + _ol("llama_server.go:1350", "waiting for llama-server to become available",
                  ' status="llm server loading model"'))


def ollama_loaded(model: str = "/api/generate") -> str:
    """The load's ready line (`llm/llama_server.go:1362`) and gin's line for the request that asked for it."""
    return (_ol("llama_server.go:1362", "llama-server started in 1.02 seconds")
            + f'[GIN] 2026/11/20 - 09:14:04 | 200 |  1.873412905s |       127.0.0.1 | POST     "{model}"\n')


def ollama_load_timeout(blob: str = OLLAMA_BLOB) -> str:
    """`OLLAMA_LOAD_TIMEOUT` passed with no load activity: the scheduler's line (`server/sched.go:641`,
    `llm/llama_server.go:1336`) and gin's 500 for the request."""
    return (_ol("sched.go:641", "Load failed", f' model={blob} error="timed out waiting for llama-server to start - "')
            + '[GIN] 2026/11/20 - 09:19:03 | 500 |          5m0s |       127.0.0.1 | POST     "/api/generate"\n')


def ollama_panic() -> str:
    """`ollama serve` dying of an unrecovered panic, as Go's runtime prints it to stderr (`runtime/panic.go`
    `printpanics`, then the signal and every goroutine's stack); the process exits 2."""
    return ("panic: runtime error: invalid memory address or nil pointer dereference\n"
            "[signal SIGSEGV: segmentation violation code=0x1 addr=0x0 pc=0x10d6a2e]\n\n"
            "goroutine 1234 [running]:\n"
            "github.com/ollama/ollama/server.(*Scheduler).processPending(0xc0001a4000, {0x1f3e0a8, 0xc00012e000})\n"
            "\t/go/src/github.com/ollama/ollama/server/sched.go:200 +0x3ae\n"
            "created by github.com/ollama/ollama/server.(*Scheduler).Run in goroutine 1\n"
            "\t/go/src/github.com/ollama/ollama/server/sched.go:121 +0x6f\n")


def _trt(clock: str, message: str, level: str = "I") -> str:
    """The TensorRT-LLM Python logger's line (`tensorrt_llm/logger.py`)."""
    return f"[11/20/2026-{clock}] [TRT-LLM] [{level}] {message}\n"


def _trt_bar(desc: str, total: int, upto: int, steps: int = 8) -> str:
    """A tqdm bar in its default format (`{desc}: {pct}%|{bar}| n/N [...]`) from 0 to `upto`, rewritten with `\\r`."""
    parts = []
    for i in range(steps + 1):
        n = upto * i // steps
        filled = 10 * n // total
        parts.append(f"\r{desc}: {100 * n // total:3d}%|{'█' * filled}{' ' * (10 - filled)}| {n}/{total} "
                     f"[00:{i:02d}<00:00, 35.06it/s]")
    return "".join(parts) + "\n"


def trtllm_until_weights(modules: int = 1113, upto: int | None = None) -> str:
    """trtllm-serve 1.1 (PyTorch backend) from its banner into the weights bar, up to `upto` of `modules` (all of
    them by default; #7703 stopped at 703/1113). The MPI worker's harmless multicast error comes at every start."""
    return (
        "[TensorRT-LLM] TensorRT-LLM version: 1.1.0rc3\n"
        + _trt("09:14:02", "Using LLM with PyTorch backend")
        + _trt("09:14:02", "neither checkpoint_format nor checkpoint_loader were provided, checkpoint_format will be "
               "set to HF.")
        + "rank 0 using MpiPoolSession to spawn MPI processes\n"
        + "[TensorRT-LLM][INFO] Refreshed the MPI local session\n"
        + "[TensorRT-LLM][ERROR] CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED not supported on GPU0.\n"
        + "Loading safetensors weights in parallel: 100%|██████████| 6/6 [00:00<00:00, 105.78it/s]\n"
        + _trt_bar("Loading weights concurrently", modules, modules if upto is None else upto)
    )


def trtllm_healthy() -> str:
    """trtllm-serve up to uvicorn's ready line: the weights, the KV cache, the server (no `Uvicorn running on`: the
    socket is passed in)."""
    return (
        trtllm_until_weights()
        + "Model init total -- 41.18s\n"
        + "[TensorRT-LLM][INFO] Max KV cache blocks per sequence: 4097 [window size=131072], tokens per block=32, "
          "primary blocks=216616, secondary blocks=0, max sequence length=131072\n"
        + "[TensorRT-LLM][INFO] Number of tokens per block: 32.\n"
        + "[TensorRT-LLM][INFO] [MemUsageChange] Allocated 59.50 GiB for max tokens in paged KV cache (6931712).\n"
        + "INFO:     Started server process [4242]\n"
        + "INFO:     Waiting for application startup.\n"
        + "INFO:     Application startup complete.\n"
    )


def trtllm_executor_died(job: int = 2) -> str:
    """What a rank of the executor prints as it dies of a signal under MPI (Open MPI's `opal/util/stacktrace.c`),
    then mpirun's summary (`help-errmgr-base`); uvicorn goes on answering."""
    rank = "[gpu-node-7:04311]"
    return (
        f"{rank} *** Process received signal ***\n"
        f"{rank} Signal: Segmentation fault (11)\n"
        f"{rank} Signal code: Address not mapped (1)\n"
        f"{rank} Failing at address: 0x10\n"
        f"{rank} *** End of error message ***\n"
        "--------------------------------------------------------------------------\n"
        f"Child job {job} terminated normally, but 1 process returned\n"
        "a non-zero exit code. Per user-direction, the job has been aborted.\n"
        "--------------------------------------------------------------------------\n"
    )


def trtllm_request_error() -> str:
    """One request's error while serving (`openai_server.py`: `except Exception` logs the traceback and answers
    400): the server goes on."""
    return (
        _trt("09:31:07", "Traceback (most recent call last):", level="E")
        + '  File "/usr/local/lib/python3.12/dist-packages/tensorrt_llm/serve/openai_server.py", line 618, in '
          "openai_chat\n"
        + "    prompt = prompt_inputs(prompt)\n"
        + "ValueError: prompt is too long: 140000 tokens > max_seq_len 131072\n"
        + 'INFO:     127.0.0.1:51432 - "POST /v1/chat/completions HTTP/1.1" 400 Bad Request\n'
    )


def trtllm_stop() -> str:
    """uvicorn's shutdown on SIGTERM (`uvicorn/server.py`, `uvicorn/lifespan/on.py`)."""
    return ("INFO:     Shutting down\n"
            "INFO:     Waiting for application shutdown.\n"
            "INFO:     Application shutdown complete.\n"
            "INFO:     Finished server process [4242]\n")


# Triton Inference Server with its TensorRT-LLM backend (`exporter/stallwatch/engines/triton.py`).
TRITON_LOG = "triton-2.42-trtllm-0.8-launch-serving.log"
TRITON_MODELS = ("ensemble", "postprocessing", "preprocessing", "tensorrt_llm")  # that log's model repository


def triton_healthy() -> str:
    """A real Triton 2.42 start with the TensorRT-LLM backend, one rank, to its ports (SOURCES.md)."""
    return real(TRITON_LOG)


def triton_until_engine() -> str:
    """The same start, up to TensorRT-LLM's engine in GPU memory (`Loaded engine size` and its allocations) and no
    further: the KV cache is never allocated, no port opens (tensorrtllm_backend#377)."""
    lines = triton_healthy().splitlines(keepends=True)
    return "".join(lines[:next(i for i, line in enumerate(lines) if "IExecutionContext creation" in line) + 1])


def triton_stop() -> str:
    """SIGTERM (`triton_signal.cc:112`, raw stdout), then the models' unload (`core/src/server.cc:312-354`,
    `model_lifecycle.cc:636`) to its last countdown with no model left."""
    def glog(clock: str, where: str, message: str) -> str:
        return f"I1120 {clock} 4734 {where}] {message}\n"
    return ("Signal (15) received.\n"
            + glog("09:31:02.100412", "server.cc:305", "Waiting for in-flight requests to complete.")
            + glog("09:31:02.100430", "server.cc:321", "Timeout 30: Found 0 model versions that have in-flight "
                   "inferences")
            + glog("09:31:02.100995", "server.cc:336", "All models are stopped, unloading models")
            + glog("09:31:02.101004", "server.cc:345", "Timeout 30: Found 4 live models and 0 in-flight non-inference "
                   "requests")
            + "".join(glog(f"09:31:02.40{i:04d}", "model_lifecycle.cc:623",
                           f"successfully unloaded '{model}' version 1") for i, model in enumerate(TRITON_MODELS))
            + glog("09:31:03.101117", "server.cc:345", "Timeout 29: Found 0 live models and 0 in-flight non-inference "
                   "requests"))


def triton_segfault() -> str:
    """The server dying of SIGSEGV in its TensorRT-LLM executor (`triton_signal.cc:119-120`: the signal line on
    stderr, then boost's stack trace), as it writes it before the signal is raised again."""
    return ("Signal (11) received.\n"
            " 0# 0x00005615D1A4B3CD in /opt/tritonserver/bin/tritonserver\n"
            " 1# 0x00007F8A2C442520 in /usr/lib/x86_64-linux-gnu/libc.so.6\n"
            " 2# tensorrt_llm::batch_manager::TrtGptModelInflightBatching::forwardAsync(...) in "
            "/opt/tritonserver/backends/tensorrtllm/libtensorrt_llm.so\n")


# LMDeploy (InternLM/lmdeploy at 1263d5cd, `exporter/stallwatch/engines/lmdeploy.py`).
def _lmd(clock: str, source: str, message: str, level: str = "INFO") -> str:
    """Its logger's line (`lmdeploy/utils.py` `_FORMAT`)."""
    return f"2026-11-20 {clock},412 - lmdeploy - {level} - {source} - {message}\n"


def lmdeploy_until_weights(files: int = 4, upto: int | None = None, info: bool = True) -> str:
    """`lmdeploy serve api_server --backend pytorch` from its launch into the weights bar (rank 0's tqdm, a step per
    safetensors file), up to `upto` of `files` (all by default). `info`: at `--log-level INFO`; at the default
    WARNING its logger's INFO lines are not printed, the bar is."""
    lines = (_lmd("09:14:02", "async_engine.py:130", "input backend=pytorch, backend_config=PytorchEngineConfig("
                  "dtype='auto', tp=1, dp=1, ep=1, session_len=None, max_batch_size=256, cache_max_entry_count=0.8)")
             + _lmd("09:14:02", "async_engine.py:131", "speculative_config=None")
             + _lmd("09:14:04", "__init__.py:101", "Build <uni> executor.")
             + _lmd("09:14:09", "base.py:450", "Building Model.")) if info else ""
    return lines + _trt_bar("Loading weights from safetensors", files, files if upto is None else upto, steps=files)


def lmdeploy_after_weights(port: int = 23333, info: bool = True) -> str:
    """After the weights (`pytorch/engine/executor/base.py:452-466`), the three `HINT:` lines (`api_server.py:
    432-436`, ANSI codes around the address) and uvicorn's start (`uvicorn.run(host, port)`: it binds the port
    itself, so it says where)."""
    lines = (_lmd("09:15:31", "base.py:452", "Updating configs.")
             + _lmd("09:15:33", "base.py:454", "Building GraphRunner and warmup ops, please waiting.")
             + _lmd("09:15:33", "base.py:456", "Building CacheEngine with config: \nCacheConfig(max_batches=256, "
                    "block_size=64, num_cpu_blocks=0, num_gpu_blocks=4390).")
             + _lmd("09:15:36", "base.py:466", "Warming up model.")) if info else ""
    hint = (f"HINT:    Please open \x1b[93m\x1b[1mhttp://0.0.0.0:{port}\x1b[0m in a browser for detailed api "
            "usage!!!\n")
    return (lines + hint * 3 + "INFO:     Started server process [52141]\n"
            "INFO:     Waiting for application startup.\n"
            "INFO:     Application startup complete.\n"
            f"INFO:     Uvicorn running on http://0.0.0.0:{port} (Press CTRL+C to quit)\n")


def lmdeploy_healthy(info: bool = True) -> str:
    return lmdeploy_until_weights(info=info) + lmdeploy_after_weights(info=info)


def lmdeploy_engine_died() -> str:
    """The PyTorch engine's main loop dies behind the live API server (`pytorch/engine/engine.py:625`, a
    `logger.exception`)."""
    return (_lmd("10:02:41", "engine.py:625", "Engine main loop failed.", level="ERROR")
            + "Traceback (most recent call last):\n"
            + '  File "/opt/py3/lib/python3.12/site-packages/lmdeploy/pytorch/engine/engine.py", line 617, in '
              "async_loop\n"
            + "    await engine_loop.wait_tasks()\n"
            + "RuntimeError: CUDA error: an illegal memory access was encountered\n")


def lmdeploy_stop() -> str:
    """uvicorn's shutdown on SIGTERM (`uvicorn/server.py`), then the engine's process told to stop
    (`mp_engine/zmq_engine.py:151`)."""
    return ("INFO:     Shutting down\n"
            "INFO:     Waiting for application shutdown.\n"
            "INFO:     Application shutdown complete.\n"
            + _lmd("10:30:00", "zmq_engine.py:151", "MP process received signal SIGTERM, stopping server.")
            + "INFO:     Finished server process [52141]\n")


# Engines that are vLLM inside (`exporter/stallwatch/engines/aphrodite.py`, `dynamo.py`): vLLM's own messages in the
# wrapper's log format.
def _dyn(clock: str, target: str, message: str, level: str = "INFO", proc: str = "") -> str:
    """Dynamo's Rust logger (`dynamo/runtime/logging.py`): `{time}Z  LEVEL module.function: message`."""
    return f"{proc}2026-11-20T{clock}.504473Z  {level} {target}: {message}\n"


def dynamo_vllm_until_shards(model: str = "Qwen/Qwen3-0.6B", shards: int = 8) -> str:
    """`python -m dynamo.vllm --model M`: its signal handlers, vLLM's engine in the worker's process (EngineCore a
    child, with vLLM's prefix), to the last weight shard."""
    core = "(EngineCore_DP0 pid=4311) "
    return (_dyn("09:00:01", "graceful_shutdown.install_signal_handlers", "Signal handlers set up for graceful "
                 "shutdown (discovery unregister + grace period)")
            + _dyn("09:00:09", "core.__init__", f"Initializing a V1 LLM engine (v0.11.0) with config: model='{model}'",
                   proc=core)
            + _dyn("09:00:12", "gpu_model_runner.load_model", f"Starting to load model {model}...", proc=core)
            + _tqdm("Loading safetensors checkpoint shards", shards, "1.77it/s", newline_each=True))


def dynamo_vllm_healthy(model: str = "Qwen/Qwen3-0.6B") -> str:
    """... then the KV cache, the graphs, the engine monitor and the model registered with the runtime."""
    core = "(EngineCore_DP0 pid=4311) "
    return (dynamo_vllm_until_shards(model)
            + _dyn("09:00:19", "default_loader.load_weights", "Loading weights took 6.10 seconds", proc=core)
            + _dyn("09:00:20", "gpu_model_runner.load_model", "Model loading took 1.12 GiB memory and 7.2 seconds",
                   proc=core)
            + _dyn("09:00:31", "gpu_worker.determine_available_memory", "Available KV cache memory: 60.12 GiB",
                   proc=core)
            + _dyn("09:00:44", "gpu_model_runner.capture_model", "Graph capturing finished in 12 secs, took 0.46 GiB",
                   proc=core)
            + _dyn("09:00:45", "core._initialize_kv_caches", "init engine (profile, create kv cache, warmup model) "
                   "took 25.33 seconds", proc=core)
            + _dyn("09:00:45", "engine_monitor.__init__", "VllmEngineMonitor initialized and health check task "
                   "started.")
            + _dyn("09:00:46", "_core", f"Registered base model '{model}' MDC"))


def dynamo_sglang_until_shards(model: str = "Qwen/Qwen3-0.6B", shards: int = 8) -> str:
    """`python -m dynamo.sglang --model-path M`: its signal handlers, then SGLang's scheduler lines through Dynamo's
    logger (`INFO model_runner.load_model: ...`, as the published worker log writes SGLang's), to the last shard."""
    return (_dyn("09:00:01", "graceful_shutdown.install_signal_handlers", "Signal handlers set up for graceful "
                 "shutdown (discovery unregister + grace period)")
            + _dyn("09:00:06", "model_runner.init_torch_distributed", "Init torch distributed begin.")
            + _dyn("09:00:08", "model_runner.load_model", "Load weight begin. avail mem=78.50 GB")
            + _tqdm("Loading safetensors checkpoint shards", shards, "1.77it/s"))


def dynamo_sglang_healthy(model: str = "Qwen/Qwen3-0.6B") -> str:
    """... then the KV cache, the graphs and the model registered with the runtime (`dynamo/sglang/register.py`)."""
    return (dynamo_sglang_until_shards(model)
            + _dyn("09:00:19", "model_runner.load_model", "Load weight end. type=Qwen3ForCausalLM, "
                   "dtype=torch.bfloat16, avail mem=77.30 GB, mem usage=1.20 GB.")
            + _dyn("09:00:20", "model_runner.init_memory_pool", "Memory pool end. avail mem=10.12 GB")
            + _dyn("09:00:21", "cuda_graph_runner.__init__", "Capture cuda graph begin. This can take up to several "
                   "minutes. avail mem=10.00 GB")
            + _dyn("09:00:33", "cuda_graph_runner.__init__", "Capture cuda graph end. Time elapsed: 12.01 s. mem "
                   "usage=0.46 GB. avail mem=9.54 GB.")
            + _dyn("09:00:34", "register.register_model_with_readiness_gate", "Model registration succeeded; "
                   "processing queued requests"))


def dynamo_trtllm_until_weights(modules: int = 1113) -> str:
    """`python -m dynamo.trtllm --model-path M` (ai-dynamo/dynamo `components/src/dynamo/trtllm/main.py` at b6c87336,
    `workers/llm_worker.py` at 318ccac5): TensorRT-LLM's banner, printed at its import before the worker's logging is
    set up, the worker's signal handlers, then the LLM built in the worker's process, into the weights bar. The
    worker's process sends TensorRT-LLM's Python logger (`tensorrt_llm/logger.py`: `[TRT-LLM] [I] ` before the
    message, through the root logger) to Dynamo's handler, so its lines are composed here: Dynamo's format around the
    message `trtllm_until_weights` has, `logger.log` its module and function. The executor's MPI worker, its own
    process, does not run Dynamo's logging: its C++ lines and tqdm bars are as `trtllm_until_weights` has them. No
    line before the registration names the model."""
    return ("[TensorRT-LLM] TensorRT-LLM version: 1.1.0rc3\n"
            + _dyn("09:00:01", "graceful_shutdown.install_signal_handlers", "Signal handlers set up for graceful "
                   "shutdown (discovery unregister + grace period)")
            + _dyn("09:00:02", "llm_worker.init_llm_worker", "Initializing NIXL Connect.")
            + _dyn("09:00:03", "logger.log", "[TRT-LLM] [I] Using LLM with PyTorch backend")
            + "rank 0 using MpiPoolSession to spawn MPI processes\n"
            + "[TensorRT-LLM][INFO] Refreshed the MPI local session\n"
            + "[TensorRT-LLM][ERROR] CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED not supported on GPU0.\n"
            + "Loading safetensors weights in parallel: 100%|██████████| 6/6 [00:00<00:00, 105.78it/s]\n"
            + _trt_bar("Loading weights concurrently", modules, modules))


def dynamo_trtllm_healthy(model: str = "Qwen/Qwen3-0.6B") -> str:
    """... then the MPI worker's KV cache (as `trtllm_healthy` has it) and the model registered with the runtime
    (`llm_worker.py` `init_llm_worker` calls `register_model`, whose `Registered base model '{name}' MDC` is in
    `lib/bindings/python/rust/lib.rs` at 209c9e83: the served name, else the model path)."""
    return (dynamo_trtllm_until_weights()
            + "Model init total -- 41.18s\n"
            + "[TensorRT-LLM][INFO] Number of tokens per block: 32.\n"
            + "[TensorRT-LLM][INFO] [MemUsageChange] Allocated 59.50 GiB for max tokens in paged KV cache (6931712).\n"
            + _dyn("09:00:48", "_core", f"Registered base model '{model}' MDC"))


def dynamo_stop() -> str:
    """SIGTERM's graceful shutdown (`common/utils/graceful_shutdown.py`)."""
    return (_dyn("10:30:00", "graceful_shutdown.graceful_shutdown_with_discovery", "Received shutdown signal; "
                 "unregistering endpoints from discovery")
            + _dyn("10:30:05", "graceful_shutdown.graceful_shutdown_with_discovery", "Initiating runtime shutdown"))


def _aph(clock: str, message: str, level: str = "INFO", proc: str = "") -> str:
    """Aphrodite's default format (`logger.py` `_FORMAT_INFO`): no file and line."""
    return f"{proc}{level} 11-20 {clock} {message}\n"


def aphrodite_until_shards(model: str = "PygmalionAI/Eleusis-12B", shards: int = 5) -> str:
    core = "(EngineCore pid=7712) "
    return (_aph("09:00:01", f"Aphrodite server version 0.10.2, serving model {model}")
            + _aph("09:00:01", f"non-default args: {{'model': '{model}'}}")
            + _aph("09:00:09", f"Initializing a V1 LLM engine (v0.10.2) with config: model='{model}'", proc=core)
            + _aph("09:00:12", f"Starting to load model {model}...", proc=core)
            + _tqdm("Loading safetensors checkpoint shards", shards, "1.77it/s", newline_each=True))


def aphrodite_healthy(model: str = "PygmalionAI/Eleusis-12B", port: int = 2242) -> str:
    core = "(EngineCore pid=7712) "
    return (aphrodite_until_shards(model)
            + _aph("09:00:31", "Loading weights took 19.10 seconds", proc=core)
            + _aph("09:00:31", "Model loading took 23.1 GiB memory and 19.6 seconds", proc=core)
            + _aph("09:00:40", "Available KV cache memory: 41.02 GiB", proc=core)
            + _aph("09:00:58", "Graph capturing finished in 18 secs, took 0.52 GiB", proc=core)
            + _aph("09:00:58", "init engine (profile, create kv cache, warmup model) took 27.11 s", proc=core)
            + _aph("09:00:59", f"Starting Aphrodite server on http://0.0.0.0:{port}")
            + _aph("09:00:59", "Available routes are:")
            + "INFO:     Started server process [7700]\n"
            + "INFO:     Waiting for application startup.\n"
            + "INFO:     Application startup complete.\n")


def aphrodite_stop() -> str:
    """SIGTERM: `entrypoints/launcher.py:305`, then uvicorn's shutdown."""
    return (_aph("10:30:00", "Shutting down FastAPI HTTP server.")
            + "INFO:     Shutting down\nINFO:     Waiting for application shutdown.\n"
              "INFO:     Application shutdown complete.\n")


def xinference_until_shards(shards: int = 8) -> str:
    """An Xinference model actor loading vLLM in-process, to its last weight shard: the engine's lines through the
    actor's logger."""
    return (_aph("09:00:09", "Initializing a V1 LLM engine (v0.11.0) with config: model='/models/qwen2.5-instruct'")
            + _aph("09:00:12", "Starting to load model /models/qwen2.5-instruct...")
            + _tqdm("Loading safetensors checkpoint shards", shards, "1.77it/s"))


def xinference_model_loaded(uid: str = "qwen2.5-instruct-0") -> str:
    """An Xinference model actor loading vLLM in-process: the engine's lines through the actor's logger, then the
    actor's own `ModelActor(uid) loaded` (xinference/core/model.py:500)."""
    return (_aph("09:00:09", "Initializing a V1 LLM engine (v0.11.0) with config: model='/models/qwen2.5-instruct'")
            + _aph("09:00:12", "Starting to load model /models/qwen2.5-instruct...")
            + _aph("09:00:40", "Available KV cache memory: 41.02 GiB")
            + f"2026-11-20 09:01:02,331 xinference.core.model 4242 INFO     ModelActor({uid}) loaded\n")


def sglang_pd_bootstrap(tp: int = 1) -> str:
    """A PD prefill server's launch: its bootstrap server's line from the main process (SGLang 0.5.23
    `srt/disaggregation/common/conn.py:3321-3323`) and its PD warmup (`srt/entrypoints/http_server.py:2505-2530`)
    before the usual lines; a decode server prints the warmup lines only."""
    return (_sg("10:00:01", "CommonKVBootstrapServer started successfully on 127.0.0.1:8998")
            + sglang_healthy(tp).replace(
                "The server is fired up and ready to roll!",
                "Start of pd disaggregation warmup ...\n"
                f"[{SG_DAY} 10:02:00] Disaggregation warmup requests completed for all 1 DP ranks\n"
                f"[{SG_DAY} 10:02:00] End of disaggregation warmup\n"
                f"[{SG_DAY} 10:02:00] The server is fired up and ready to roll!", 1))


def sglang_sigterm_stop() -> str:
    """SIGTERM to the server (a rollout's, Kubernetes' stop): it drains and exits (SGLang 0.5.x
    `srt/entrypoints/http_server.py`'s handler; the corpus's `sglang-sigterm-stop.log`)."""
    return (_sg("10:40:00", "SIGTERM received. signum=None frame=None. Draining requests and shutting down...")
            + _sg("10:40:04", "Gracefully exiting... Remaining number of requests 0. Remaining requests "
                  "remaining_rids=[]."))

def sglang_lost_prefill(address: str, affected: int) -> str:
    """A decode server whose prefill's bootstrap server stopped answering its heartbeat: two misses, then the loss
    (`srt/disaggregation/common/conn.py:1997-2040`)."""
    return (_sg("10:30:00", f"Attempting to reconnect to {address}...", 0)
            + _sg("10:30:05", f"Attempting to reconnect to {address}...", 0)
            + _sg("10:30:10", f"Lost connection with prefill instance (bootstrap_addr: {address}), {affected} "
                  "requests affected", 0))


def vllm_toy_proxy_start(prefills: int, decodes: int, port: int) -> str:
    """vLLM's toy proxy's start under uvicorn: its lifespan's count of clients between uvicorn's lines
    (`toy_proxy_server.py@030ea52` `lifespan`)."""
    return ("INFO:     Started server process [61234]\n"
            "INFO:     Waiting for application startup.\n"
            f"Initialized {prefills} prefill clients and {decodes} decode clients.\n"
            "INFO:     Application startup complete.\n"
            f"INFO:     Uvicorn running on http://localhost:{port} (Press CTRL+C to quit)\n")


def sglang_router_start(prefills: list[tuple[str, int]], decodes: list[str], port: int) -> str:
    """The Rust router's start in PD mode (sgl-router `src/server.rs:261`, as in kvcache-ai/Mooncake#851), with its
    tracing prefix."""
    prefill_urls = ", ".join(f'("{url}", Some({bootstrap}))' for url, bootstrap in prefills)
    decode_urls = ", ".join(f'"{url}"' for url in decodes)
    return (f"2026-11-20T10:03:00.000000Z  INFO sglang_router_rs::server: src/server.rs:261: Starting router on "
            f"0.0.0.0:{port} | mode: PrefillDecode {{ prefill_urls: [{prefill_urls}], decode_urls: [{decode_urls}], "
            "prefill_policy: None, decode_policy: None } | policy: Random | max_payload_size: 268435456\n")
