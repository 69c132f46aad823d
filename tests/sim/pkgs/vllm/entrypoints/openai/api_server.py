"""Simulated `vllm` entry point (see tests/sim/pkgs/enginesim.py)."""

if __name__ == "__main__":
    from enginesim import main

    main("vllm")
