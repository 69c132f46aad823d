#!/usr/bin/env python3
"""Simulated vLLM `toy_proxy_server.py` (see tests/sim/pkgs/enginesim.py `toy_proxy_main`)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pkgs"))

if __name__ == "__main__":
    from enginesim import toy_proxy_main

    toy_proxy_main()
