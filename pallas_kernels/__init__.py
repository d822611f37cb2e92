"""Pallas kernels of the speculative step: fill (choose verify rows), verify, commit,
and the verify-batch attention the models call once per layer.

Each op runs its Triton-route Pallas kernel on a GPU and its plain-jnp ``<op>_reference``
elsewhere; ``impl="pallas"|"mosaic"|"reference"`` and ``interpret=True`` override that, and the
``REFERENCE_OPS_ENV`` variable (LIGHTSPEC_REFERENCE_OPS) sends the named ``OPS`` to their
reference on a GPU too. The ``MOSAIC_OPS`` (verify_attention) also have a Mosaic GPU kernel,
which ``MOSAIC_OPS_ENV`` (LIGHTSPEC_MOSAIC_OPS) selects on a GPU. ``use_pallas`` says whether
an op runs a kernel. Code outside this package imports only from here, never from its private
modules.
"""

from ._backend import (
    KERNELS_ENV,
    MOSAIC_OPS,
    MOSAIC_OPS_ENV,
    OPS,
    REFERENCE_OPS_ENV,
    Impl,
    on_local_shards,
    op_routes,
    use_pallas,
)
from .commit import CommitResult, commit, commit_reference
from .fill import FillResult, fill, fill_reference
from .verify import verify, verify_reference
from .verify_attention import CACHE_LEN_MULTIPLE, verify_attention, verify_attention_reference

__all__ = [
    "CACHE_LEN_MULTIPLE",
    "KERNELS_ENV",
    "MOSAIC_OPS",
    "MOSAIC_OPS_ENV",
    "OPS",
    "REFERENCE_OPS_ENV",
    "CommitResult",
    "FillResult",
    "Impl",
    "commit",
    "commit_reference",
    "fill",
    "fill_reference",
    "on_local_shards",
    "op_routes",
    "use_pallas",
    "verify",
    "verify_attention",
    "verify_attention_reference",
    "verify_reference",
]
