"""Background state, one module per source: NVML (`nvml`), health probes (`probes`), each engine's own `/metrics`
page (`engine_page`), log followers (`logs`), and the hour of history the status pages plot (`history`). Loops
here keep the state; collectors and reports only read it."""
