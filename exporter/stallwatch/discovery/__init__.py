"""Processes become watched servers: which processes are inference servers (`watcher`), what each launch of one is
(`server`: its main process, command line, workload, port, probes and log sources), where it runs (`placement`,
`workload`), what its network namespace holds (`netns`), and its process tree (`processes`)."""
