"""Simulated `python -m dynamo.sglang` (see tests/sim/pkgs/enginesim.py): SGLang's engine in the worker's process."""

if __name__ == "__main__":
    from enginesim import main

    main("dynamo-sglang")
