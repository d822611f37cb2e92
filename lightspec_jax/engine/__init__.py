"""The engine core: one model runner for plain and speculative decoding.

Follow one step through: engine.py (the loop) -> scheduler.py (admission, chunks, and the
only code that changes a request) -> runner.py (dispatch) -> step.py (the device steps)
-> the drafter (drafters/) and the planner (planner/). batch.py holds the device-resident
per-slot state, flight.py the step in flight between two step() calls, buckets.py every
bucket size, costs.py the bucket sweep, verifier.py how drafts are accepted.
"""

from .engine import Engine
from .flight import StepEvent

__all__ = ["Engine", "StepEvent"]
