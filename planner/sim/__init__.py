"""The planner simulator: an offline model of a serving loop, used to compare policies.

No model runs. Requests arrive from calibrated synthetic workloads (planner/synthetic.py), step
times come from an H200 roofline or a measured cost table (costmodel.py), and each planner
(static K, LightSpec dynamic, DSpark-style; policies.py) or the hindsight oracle (oracle.py)
drives the loop (simulate.py); report.py prints the tables. numpy and the standard library
only, like the runtime planner it imports; serving code never imports this package.

    python -m lightspec_jax.planner.sim.simulate --all
    lightspec-bench simulate --all          # the same runs under the bench's policy names
"""
