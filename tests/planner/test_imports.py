"""The planner and its simulator are host-side only: numpy and the standard library, never jax;
and serving code never imports the simulator."""

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
PLANNER = ROOT / "planner"


def _imports(path: pathlib.Path):
    """(line, module) for each import in a source file, lazy ones included; a relative
    module keeps its leading dots."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield node.lineno, "." * node.level + (node.module or "")


def test_planner_sources_import_only_numpy_and_the_standard_library():
    allowed = set(sys.stdlib_module_names) | {"numpy"}
    for path in sorted(PLANNER.rglob("*.py")):
        for line, module in _imports(path):
            root = module.split(".")[0]
            assert not root or root in allowed, f"{path.relative_to(ROOT)}:{line} imports {module}"


def test_serving_code_does_not_import_the_simulator():
    # The engine's synthetic-acceptance mode draws from planner/synthetic.py, not planner/sim.
    serving = [ROOT / "lightspec_jax" / name for name in ("engine", "drafters", "checkpoint")]
    paths = [p for d in serving for p in d.rglob("*.py")]
    paths += list((ROOT / "lightspec_jax").glob("*.py")) + list((ROOT / "models").rglob("*.py"))
    paths += list((ROOT / "pallas_kernels").rglob("*.py"))
    assert len(paths) > 20, paths  # the folders are where this test thinks they are
    for path in paths:
        for line, module in _imports(path):
            assert "planner.sim" not in module, \
                f"{path.relative_to(ROOT)}:{line} imports the simulator ({module})"


def test_importing_the_planner_alone_does_not_load_jax():
    # Load planner/ as a stand-alone package, so the check covers the planner's own imports
    # and not whatever the lightspec_jax parent package chooses to import.
    code = f"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location(
    "standalone_planner", {str(PLANNER / "__init__.py")!r},
    submodule_search_locations=[{str(PLANNER)!r}])
module = importlib.util.module_from_spec(spec)
sys.modules["standalone_planner"] = module
spec.loader.exec_module(module)
import standalone_planner.sim.simulate, standalone_planner.sim.report
assert "jax" not in sys.modules, sorted(m for m in sys.modules if m.startswith("jax"))
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_importing_lightspec_jax_planner_does_not_load_jax():
    """Through the installed namespace too: the parent package imports its engine lazily."""
    code = ("import sys, lightspec_jax.planner.sim.simulate\n"
            "assert 'jax' not in sys.modules, 'jax loaded'\nprint('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
