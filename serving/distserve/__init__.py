"""DistServe (OSDI'24): prefill/decode disaggregation in the simulator and its placement searches."""

from serving.distserve.decode import DecodeLaneSim, Handoff
from serving.distserve.disagg import (
    DisaggDeployment,
    PhaseSpec,
    co_simulate,
    run_colocated,
    run_disaggregated,
)
from serving.distserve.oracle import Bisection, PhaseOracle
from serving.distserve.parallel import IB_HDR, NVLINK3, LaneModel, Parallelism, feasible, lane_model
from serving.distserve.prefill import PrefillLaneSim
from serving.distserve.search import Placement, high_affinity_search, low_affinity_search
from serving.distserve.vllm_v0 import run_colocated_vllm_v0, run_vllm_v0, vllm_v0_config

__all__ = [
    "IB_HDR",
    "NVLINK3",
    "Bisection",
    "DecodeLaneSim",
    "DisaggDeployment",
    "Handoff",
    "LaneModel",
    "Parallelism",
    "PhaseOracle",
    "PhaseSpec",
    "Placement",
    "PrefillLaneSim",
    "co_simulate",
    "feasible",
    "high_affinity_search",
    "lane_model",
    "low_affinity_search",
    "run_colocated",
    "run_colocated_vllm_v0",
    "run_disaggregated",
    "run_vllm_v0",
    "vllm_v0_config",
]
