"""A log's bytes and what they say, with no thread and no server of their own: where a log is (`source`), one log
followed (`follow`: a file or a unit's journal, its figures), the runtimes' framings decoded (`formats`, `journal`),
the engine's lines interpreted (`interpret`: phase, events, progress; `stats_lines`: its figures; `prefilter`: the
rules' cheap first pass), and the tail kept for the reports (`tail`). `signals.logs` runs the followers of every
server on its thread."""
