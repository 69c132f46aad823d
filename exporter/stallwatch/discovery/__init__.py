"""Processes become watched servers: which processes are inference servers (`watcher`), what each launch of one is
(`server`: its main process, command line, workload, port, probes and log sources), what runs it and where its log
is (`workload`: its cgroup, the kubelet's log tree, Docker's state, all under `--path.rootfs`), what its network
namespace holds (`netns`) and who made its namespaces (`namespaces`), its place in a multi-node deployment
(`deployment`), and its process tree (`processes`)."""
