"""Pallas kernels of the speculative step: fill (choose verify rows), verify, commit,
and the verify-batch attention.

Each op runs its Triton-route Pallas kernel on a GPU and its plain-jnp ``*_reference`` elsewhere;
``impl="pallas"|"reference"`` and ``interpret=True`` override that (see ``_backend.use_pallas``).
"""

from .commit import CommitResult, commit, commit_reference
from .fill import FillResult, fill, fill_reference
from .verify import verify, verify_reference
from .verify_attention import verify_attention, verify_attention_reference

__all__ = [
    "CommitResult",
    "FillResult",
    "commit",
    "commit_reference",
    "fill",
    "fill_reference",
    "verify",
    "verify_attention",
    "verify_attention_reference",
    "verify_reference",
]
