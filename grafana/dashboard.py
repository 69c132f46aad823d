"""Builds grafana/stallwatch.json, the incident dashboard (run after editing; a test checks they match).

    .venv/bin/python grafana/dashboard.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PHASES = ["stopped", "launching", "loading_weights", "allocating_memory", "capturing_graphs", "warming_up",
          "serving", "failed"]
PHASE_COLOURS = ["text", "blue", "purple", "orange", "yellow", "light-green", "green", "red"]
SEL = 'instance=~"$instance", server=~"$server"'
INST = 'instance=~"$instance"'
DEPL = 'deployment=~"$deployment"'
PDG = 'pd_group=~"$pd_group"'
DS = {"type": "prometheus", "uid": "${datasource}"}

# One number per phase so a state timeline shows one row per server.
PHASE_INDEX = "max by (instance, server) (\n" + "\n  or ".join(
    f'(stallwatch_startup_phase{{{SEL}, phase="{p}"}} == 1) * {i}' for i, p in enumerate(PHASES)) + "\n)"


# The alerts' `status_url` (rules/stallwatch.rules.yml), from a row of the server_info table.
STATUS_URL = "http://${__data.fields.instance:raw}/servers/?name=${__data.fields.server:percentencode}"


def target(expr: str, legend: str, ref: str = "A", instant: bool = False) -> dict[str, Any]:
    out = {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref}
    if instant:
        out.update({"instant": True, "range": False, "format": "table"})
    return out


def panel(title: str, kind: str, x: int, y: int, w: int, h: int, targets: list[dict[str, Any]],
          unit: str | None = None, description: str = "", **extra: Any) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": unit} if unit else {}
    return {"type": kind, "title": title, "description": description, "datasource": DS,
            "gridPos": {"x": x, "y": y, "w": w, "h": h}, "targets": targets,
            "fieldConfig": {"defaults": defaults, "overrides": []}, **extra}


def panels() -> list[dict[str, Any]]:
    phase_mappings = [{"type": "value", "options": {
        str(i): {"text": p, "color": PHASE_COLOURS[i], "index": i} for i, p in enumerate(PHASES)}}]
    timeline = panel("Startup phase", "state-timeline", 0, 0, 24, 6, [target(PHASE_INDEX, "{{server}}")],
                     description="Where each server is in its startup; a silent stall stays in one phase.",
                     options={"showValue": "auto", "mergeValues": True})
    timeline["fieldConfig"]["defaults"].update({"mappings": phase_mappings, "color": {"mode": "thresholds"}})
    servers = panel("Servers", "table", 12, 6, 12, 5, [target(f"stallwatch_server_info{{{SEL}}}", "", instant=True)],
                    description="What each server is (engine, model, TP) and where it runs (runtime, namespace/pod, "
                                "container, unit). Each row links to the exporter's status page of the server.")
    servers["fieldConfig"]["defaults"]["links"] = [{"title": "Status page: verdict, processes, GPUs, last hour",
                                                    "url": STATUS_URL, "targetBlank": True}]
    return [
        timeline,
        panel("Firing stallwatch alerts", "table", 0, 6, 12, 5, [target(
            f'ALERTS{{alertstate="firing", alertname=~"Inference(?:Server|Deployment|PD).*|Stallwatch.*", {INST}}}', "",
            instant=True)], description="Alerts from rules/stallwatch.rules.yml firing now."),
        servers,
        panel("GPU memory held by the server", "timeseries", 0, 11, 12, 8, [
            target(f"stallwatch_server_gpu_memory_used_bytes{{{SEL}}}", "{{server}} GPU {{gpu}}"),
            target(f"stallwatch_stall_gpu_memory_threshold_bytes{{{SEL}}}", "{{server}} threshold", "C"),
        ], unit="bytes", description="Memory of the server's processes per GPU, against the stall threshold."),
        panel("GPU busy rate of the server's GPUs", "timeseries", 12, 11, 12, 8, [
            target(f"rate(stallwatch_server_gpu_busy_seconds_total{{{SEL}}}[$__rate_interval])",
                   "{{server}} GPU {{gpu}}"),
        ], unit="percentunit", description="Busy seconds per second over the interval (the mean utilization, "
                                           "integrated from NVML's samples) of each GPU the server holds memory on."),
        *gpu_health_panels(19),
        panel("CPU by process role", "timeseries", 0, 27, 12, 8, [target(
            f"sum by (server, process) (rate(stallwatch_process_cpu_seconds_total{{{SEL}}}[$__rate_interval]))",
            "{{server}} {{process}}")], unit="percentunit",
              description="Cores used per role (main, scheduler_TP*, Worker_TP*...). A stalled scheduler is at 0."),
        panel("Processes by state", "timeseries", 12, 27, 12, 8, [target(
            f"stallwatch_server_processes{{{SEL}}} > 0", "{{server}} {{state}}")],
              description="R running, S sleeping, D uninterruptible, Z zombie, T stopped."),
        panel("Log last-line and last-progress age", "timeseries", 0, 35, 12, 8, [
            target(f"stallwatch_log_last_line_age_seconds{{{SEL}}}\n{where('log', 'path')}", "{{server}} {{path}}"),
            target(f"stallwatch_stall_log_stale_threshold_seconds{{{SEL}}}", "{{server}} threshold", "B"),
            target(f"time() - stallwatch_log_last_progress_timestamp_seconds{{{SEL}}}", "{{server}} since progress",
                   "C"),
        ], unit="s", description="Seconds since each log grew, and since its last line that is not a heartbeat "
                                 "(the rules' \"log silent\"), against the stale threshold."),
        panel("Weight shards", "timeseries", 12, 35, 12, 8, [
            target(f"stallwatch_weight_shards_loaded{{{SEL}}}", "{{server}} loaded"),
            target(f"stallwatch_weight_shards_expected{{{SEL}}}", "{{server}} expected", "B"),
        ], description="Safetensors shards loaded in the current launch."),
        panel("Health probe and port", "timeseries", 0, 43, 12, 8, [
            target(f"stallwatch_probe_success{{{SEL}}}\n{where('probe', 'url')}", "{{server}} {{url}}"),
            target(f"stallwatch_server_listening{{{SEL}}}", "{{server}} port {{port}} listening", "B"),
        ], description="1 when the last probe of the URL succeeded; 1 when the engine's port listens in the "
                       "server's own network namespace (0: it never opened).",
              options={"legend": {"showLegend": True}}),
        panel("Probe duration", "timeseries", 12, 43, 12, 8, [
            target(f"stallwatch_probe_duration_seconds{{{SEL}}}\n{where('probe', 'url')}", "{{server}} {{url}}"),
        ], unit="s"),
        panel("Log events (1h)", "timeseries", 0, 51, 12, 8, [target(
            f"sum by (server, event) (increase(stallwatch_log_events_total{{{SEL}}}[1h]))", "{{server}} {{event}}")],
              description="fatal, nccl_timeout, oom, stall_warning and server_restart lines in the last hour."),
        panel("Exporter collectors", "timeseries", 12, 51, 12, 8, [
            target(f"stallwatch_collector_success{{{INST}}}", "{{instance}} {{collector}}"),
            target(f"stallwatch_nvml_up{{{INST}}}", "{{instance}} nvml", "B"),
        ], description="1 when each collector succeeded; nvml 0 means no GPU metrics."),
        *engine_panels(59),
        *deployment_panels(67),
        *pd_panels(84),
    ]


def gpu_health_panels(y: int) -> list[dict[str, Any]]:
    """Beside utilization: power against its limit (100 % busy at a fraction of the limit is a busy-wait), and what
    the driver says of the GPU."""
    return [
        panel("GPU power against its limit", "timeseries", 0, y, 12, 8, [
            target(f"stallwatch_gpu_power_watts{{{INST}}}", "GPU {{gpu}}"),
            target(f"stallwatch_gpu_power_limit_watts{{{INST}}}", "GPU {{gpu}} limit", "B"),
        ], unit="watt", description="Power draw and the enforced limit. GPUs at 100 % utilization under 30 % of "
                                    "their limit spin in a collective (InferenceServerStuckInCollective)."),
        panel("GPU recovery action and uncorrected ECC (1h)", "timeseries", 12, y, 12, 8, [
            target(f"stallwatch_gpu_recovery_action{{{INST}}}", "GPU {{gpu}} recovery action"),
            target(f"increase(stallwatch_gpu_ecc_uncorrected_errors_total{{{INST}}}[1h])", "GPU {{gpu}} ECC", "B"),
        ], description="The driver's recovery action (0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and "
                       "reset) and uncorrectable ECC errors in the last hour. Xids are the dashboard's "
                       "annotations."),
    ]


# Xid events on the time axis: a Prometheus annotation for each Xid in the step after it came.
XID_ANNOTATION = {
    "name": "Xid", "datasource": DS, "enable": True, "iconColor": "red", "step": "60s",
    "expr": f"time() - stallwatch_gpu_xid_last_timestamp_seconds{{{INST}}} < 60",
    "titleFormat": "Xid {{xid}}", "textFormat": "GPU {{gpu}} ({{uuid}}) on {{instance}}",
    "tagKeys": "instance,gpu,xid", "useValueForTime": False,
}


ENGINE_PANEL = "Engine: "


def engine_panels(y: int) -> list[dict[str, Any]]:
    """The engine's own view (source "metrics": its /metrics page, "log": its stats lines)."""
    return [
        panel(f"{ENGINE_PANEL}generated tokens/s", "timeseries", 0, y, 8, 8, [target(
            f"sum by (server, source) (rate(stallwatch_engine_generated_tokens_total{{{SEL}}}[$__rate_interval]))",
            "{{server}} ({{source}})")], unit="short",
              description="Tokens generated per second. 0 while requests run or wait is the post-ready hang "
                          "(InferenceServerNoTokenProgress)."),
        panel(f"{ENGINE_PANEL}requests running and waiting", "timeseries", 8, y, 8, 8, [
            target(f"stallwatch_engine_requests_running{{{SEL}}}", "{{server}} running ({{source}})"),
            target(f"stallwatch_engine_requests_waiting{{{SEL}}}", "{{server}} waiting ({{source}})", "B"),
        ], unit="short", description="Requests the engine runs and queues, as it last reported them."),
        panel(f"{ENGINE_PANEL}figures age and /metrics", "timeseries", 16, y, 8, 8, [
            target(f"time() - stallwatch_engine_stats_timestamp_seconds{{{SEL}}}", "{{server}} age ({{source}})"),
            target(f"stallwatch_engine_metrics_up{{{SEL}}}", "{{server}} /metrics up", "B"),
        ], description="Seconds since the engine's figures were last seen (the rules read them while under 60 s); "
                       "1 when its /metrics answered the last fetch."),
    ]


def section_row(title: str, y: int) -> dict[str, Any]:
    return {"type": "row", "title": title, "collapsed": False, "panels": [],
            "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}}


def members_table(title: str, y: int, info: str, columns: list[str], sort: list[str],
                  description: str) -> dict[str, Any]:
    """A table of the members of a group that spans instances (`info`, a member-info selector) with each one's phase
    now, its rows linked to each server's status page."""
    members = panel(title, "table", 0, y, 12, 8, [target(
        f"({info}\n  * on (job, instance, server) group_left (phase) (stallwatch_startup_phase == 1))\n"
        f"or on (job, instance, server) {info}", "", instant=True)], description=description,
                    transformations=[{"id": "organize", "options": {
                        "excludeByName": {"Time": True, "Value": True, "__name__": True, "job": True},
                        "indexByName": {name: i for i, name in enumerate(columns)}, "renameByName": {}}}],
                    options={"sortBy": [{"displayName": name} for name in sort]})
    members["fieldConfig"]["defaults"]["links"] = [{"title": "Status page: verdict, processes, GPUs, last hour",
                                                    "url": STATUS_URL, "targetBlank": True}]
    return members


DEPLOYMENT_ROW = "Deployments"
# A series of a server, with its deployment's labels: `on` the server's own labels, so any family of the server joins.
MEMBER = "* on (job, instance, server) group_left ({labels}) stallwatch_deployment_member_info{{{selector}}}"


def where(kind: str, label: str) -> str:
    """The `* on ... group_left` that gives a probe's or a log's series where it is (`url`, `path`) from its info
    series, which alone changes when a pod restarts."""
    return f"* on (job, instance, server, {kind}) group_left ({label}) stallwatch_{kind}_info"


def member(labels: str, role: str = "") -> str:
    """The `* on ... group_left` that gives a server's series its deployment's `labels` (only members: a server on
    one node has no member info and drops out); `role` keeps only the head or the workers."""
    return MEMBER.format(labels=labels, selector=f'{DEPL}, role="{role}"' if role else DEPL)


def deployment_panels(y: int) -> list[dict[str, Any]]:
    """Deployments over several nodes (rules: stallwatch:deployment_*, InferenceDeployment*), filtered by the
    `deployment` variable alone: a deployment spans instances, and its head judges it. Empty on single-node servers."""
    row = section_row(DEPLOYMENT_ROW, y)
    members = members_table(
        "Deployment members", y + 1, f"stallwatch_deployment_member_info{{{DEPL}}}",
        ["deployment", "node_rank", "nnodes", "role", "instance", "server", "phase"], ["deployment", "node_rank"],
        "Each node of each deployment as its exporter reports it: node rank, role (the head judges the deployment; "
        "workers are never paged for a silent log, a closed port or idle GPUs), instance, server and its phase now. A "
        "node rank that no exporter reports is not here: see missing nodes. Each row links to the server's status "
        "page.")
    return [
        row,
        members,
        panel("Deployment missing nodes", "timeseries", 12, y + 1, 12, 8, [target(
            f"stallwatch:deployment_missing_nodes:count{{{DEPL}}}", "{{deployment}}")], unit="short",
              description="Node ranks the deployment expects (0 .. nnodes-1) that no exporter reports: a node "
                          "that never joined, its server not started, or its exporter not scraped by this "
                          "Prometheus (InferenceDeploymentIncomplete)."),
        panel("Deployment head: health probe and process", "timeseries", 0, y + 9, 8, 8, [
            target(f"stallwatch_probe_success\n{where('probe', 'url')}\n{member('deployment', 'head')}",
                   "{{deployment}} head {{server}} {{url}}"),
            target(f"stallwatch:deployment_head_up:max{{{DEPL}}}", "{{deployment}} head up", "B"),
        ], description="The head's probe judges the whole deployment (SGLang's head /health generates through "
                       "every node); 1 while the head's process runs. A worker's /health is a constant or absent.",
              options={"legend": {"showLegend": True}}),
        panel("Deployment head: generated tokens/s", "timeseries", 8, y + 9, 8, 8, [
            target(f"sum by (deployment, source) (\n  rate(stallwatch_engine_generated_tokens_total[$__rate_interval])"
                   f"\n  {member('deployment', 'head')}\n)", "{{deployment}} tokens/s ({{source}})"),
            target(f"sum by (deployment, source) (\n  stallwatch:engine_requests:sum\n  {member('deployment', 'head')}"
                   f"\n)", "{{deployment}} requests held ({{source}})", "B"),
        ], unit="short", description="The head's engine figures are the deployment's (workers report none). 0 "
                                     "tokens/s while requests are held is the post-ready hang (vLLM's head /health "
                                     "stays 200 then)."),
        panel("Deployment rank processes: live and started", "timeseries", 16, y + 9, 8, 8, [
            target(f"stallwatch_deployment_member_ranks\n{member('deployment, node_rank, role')}",
                   "{{deployment}} node {{node_rank}} ({{role}}) live"),
            target(f"stallwatch_deployment_member_ranks_started\n{member('deployment, node_rank, role')}",
                   "{{deployment}} node {{node_rank}} ({{role}}) started", "B"),
        ], unit="short", description="Rank processes (schedulers, workers) of each member now, against the most "
                                     "of this launch. Live under started on a worker whose head runs: a lost rank "
                                     "(InferenceDeploymentMemberLost); its parent and SGLang's dummy /health live on."),
    ]


PD_ROW = "Prefill/decode groups"
# A series of a PD member, with its group's labels (only members and routers: another server drops out).
PD_MEMBER = f"* on (job, instance, server) group_left (pd_group, pd_role) stallwatch_pd_member_info{{{PDG}}}"


def pd_panels(y: int) -> list[dict[str, Any]]:
    """Prefill/decode disaggregated groups (rules: stallwatch.pd, InferencePD*), filtered by the `pd_group` variable
    alone: a group spans instances and is judged whole. Empty where no server is a PD member."""
    row = section_row(PD_ROW, y)
    members = members_table(
        "PD group members", y + 1, f"stallwatch_pd_member_info{{{PDG}}}",
        ["pd_group", "pd_role", "instance", "server", "phase"], ["pd_group", "pd_role"],
        "Each member of each prefill/decode group by role (prefill, decode, router), where it runs and its phase "
        "now. Each row links to the server's status page.")
    return [
        row,
        members,
        panel("PD requests pending by stage", "timeseries", 12, y + 1, 12, 8, [target(
            f"stallwatch:pd_requests_pending:max\n{PD_MEMBER}", "{{pd_group}} {{pd_role}} {{server}} {{stage}}")],
              unit="short", description="Requests outside running and waiting: bootstrap (a prefill waits for the "
                                        "decode side's handshake), inflight (KV being sent), prealloc (a decode waits "
                                        "for KV memory), transfer (it waits for the KV data). Held for minutes with no "
                                        "transfer: InferencePDTransferStuck, InferencePDBootstrapStuck."),
        panel("PD KV transfers/s", "timeseries", 0, y + 9, 12, 8, [target(
            f"sum by (pd_group, pd_role) (\n  rate(stallwatch_engine_kv_transfers_total[$__rate_interval])\n"
            f"  {PD_MEMBER}\n)", "{{pd_group}} {{pd_role}} transfers/s")], unit="short",
              description="KV transfers completed per second, by the side that counts them: the group's progress "
                          "beside the decode side's tokens."),
        panel("PD router: workers healthy and requests in flight", "timeseries", 12, y + 9, 12, 8, [
            target(f"stallwatch_router_worker_up\n{PD_MEMBER}", "{{pd_group}} {{server}}: {{role}} {{worker}} healthy"),
            target(f"stallwatch_router_requests_running\n{PD_MEMBER}", "{{pd_group}} {{server}} in flight", "B"),
        ], unit="short", description="The router's own view: each worker 1 healthy, 0 excluded (its health checks, "
                                     "its circuit breaker), and its requests in flight (InferencePDRouterNoProgress "
                                     "while the group generates nothing)."),
    ]


def dashboard() -> dict[str, Any]:
    items = panels()
    for i, item in enumerate(items, start=1):
        item["id"] = i
    return {
        "title": "stallwatch: LLM inference servers",
        "uid": "stallwatch",
        "tags": ["stallwatch", "llm", "gpu"],
        "timezone": "",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "annotations": {"list": [XID_ANNOTATION]},
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
             "current": {}, "hide": 0},
            {"name": "instance", "label": "Instance", "type": "query", "datasource": DS,
             "query": {"query": "label_values(stallwatch_build_info, instance)", "refId": "instance"},
             "definition": "label_values(stallwatch_build_info, instance)", "refresh": 2, "includeAll": True,
             "multi": True, "allValue": ".*", "current": {}, "hide": 0},
            {"name": "server", "label": "Server", "type": "query", "datasource": DS,
             "query": {"query": 'label_values(stallwatch_server_up{instance=~"$instance"}, server)',
                       "refId": "server"},
             "definition": 'label_values(stallwatch_server_up{instance=~"$instance"}, server)', "refresh": 2,
             "includeAll": True, "multi": True, "allValue": ".*", "current": {}, "hide": 0},
            {"name": "deployment", "label": "Deployment", "type": "query", "datasource": DS,
             "query": {"query": "label_values(stallwatch_deployment_member_info, deployment)",
                       "refId": "deployment"},
             "definition": "label_values(stallwatch_deployment_member_info, deployment)", "refresh": 2,
             "includeAll": True, "multi": True, "allValue": ".*", "current": {}, "hide": 0},
            {"name": "pd_group", "label": "PD group", "type": "query", "datasource": DS,
             "query": {"query": "label_values(stallwatch_pd_member_info, pd_group)", "refId": "pd_group"},
             "definition": "label_values(stallwatch_pd_member_info, pd_group)", "refresh": 2,
             "includeAll": True, "multi": True, "allValue": ".*", "current": {}, "hide": 0},
        ]},
        "panels": items,
    }


PATH = Path(__file__).with_name("stallwatch.json")


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    PATH.write_text(render())
    print(f"wrote {PATH}")
