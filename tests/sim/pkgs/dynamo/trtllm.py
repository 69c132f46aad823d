"""Simulated `python -m dynamo.trtllm` (see tests/sim/pkgs/enginesim.py): TensorRT-LLM's LLM in the worker's process."""

if __name__ == "__main__":
    from enginesim import main

    main("dynamo-trtllm")
