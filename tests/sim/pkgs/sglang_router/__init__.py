"""Simulated `sglang_router` package (see tests/sim/pkgs/enginesim.py `router_main`)."""
