"""Simulated NVIDIA Dynamo workers (see tests/sim/pkgs/enginesim.py)."""
