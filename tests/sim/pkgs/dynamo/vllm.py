"""Simulated `python -m dynamo.vllm` (see tests/sim/pkgs/enginesim.py): vLLM's engine in the worker's process."""

if __name__ == "__main__":
    from enginesim import main

    main("dynamo-vllm")
