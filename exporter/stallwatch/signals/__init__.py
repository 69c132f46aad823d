"""Background state, one module per source: NVML (`nvml`) and each GPU's health fields (`devices`), Xid events
(`xid`) and the kernel log's Xid lines (`kmsg`), health probes (`probes`), each engine's own `/metrics` page
(`engine_page`), the thread that follows every server's logs (`logs`), and the hour of history the status pages
plot (`history`). Loops here keep the state; collectors and reports only read it."""
