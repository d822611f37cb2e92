"""The planner is host-side only: numpy and the standard library, never jax."""

import ast
import pathlib
import subprocess
import sys

PLANNER = pathlib.Path(__file__).resolve().parents[2] / "planner"


def test_planner_sources_import_only_numpy_and_the_standard_library():
    allowed = set(sys.stdlib_module_names) | {"numpy"}
    for path in sorted(PLANNER.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                roots = [node.module.split(".")[0]]
            else:
                continue
            bad = [r for r in roots if r not in allowed]
            assert not bad, f"{path.name}:{node.lineno} imports {bad}"


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
import standalone_planner.simulate, standalone_planner.report
assert "jax" not in sys.modules, sorted(m for m in sys.modules if m.startswith("jax"))
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_importing_lightspec_jax_planner_does_not_load_jax():
    """Through the installed namespace too: the parent package imports its engine lazily."""
    code = ("import sys, lightspec_jax.planner.simulate\n"
            "assert 'jax' not in sys.modules, 'jax loaded'\nprint('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
