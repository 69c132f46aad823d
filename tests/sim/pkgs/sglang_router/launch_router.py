"""Simulated `python -m sglang_router.launch_router` (see tests/sim/pkgs/enginesim.py `router_main`)."""

if __name__ == "__main__":
    from enginesim import router_main

    router_main()
