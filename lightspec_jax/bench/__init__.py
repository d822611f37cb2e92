"""Benchmark inputs: real prompt workloads (ShareGPT, HumanEval, generated math word problems)."""

from .workloads import (WORKLOADS, MathProblem, WorkloadError, WorkloadItem, load_workload,
                        math_problems)

__all__ = ["WORKLOADS", "MathProblem", "WorkloadError", "WorkloadItem", "load_workload",
           "math_problems"]
