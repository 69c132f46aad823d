"""A log's bytes and what they say, with no thread and no server of their own: the runtimes' framings decoded
(`formats`, `journal`), the engine's lines interpreted (`interpret`: phase, events, progress; `stats_lines`: its
figures), and the tail kept for the reports (`tail`). `signals.logs` follows each server's logs through these."""
