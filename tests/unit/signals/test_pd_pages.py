"""PD figures from the engines' pages (pending by stage, transfers completed) and a router's view of its workers."""

from __future__ import annotations

import pytest

from stallwatch.engines import ENGINES
from stallwatch.signals.engine_page import PdFigures, parse_pd
from stallwatch.signals.router_page import RouterView, parse_router
from support.sim import enginesim


def test_sglang_queues_are_read_once_per_dp_group_and_its_transfer_histogram_counts_transfers() -> None:
    page = ('sglang:num_decode_transfer_queue_reqs{dp_rank="0",tp_rank="0",pp_rank="0"} 2\n'
            'sglang:num_decode_transfer_queue_reqs{dp_rank="0",tp_rank="1",pp_rank="0"} 2\n'
            'sglang:num_decode_transfer_queue_reqs{dp_rank="1",tp_rank="0",pp_rank="0"} 1\n'
            'sglang:num_decode_prealloc_queue_reqs{dp_rank="0",tp_rank="0",pp_rank="0"} 0\n'
            'sglang:kv_transfer_latency_ms_count{dp_rank="0",tp_rank="0",pp_rank="0"} 40\n'
            'sglang:kv_transfer_latency_ms_sum{dp_rank="0",tp_rank="0",pp_rank="0"} 4000\n')
    assert parse_pd(page, ENGINES["sglang"].metrics) == PdFigures({"prealloc": 0.0, "transfer": 3.0}, 40.0)


def test_vllm_fetch_stages_are_one_family_read_by_its_stage_label() -> None:
    page = ('vllm:num_requests_kv_fetch_by_stage{engine="0",model_name="m",stage="waiting_to_start"} 1.0\n'
            'vllm:num_requests_kv_fetch_by_stage{engine="0",model_name="m",stage="in_progress"} 3.0\n'
            'vllm:num_requests_kv_fetch_by_stage{engine="0",model_name="m",stage="completed_waiting"} 9.0\n'
            'vllm:nixl_xfer_time_seconds_count{engine="0",model_name="m"} 5.0\n')
    assert parse_pd(page, ENGINES["vllm"].metrics) == PdFigures({"prealloc": 1.0, "transfer": 3.0}, 5.0)


def test_a_page_without_pd_figures_gives_none_and_a_bad_value_fails() -> None:
    spec = ENGINES["sglang"].metrics
    assert spec is not None and parse_pd('sglang:num_running_reqs{tp_rank="0"} 1\n', spec) is None
    with pytest.raises(ValueError):
        parse_pd('sglang:num_decode_transfer_queue_reqs{tp_rank="0"} +Inf\n', spec)


def test_the_simulated_pd_pages_are_read_as_the_real_ones() -> None:
    work = enginesim.Work("sglang", {"pending": {"transfer": 2}, "transfers_start": 7, "transfers_rate": 0.0})
    assert parse_pd(work.page(), ENGINES["sglang"].metrics) == PdFigures({"bootstrap": 0.0, "inflight": 0.0,
                                                                          "prealloc": 0.0, "transfer": 2.0}, 7.0)


def test_a_router_page_gives_each_workers_health_and_its_requests_in_flight() -> None:
    page = (b'sgl_router_worker_health{worker="http://127.0.0.1:30000"} 1\n'
            b'sgl_router_worker_health{worker="http://127.0.0.1:30001"} 0\n'
            b'sgl_router_running_requests{worker="http://127.0.0.1:30000"} 2\n'
            b'sgl_router_running_requests{worker="http://127.0.0.1:30001"} 1\n'
            b'sgl_router_worker_health_other{worker="x"} 1\n')
    assert parse_router(page, "sgl_router_worker_health", ("worker", "worker_url"), "sgl_router_running_requests") == (
        RouterView(True, {"http://127.0.0.1:30000": 1.0, "http://127.0.0.1:30001": 0.0}, 3.0))
